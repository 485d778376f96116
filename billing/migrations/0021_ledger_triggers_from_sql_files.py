"""The ledger's invariant triggers from their own files, like the functions:
billing/sql/billing_ledger_transaction_balanced.sql (every ledger transaction sums to zero at commit)
and billing/sql/billing_ledger_entry_immutable.sql (entries are never updated or deleted).

The bodies and triggers are the ones 0003 created inline; applying the files again replaces the
functions and drops and creates the triggers in this migration's transaction, so a database that has
them keeps them, as it had them."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0020_login_throttle")]

    operations = [
        run_sql_file(
            "billing",
            "billing_ledger_transaction_balanced",
            sha256="90d488e771c3e57d609eca8a89e1af1eab9a9650deffb2d8b88f9e2042d5091a",
        ),
        run_sql_file(
            "billing",
            "billing_ledger_entry_immutable",
            sha256="6d5ec33ec877c624c41a64521b0b3b794ff87c3ffb21f56184cc24737bb3b6f6",
        ),
    ]
