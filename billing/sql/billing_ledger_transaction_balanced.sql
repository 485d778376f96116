-- billing_ledger_transaction_balanced: the ledger is double-entry; every ledger transaction sums to zero.
--
-- Guarantees: when a database transaction that inserted ledger entries commits, the entries of
-- each ledger transaction it inserted into sum to zero; otherwise the commit fails with SQLSTATE
-- 23000 (integrity_constraint_violation, "ledger transaction ... is unbalanced") and nothing of
-- it stays. A deferred constraint trigger: it runs at commit (or SET CONSTRAINTS ... IMMEDIATE),
-- once per inserted entry, so the entries of one transaction may be inserted one at a time.
-- Assumes: entries are never updated or deleted (billing_ledger_entry_immutable), so checking
-- the inserts is enough. TRUNCATE (test database flushes) is not a row operation.
-- The file can be applied again: the function is replaced, the trigger dropped and created anew
-- (a constraint trigger has no CREATE OR REPLACE).
CREATE OR REPLACE FUNCTION billing_ledger_transaction_balanced() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    total numeric;
BEGIN
    SELECT COALESCE(SUM(amount), 0) INTO total
      FROM billing_ledger_entry WHERE transaction_id = NEW.transaction_id;
    IF total <> 0 THEN
        RAISE EXCEPTION 'ledger transaction % is unbalanced (sum %)', NEW.transaction_id, total
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS billing_ledger_transaction_balanced ON billing_ledger_entry;

CREATE CONSTRAINT TRIGGER billing_ledger_transaction_balanced
    AFTER INSERT ON billing_ledger_entry
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_transaction_balanced();
