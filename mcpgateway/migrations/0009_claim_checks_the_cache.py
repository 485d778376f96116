"""The governed call authorizes from a process cache when it can: ``gateway_tool_version`` and
``permits_policies_version`` name what it cached, and ``gateway_claim`` compares them (and the list
price) in the claim itself, refusing with 'stale' when anything changed; its reservation passes every
signed column of the permit it verified (``permits_reserve``)."""

from django.db import migrations

from common.sqlfiles import run_sql_file

PREVIOUS_SIGNATURE = (
    "gateway_claim(jsonb, text, numeric, text, boolean, text, numeric, timestamptz, text, numeric, text, text, text, "
    "text[], numeric, numeric, text, numeric, timestamptz, numeric, integer, timestamptz, text, text, text, text, "
    "text, text, text, text, text, text, text, boolean, jsonb, timestamptz, bytea, bytea)"
)
SIGNATURE = (
    "gateway_claim(jsonb, text, numeric, text, boolean, text, numeric, timestamptz, text, numeric, text, text, text, "
    "text[], numeric, numeric, text, numeric, timestamptz, text, text, text, text, jsonb, numeric, integer, "
    "timestamptz, text, text, text, text, text, text, text, text, text, text, boolean, jsonb, timestamptz, bytea, "
    "bytea, text, numeric, text[], text)"
)


class Migration(migrations.Migration):
    dependencies = [("mcpgateway", "0008_finish_from_sql_file"), ("permits", "0007_reserve_checks_every_signed_column")]

    operations = [
        run_sql_file(
            "mcpgateway",
            "gateway_tool_version",
            sha256="802def8ee59aecf5111f448837a38cac2791688a7ae0897d1890644ae2f58267",
            reverse_sql="DROP FUNCTION IF EXISTS gateway_tool_version(text);",
        ),
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_SIGNATURE};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "mcpgateway",
            "gateway_claim",
            sha256="b5c82b246928d8e95ebdccd8c319a8308e277bfddaaa4a6af5ffde25ff07b0bf",
            reverse_sql=f"DROP FUNCTION IF EXISTS {SIGNATURE};",
        ),
    ]
