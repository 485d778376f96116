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
-- 3. appends the audit event with audit_append_in, last (the tenant's chain head; p_event is audit's
--    audit_event_in record, audit.services.PreparedEvent.record_in).
--
-- p_tenant_id is the action's tenant: an action of another tenant is not touched ('not_claimed'),
-- and a receipt or an event of another tenant is refused (SQLSTATE TGTN1, nothing written).
--
-- Lock order (docs/decisions.md, "Lock order"): the action row, then the chain head.
-- Refunds, reconciliation items and alerts (failed and uncertain calls) keep the path of
-- several statements in mcpgateway.services.finish._phase3.
-- Database functions are called as assignments (``x := f(...)``), not with PERFORM or SELECT INTO:
-- see billing/sql/billing_charge.sql.
CREATE OR REPLACE FUNCTION gateway_finish(
    p_tenant_id text, p_action_id text, p_receipt jsonb,
    p_state text, p_outcome text, p_reason_code text, p_receipt_id text, p_response jsonb, p_completed_at timestamptz,
    p_event jsonb
)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    appended record;  -- audit_append_in's answer, unused
BEGIN
    IF p_receipt->>'tenant_id' IS DISTINCT FROM p_tenant_id THEN
        RAISE EXCEPTION 'gateway_finish: the receipt is not of tenant %', p_tenant_id USING ERRCODE = 'TGTN1';
    END IF;
    UPDATE mcpgateway_action
       SET state = p_state, outcome = p_outcome, reason_code = p_reason_code, receipt_id = p_receipt_id,
           response = p_response, completed_at = p_completed_at
     WHERE action_id = p_action_id AND tenant_id = p_tenant_id AND state = 'dispatch_claimed';
    IF NOT FOUND THEN
        RETURN 'not_claimed';
    END IF;
    INSERT INTO receipts_receipt SELECT * FROM jsonb_populate_record(NULL::receipts_receipt, p_receipt);
    appended := audit_append_in(p_tenant_id, p_event);
    RETURN 'ok';
END;
$$;
