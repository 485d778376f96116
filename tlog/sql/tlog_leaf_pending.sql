-- tlog_leaf_pending: every signed statement a tenant's table receives becomes a pending leaf of the
-- tenant's transparency log, in the statement's own INSERT (docs/audit-chain.md, "The transparency log").
--
-- A trigger function for AFTER INSERT ... FOR EACH ROW triggers on the statement tables, called as
-- tlog_leaf_pending(<kind>, <id column>): it appends (the row's tenant_id, kind, statement id) to
-- tlog_pending_leaf. It takes no lock and assigns no index, so a governed call pays one index-only
-- insert and no extra round trip (the statement's INSERT runs it); the integrator
-- (tlog.services.tlog_integrate) gives pending leaves their index later, under the tenant's log lock,
-- and reads the leaf bytes back from the statement's table (tlog.kinds). A row whose tenant_id is
-- null (an audit event of the system chain) belongs to no tenant's log and is not appended.
-- Guarantees: every row inserted into receipts_receipt, permits_permit, permits_quote,
-- permits_permit_approval (a person's signed decision on a permit request) or audit_event (a tenant's
-- event) appends one pending leaf in the same transaction: a statement is committed if and
-- only if its pending leaf is. The kinds named by the triggers below are the keys of tlog.kinds.KINDS;
-- adding a kind is one CREATE TRIGGER here and one KINDS entry. The file can be applied again: the
-- function is replaced, each trigger dropped and created anew.
-- Every statement table has a tenant_id. The governed call's kinds read their id column directly; a kind
-- added by its trigger alone takes the generic way (the row as jsonb: about 30 us more for a 3 KB
-- receipt row than the direct read), which is why the hot ones are named here. An approval decision is
-- rare (a person decides it) and takes the generic way.
CREATE OR REPLACE FUNCTION tlog_leaf_pending() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    statement_id text;
BEGIN
    IF NEW.tenant_id IS NULL THEN
        RETURN NULL;
    END IF;
    IF TG_ARGV[0] = 'receipt' THEN
        statement_id := NEW.receipt_id;
    ELSIF TG_ARGV[0] = 'audit_event' THEN
        statement_id := NEW.event_id;
    ELSIF TG_ARGV[0] = 'permit' THEN
        statement_id := NEW.permit_id;
    ELSIF TG_ARGV[0] = 'quote' THEN
        statement_id := NEW.quote_id;
    ELSE
        statement_id := to_jsonb(NEW)->>TG_ARGV[1];
    END IF;
    INSERT INTO tlog_pending_leaf (tenant_id, kind, statement_id, created_at)
    VALUES (NEW.tenant_id, TG_ARGV[0], statement_id, clock_timestamp());
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS tlog_leaf_receipt ON receipts_receipt;
CREATE TRIGGER tlog_leaf_receipt AFTER INSERT ON receipts_receipt
    FOR EACH ROW EXECUTE FUNCTION tlog_leaf_pending('receipt', 'receipt_id');

DROP TRIGGER IF EXISTS tlog_leaf_permit ON permits_permit;
CREATE TRIGGER tlog_leaf_permit AFTER INSERT ON permits_permit
    FOR EACH ROW EXECUTE FUNCTION tlog_leaf_pending('permit', 'permit_id');

DROP TRIGGER IF EXISTS tlog_leaf_quote ON permits_quote;
CREATE TRIGGER tlog_leaf_quote AFTER INSERT ON permits_quote
    FOR EACH ROW EXECUTE FUNCTION tlog_leaf_pending('quote', 'quote_id');

DROP TRIGGER IF EXISTS tlog_leaf_audit_event ON audit_event;
CREATE TRIGGER tlog_leaf_audit_event AFTER INSERT ON audit_event
    FOR EACH ROW EXECUTE FUNCTION tlog_leaf_pending('audit_event', 'event_id');

DROP TRIGGER IF EXISTS tlog_leaf_permit_approval ON permits_permit_approval;
CREATE TRIGGER tlog_leaf_permit_approval AFTER INSERT ON permits_permit_approval
    FOR EACH ROW EXECUTE FUNCTION tlog_leaf_pending('permit_approval', 'approval_id');
