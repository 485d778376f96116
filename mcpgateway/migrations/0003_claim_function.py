"""Phase 1 of the governed call ends in one database call: ``gateway_claim``.

After Python has accepted the action (its row), read the permit and decided
the authorization, everything that moves money and claims the dispatch is one
round trip, in the lock order of every money transaction (docs/decisions.md):

1. the debit, when the call has a price: ``billing_debit`` (billing/0008),
   which locks the agent ancestors, the refill parent and the wallet;
2. the reservation on the permit: ``permits_reserve`` (permits/0004);
3. the action row: ``dispatch_claimed`` with its permit, price, ledger entry,
   claim time and policy decision;
4. the audit event ``tool_call.dispatch_claimed``: ``audit_append``
   (audit/0005), which locks the tenant's chain head last.

A refusal returns its code (the debit's codes, or ``permit_refused``) having
written nothing the caller's rollback would not undo; the caller raises it.
Each rule stays in its own function, called here and by the other paths that
use it (the charge endpoint, ``permit_reserve``, ``audit_record``).
"""

from django.db import migrations

CLAIM = r"""
CREATE OR REPLACE FUNCTION gateway_claim(
    p_debit boolean,
    d_wallet_id text, d_amount numeric, d_now timestamptz, d_category text, d_units numeric,
    d_description text, d_request_path text, d_correlation_id text, d_ids text[],
    d_hour_limit numeric, d_day_limit numeric, d_idempotency_key text,
    p_permit_id text, p_price numeric, p_now timestamptz,
    p_action_id text, p_ledger_entry_id text, p_claimed_at timestamptz, p_policy_decision_id text,
    a_chain text, a_event_id text, a_event text, a_tenant_id text, a_wallet_id text, a_key_id text,
    a_tool text, a_endpoint text, a_policy_decision_id text, a_request_id text, a_ok boolean,
    a_detail jsonb, a_created_at timestamptz, a_prefix bytea, a_suffix bytea,
    OUT code text, OUT subject_id text, OUT wallet_tenant text, OUT new_balance numeric,
    OUT daily_spent numeric, OUT refilled numeric, OUT refill_parent text, OUT figure numeric,
    OUT figure_limit numeric, OUT spend_window text, OUT refusal_reason text
)
LANGUAGE plpgsql AS $$
DECLARE
    d record;
BEGIN
    IF p_debit THEN
        SELECT * INTO d FROM billing_debit(d_wallet_id, d_amount, d_now, d_category, d_units, d_description,
                                           d_request_path, d_correlation_id, d_ids, d_hour_limit, d_day_limit,
                                           d_idempotency_key);
        code := d.code; subject_id := d.subject_id; wallet_tenant := d.wallet_tenant;
        new_balance := d.new_balance; daily_spent := d.daily_spent; refilled := d.refilled;
        refill_parent := d.refill_parent; figure := d.figure; figure_limit := d.figure_limit;
        spend_window := d.spend_window; refusal_reason := d.refusal_reason;
        IF d.code <> 'ok' THEN
            RETURN;
        END IF;
    END IF;
    IF NOT permits_reserve(p_permit_id, p_price, p_now) THEN
        code := 'permit_refused'; subject_id := p_permit_id; RETURN;
    END IF;
    UPDATE mcpgateway_action
       SET state = 'dispatch_claimed', permit_id = p_permit_id, price = p_price,
           ledger_entry_id = p_ledger_entry_id, claimed_at = p_claimed_at, policy_decision_id = p_policy_decision_id
     WHERE action_id = p_action_id;
    PERFORM audit_append(a_chain, a_event_id, a_event, a_tenant_id, a_wallet_id, a_key_id, a_tool, a_endpoint,
                         a_policy_decision_id, a_request_id, a_ok, a_detail, a_created_at, a_prefix, a_suffix);
    code := 'ok';
END;
$$;
"""

DROP = (
    "DROP FUNCTION IF EXISTS gateway_claim(boolean, text, numeric, timestamptz, text, numeric, text, text, text, "
    "text[], numeric, numeric, text, text, numeric, timestamptz, text, text, timestamptz, text, text, text, text, "
    "text, text, text, text, text, text, text, boolean, jsonb, timestamptz, bytea, bytea);"
)


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0002_console_groups"),
        ("billing", "0008_debit_function"),
        ("permits", "0004_reserve_function"),
        ("audit", "0005_append_function"),
    ]

    operations = [migrations.RunSQL(CLAIM, reverse_sql=DROP)]
