"""billing_charge again (billing/sql/billing_charge.sql): inside a batch of one wallet's charges, a
charge after the first that might lock an auto-refill's parent after the chain head is refused
(SQLSTATE TGBT1), so a batch never inverts the lock order."""

from django.db import migrations

from config.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0011_charge_function_refill_balance")]

    operations = [run_sql_file("billing", "billing_charge")]
