"""``billing_debit`` again: a refill due under the wallet's lock whose parent it did not lock raises 40001."""

from django.db import migrations

from config.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0016_charge_calls_as_expressions")]

    operations = [run_sql_file("billing", "billing_debit")]
