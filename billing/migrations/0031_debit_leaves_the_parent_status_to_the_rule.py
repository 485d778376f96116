"""``billing_debit`` no longer restates the wallet-status rule for the refill parent: the parent is an ancestor,
which ``billing_wallet_may_spend`` has already found active and unexpired under its lock."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0030_charge_answers_a_stored_record_once")]

    operations = [
        run_sql_file(
            "billing", "billing_debit", sha256="b6c03d7c75da2caf1c2e13703d8abe321f578da53273e70155c3f61103b9fca5"
        ),
    ]
