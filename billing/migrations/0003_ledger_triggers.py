"""Ledger invariants in PostgreSQL.

1. A deferred constraint trigger: at commit, the entries of every ledger
   transaction touched by the committing transaction sum to zero.
2. Ledger entries are immutable: UPDATE and DELETE are refused. (TRUNCATE, used
   only to reset test databases, is not a row operation.)
"""

from django.db import migrations

BALANCED = """
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

CREATE CONSTRAINT TRIGGER billing_ledger_transaction_balanced
    AFTER INSERT ON billing_ledger_entry
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_transaction_balanced();
"""

IMMUTABLE = """
CREATE OR REPLACE FUNCTION billing_ledger_entry_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger entries are immutable (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;

CREATE TRIGGER billing_ledger_entry_immutable
    BEFORE UPDATE OR DELETE ON billing_ledger_entry
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_entry_immutable();
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_ledger_and_prices")]

    operations = [
        migrations.RunSQL(
            BALANCED,
            reverse_sql="""
                DROP TRIGGER IF EXISTS billing_ledger_transaction_balanced ON billing_ledger_entry;
                DROP FUNCTION IF EXISTS billing_ledger_transaction_balanced();
            """,
        ),
        migrations.RunSQL(
            IMMUTABLE,
            reverse_sql="""
                DROP TRIGGER IF EXISTS billing_ledger_entry_immutable ON billing_ledger_entry;
                DROP FUNCTION IF EXISTS billing_ledger_entry_immutable();
            """,
        ),
    ]
