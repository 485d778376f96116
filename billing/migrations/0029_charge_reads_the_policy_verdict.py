"""``billing_charge`` reads the policy bundles' rules from ``permits_policy_verdict`` (permits 0017), the
judge the governed call reads too; ``permits_charge_policies``, its former copy of the rules, is retired."""

from django.db import migrations

from common.sqlfiles import retire_sql_file, run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0028_api_keys_move_to_access"),
        ("permits", "0017_policy_verdict_judges_the_rules_once"),
    ]

    operations = [
        run_sql_file(
            "billing", "billing_charge", sha256="d076dffc2e14afea55a575608c4c9dfba2454a1990f43afafe0d4dcaa4d2f62d"
        ),
        run_sql_file(
            "billing",
            "billing_daily_cap_over",
            sha256="c6670f0fda6c74ff6a4625af6b8a1509ee7e00bd726fffb0c4094823ddbf6c52",
        ),
        retire_sql_file("permits", "permits_charge_policies", drop="permits_charge_policies(text[], text, numeric)"),
    ]
