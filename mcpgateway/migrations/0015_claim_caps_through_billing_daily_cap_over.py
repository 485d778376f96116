"""``gateway_claim`` checks the policies' daily caps with ``billing_daily_cap_over`` (billing 0018), the
function the charge endpoint checks them with, instead of its own copy of the loop."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0014_session_created_index"),
        ("billing", "0018_charge_honours_policies"),
    ]

    operations = [
        run_sql_file(
            "mcpgateway", "gateway_claim", sha256="d06745208f0079dc4f0d6583936f03ef6172e166f0d571ddcd56f10e75a473ff"
        )
    ]
