"""``billing_charge`` again: ``billing_debit`` and ``audit_append`` called as assignments, not as queries."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0015_charge_batches_in_one_statement")]

    operations = [
        run_sql_file(
            "billing", "billing_charge", sha256="1d083d26c20da824a37311f7c0c31f4186288df10567d14fb6a76b9bd6d1cf70"
        )
    ]
