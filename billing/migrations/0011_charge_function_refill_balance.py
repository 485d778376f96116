"""billing_charge again (billing/sql/billing_charge.sql): the ledger.refill event's ``balance_after``.

The event of an auto-refill posted by a charge names the wallet's balance after the refill, as the
refill's ledger entry does (and ``ledger_audit`` wrote it), not that balance plus the refill again.
"""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0010_debit_from_sql_file")]

    operations = [
        run_sql_file(
            "billing", "billing_charge", sha256="20ddc9c8e4a2e32481e564a7fefe8d8ca8a297df0f584d427df9fce8c101a0b5"
        )
    ]
