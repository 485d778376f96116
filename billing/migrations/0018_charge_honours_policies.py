"""``billing_charge`` honours the policy bundles of the wallet's line (allowed categories, the amount per
charge, the daily cap, checked again after the debit under its locks), through
``permits_charge_policies`` (the permits app's file: it reads the policy bundles) and
``billing_daily_cap_over`` (mcpgateway 0015 has ``gateway_claim`` use it too)."""

from django.db import migrations

from config.sqlfiles import run_sql_file

CAP_OVER = "billing_daily_cap_over(text[], text[], numeric[], timestamptz)"
CHARGE_POLICIES = "permits_charge_policies(text[], text, numeric)"


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0017_debit_refuses_an_unforeseen_refill"),
        ("permits", "0008_policy_authority_level"),
    ]

    operations = [
        run_sql_file("billing", "billing_daily_cap_over", reverse_sql=f"DROP FUNCTION IF EXISTS {CAP_OVER};"),
        run_sql_file("permits", "permits_charge_policies", reverse_sql=f"DROP FUNCTION IF EXISTS {CHARGE_POLICIES};"),
        run_sql_file("billing", "billing_charge"),
    ]
