"""``billing_charge`` honours the policy bundles of the wallet's line (allowed categories, the amount per
charge, the daily cap, checked again after the debit under its locks), through
``permits_charge_policies`` (the permits app's file: it reads the policy bundles) and
``billing_daily_cap_over`` (mcpgateway 0015 has ``gateway_claim`` use it too)."""

from django.db import migrations

from common.sqlfiles import run_sql_file

CAP_OVER = "billing_daily_cap_over(text[], text[], numeric[], timestamptz)"
CHARGE_POLICIES = "permits_charge_policies(text[], text, numeric)"


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0017_debit_refuses_an_unforeseen_refill"),
        ("permits", "0008_policy_authority_level"),
    ]

    operations = [
        run_sql_file(
            "billing",
            "billing_daily_cap_over",
            sha256="141a5c525e1f5966e1815050e84fa3a4bf50c25e347b5013c5ba159ea7d56aa2",
            reverse_sql=f"DROP FUNCTION IF EXISTS {CAP_OVER};",
        ),
        run_sql_file(
            "permits",
            "permits_charge_policies",
            sha256="a133b8b76adf4902b97b4d8e9b09b18c12049fa131190acadf21b7c53ceedc66",
            reverse_sql=f"DROP FUNCTION IF EXISTS {CHARGE_POLICIES};",
        ),
        run_sql_file(
            "billing", "billing_charge", sha256="bfc5d745d241d6dafe8855729b654d3bdfd09caca8669636f5bd9272c02b7a5a"
        ),
    ]
