"""gateway_claim and gateway_finish take the tenant first and one record per app instead of 53 and 23
positional arguments (docs/decisions.md, "Records between apps"): billing's debit, audit's event,
permits' reservation, quote consumption and daily caps, the deferred rate-limit charge, what the call
was decided on. The old signatures are dropped."""

from importlib import import_module

from django.db import migrations

from common.sqlfiles import run_sql_file

PREVIOUS_CLAIM = import_module("mcpgateway.migrations.0013_claim_checks_the_policies_daily_caps").SIGNATURE
CLAIM = "gateway_claim(text, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb)"
PREVIOUS_FINISH = (
    "gateway_finish(text, jsonb, text, text, text, text, jsonb, timestamptz, text, text, text, text, text, text, "
    "text, text, text, text, boolean, jsonb, timestamptz, bytea, bytea)"
)
FINISH = "gateway_finish(text, text, jsonb, text, text, text, text, jsonb, timestamptz, jsonb)"


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0021_approver_notification_roles"),
        ("billing", "0027_money_rules_once_with_the_tenant"),
        ("permits", "0014_reserve_and_consume_with_the_tenant"),
        ("audit", "0011_append_in"),
    ]

    operations = [
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_CLAIM};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "mcpgateway",
            "gateway_claim",
            sha256="92b0046c807a29eb249c7e7fb9d534dc8a883726d52f367f802029f7845e6c7b",
        ),
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_FINISH};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "mcpgateway",
            "gateway_finish",
            sha256="5bd1e67ef82da3922f57be7d499408618e136e8cd61d61e9de1e39ffb2a2d402",
        ),
    ]
