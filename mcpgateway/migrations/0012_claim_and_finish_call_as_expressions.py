"""``gateway_claim`` and ``gateway_finish`` again: ``billing_debit`` and ``audit_append`` called as
assignments, not as queries."""

from django.db import migrations

from config.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("mcpgateway", "0011_claim_calls_the_key_charge")]

    operations = [run_sql_file("mcpgateway", "gateway_claim"), run_sql_file("mcpgateway", "gateway_finish")]
