-- billing_ledger_entry_immutable: ledger entries are never changed or removed.
--
-- Guarantees: every UPDATE or DELETE of a billing_ledger_entry row raises SQLSTATE 23000
-- (integrity_constraint_violation, "ledger entries are immutable (UPDATE refused)"), whoever
-- sends it (the services, the console, plain SQL): a correction is a new, balancing ledger
-- transaction. TRUNCATE (test database flushes) is not a row operation and is unaffected.
-- The file can be applied again: the function is replaced, the trigger dropped and created anew.
CREATE OR REPLACE FUNCTION billing_ledger_entry_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger entries are immutable (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;

DROP TRIGGER IF EXISTS billing_ledger_entry_immutable ON billing_ledger_entry;

CREATE TRIGGER billing_ledger_entry_immutable
    BEFORE UPDATE OR DELETE ON billing_ledger_entry
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_entry_immutable();
