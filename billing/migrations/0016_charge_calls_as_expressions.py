"""``billing_charge`` again: ``billing_debit`` and ``audit_append`` called as assignments, not as queries."""

from django.db import migrations

from config.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0015_charge_batches_in_one_statement")]

    operations = [run_sql_file("billing", "billing_charge")]
