"""``gateway_claim`` and ``gateway_finish`` again: ``billing_debit`` and ``audit_append`` called as
assignments, not as queries."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("mcpgateway", "0011_claim_calls_the_key_charge")]

    operations = [
        run_sql_file(
            "mcpgateway", "gateway_claim", sha256="805242a28bf45b82b0608d29469cb25937d9a81b508f60962efac86083a2c159"
        ),
        run_sql_file(
            "mcpgateway", "gateway_finish", sha256="01fec6bf9aa7f28eab89a6d2e5b67861c97876747a1c3e64d8ce63a7ec6cdfbe"
        ),
    ]
