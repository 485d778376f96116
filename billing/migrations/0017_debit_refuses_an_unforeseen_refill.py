"""``billing_debit`` again: a refill due under the wallet's lock whose parent it did not lock raises 40001."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0016_charge_calls_as_expressions")]

    operations = [
        run_sql_file(
            "billing", "billing_debit", sha256="02abe150bb03b1bf1691e022c81d699a748654e6c1e944e4140037d81b2c1c00"
        )
    ]
