-- gateway_finish: phase 3 of the governed call in one statement when the charge stands.
--
-- For the outcomes that keep the charge and owe nothing back (success, tool_error,
-- response_rejected), Python (mcpgateway.services.finish._phase3) prepares the signed receipt,
-- the action's final answer and the receipt's audit event; this function then, sent in
-- autocommit as its own transaction:
--
-- 1. stores the action's final state and answer, only while the action is still
--    'dispatch_claimed': the UPDATE locks the row and re-reads it, so when the sweeper
--    settled it first (delivery_uncertain) nothing is written and the answer is
--    'not_claimed';
-- 2. inserts the receipt (p_receipt: the row as JSON, column by column);
-- 3. appends the audit event with audit_append, last (the tenant's chain head).
--
-- Lock order (docs/decisions.md, "Lock order"): the action row, then the chain head.
-- Refunds, reconciliation items and alerts (failed and uncertain calls) keep the path of
-- several statements in mcpgateway.services.finish._phase3.
-- Database functions are called as assignments (``x := f(...)``), not with PERFORM or SELECT INTO:
-- see billing/sql/billing_charge.sql.
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
    appended record;  -- audit_append's answer, unused
BEGIN
    UPDATE mcpgateway_action
       SET state = p_state, outcome = p_outcome, reason_code = p_reason_code, receipt_id = p_receipt_id,
           response = p_response, completed_at = p_completed_at
     WHERE action_id = p_action_id AND state = 'dispatch_claimed';
    IF NOT FOUND THEN
        RETURN 'not_claimed';
    END IF;
    INSERT INTO receipts_receipt SELECT * FROM jsonb_populate_record(NULL::receipts_receipt, p_receipt);
    appended := audit_append(a_chain, a_event_id, a_event, a_tenant_id, a_wallet_id, a_key_id, a_tool, a_endpoint,
                             a_policy_decision_id, a_request_id, a_ok, a_detail, a_created_at, a_prefix, a_suffix);
    RETURN 'ok';
END;
$$;
