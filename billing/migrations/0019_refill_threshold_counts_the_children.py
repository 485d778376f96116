"""``billing_debit`` again: an auto-refill is due when the balance of the wallet and its children falls
under the threshold, so a wallet cannot draw refills by moving its credit to its children."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0018_charge_honours_policies")]

    operations = [
        run_sql_file(
            "billing", "billing_debit", sha256="0bbf577c2a887f9e45fe11d5c3a7f86b3ae3035d5a09d8df28d8c4ee36123c4c"
        )
    ]
