"""Phase 3 of the governed call in one database call when nothing is owed back: ``gateway_finish``.

For the outcomes that keep the charge and raise nothing (success, tool_error,
response_rejected), Python prepares the signed receipt, the action's final
answer and the receipt's audit event; the function then, in one round trip:

1. locks the action row and confirms it is still ``dispatch_claimed``
   (otherwise the sweeper settled it first: ``not_claimed``, nothing written);
2. inserts the receipt (``p_receipt``: the row as JSON, column by column);
3. stores the action's final state and answer;
4. appends the audit event with ``audit_append`` (audit/0005), last.

Refunds, reconciliation items and alerts (failed and uncertain calls) keep the
path of several statements in ``mcpgateway.services.finish._phase3``.
"""

from django.db import migrations

FINISH = r"""
CREATE OR REPLACE FUNCTION gateway_finish(
    p_action_id text, p_receipt jsonb,
    p_state text, p_outcome text, p_reason_code text, p_receipt_id text, p_response jsonb, p_completed_at timestamptz,
    a_chain text, a_event_id text, a_event text, a_tenant_id text, a_wallet_id text, a_key_id text,
    a_tool text, a_endpoint text, a_policy_decision_id text, a_request_id text, a_ok boolean,
    a_detail jsonb, a_created_at timestamptz, a_prefix bytea, a_suffix bytea
)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    current_state text;
BEGIN
    SELECT a.state INTO current_state FROM mcpgateway_action a WHERE a.action_id = p_action_id FOR NO KEY UPDATE;
    IF current_state IS DISTINCT FROM 'dispatch_claimed' THEN
        RETURN 'not_claimed';
    END IF;
    INSERT INTO receipts_receipt SELECT * FROM jsonb_populate_record(NULL::receipts_receipt, p_receipt);
    UPDATE mcpgateway_action
       SET state = p_state, outcome = p_outcome, reason_code = p_reason_code, receipt_id = p_receipt_id,
           response = p_response, completed_at = p_completed_at
     WHERE action_id = p_action_id;
    PERFORM audit_append(a_chain, a_event_id, a_event, a_tenant_id, a_wallet_id, a_key_id, a_tool, a_endpoint,
                         a_policy_decision_id, a_request_id, a_ok, a_detail, a_created_at, a_prefix, a_suffix);
    RETURN 'ok';
END;
$$;
"""

DROP = (
    "DROP FUNCTION IF EXISTS gateway_finish(text, jsonb, text, text, text, text, jsonb, timestamptz, text, text, "
    "text, text, text, text, text, text, text, text, boolean, jsonb, timestamptz, bytea, bytea);"
)


class Migration(migrations.Migration):
    dependencies = [("mcpgateway", "0003_claim_function"), ("receipts", "0002_console_permissions")]

    operations = [migrations.RunSQL(FINISH, reverse_sql=DROP)]
