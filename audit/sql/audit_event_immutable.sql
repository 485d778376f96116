-- audit_event_immutable: audit events are append-only.
--
-- Guarantees: every UPDATE or DELETE of an audit_event row raises SQLSTATE 23000
-- (integrity_constraint_violation, "audit events are immutable (UPDATE refused)"), whoever
-- sends it: events are only ever appended (audit_append), so a chain once verified stays as it
-- was. TRUNCATE (test database flushes) is not a row operation and is unaffected.
-- The file can be applied again: the function is replaced, the trigger dropped and created anew.
CREATE OR REPLACE FUNCTION audit_event_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit events are immutable (% refused)', TG_OP USING ERRCODE = 'integrity_constraint_violation';
END;
$$;

DROP TRIGGER IF EXISTS audit_event_immutable ON audit_event;

CREATE TRIGGER audit_event_immutable
    BEFORE UPDATE OR DELETE ON audit_event
    FOR EACH ROW EXECUTE FUNCTION audit_event_immutable();
