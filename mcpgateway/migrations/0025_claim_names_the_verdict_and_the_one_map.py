"""gateway_claim's header names where its inputs and codes live now: the daily caps come from
permits_policy_verdict (permits 0017), its refusal codes become exceptions in common.refusals. The body
is unchanged."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0024_upstream_server_state"),
        ("permits", "0017_policy_verdict_judges_the_rules_once"),
    ]

    operations = [
        run_sql_file("mcpgateway", "gateway_claim", sha256="a73765c7fc3ccbee3635f68e96084c277032377a73fcec8b4f0f8247510fbd75"),
    ]
