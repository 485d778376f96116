"""billing_charge again (billing/sql/billing_charge.sql): inside a batch of one wallet's charges, a
charge after the first that might lock an auto-refill's parent after the chain head is refused
(SQLSTATE TGBT1), so a batch never inverts the lock order."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0011_charge_function_refill_balance")]

    operations = [
        run_sql_file(
            "billing", "billing_charge", sha256="1201ccfd96b18bb26c97e23ec140562b0f6524f13ab42c9ab90829b4a728b790"
        )
    ]
