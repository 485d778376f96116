"""``gateway_claim`` again: the deferred rate-limit charge through ``billing_rate_limit_key_charge``."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0010_claim_charges_the_deferred_rate_limit"),
        ("billing", "0014_rate_limit_key_charge_function"),
    ]

    operations = [
        run_sql_file(
            "mcpgateway", "gateway_claim", sha256="00e29f0f069657433df56b39e7f84cbf8d45b8e5d46816a638ccd78efd7ae759"
        )
    ]
