"""Ledger invariants in PostgreSQL.

1. A deferred constraint trigger: at commit, the entries of every ledger
   transaction touched by the committing transaction sum to zero
   (billing/sql/billing_ledger_transaction_balanced.sql).
2. Ledger entries are immutable: UPDATE and DELETE are refused. (TRUNCATE, used
   only to reset test databases, is not a row operation.)
   (billing/sql/billing_ledger_entry_immutable.sql)

The SQL was inline here until billing 0020 moved it to the files, unchanged; this
migration applies the files as 0020 does.
"""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_ledger_and_prices")]

    operations = [
        run_sql_file(
            "billing",
            "billing_ledger_transaction_balanced",
            sha256="90d488e771c3e57d609eca8a89e1af1eab9a9650deffb2d8b88f9e2042d5091a",
            reverse_sql="""
                DROP TRIGGER IF EXISTS billing_ledger_transaction_balanced ON billing_ledger_entry;
                DROP FUNCTION IF EXISTS billing_ledger_transaction_balanced();
            """,
        ),
        run_sql_file(
            "billing",
            "billing_ledger_entry_immutable",
            sha256="6d5ec33ec877c624c41a64521b0b3b794ff87c3ffb21f56184cc24737bb3b6f6",
            reverse_sql="""
                DROP TRIGGER IF EXISTS billing_ledger_entry_immutable ON billing_ledger_entry;
                DROP FUNCTION IF EXISTS billing_ledger_entry_immutable();
            """,
        ),
    ]
