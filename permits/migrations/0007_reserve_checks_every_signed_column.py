"""The reservation requires the row to still carry every signed column authorization verified (tenant,
wallet, subject key, tools, allowance, call limit, expiry) and the signature
(permits/sql/permits_reserve.sql)."""

from django.db import migrations

from common.sqlfiles import run_sql_file

PREVIOUS = "permits_reserve(text, numeric, timestamptz, numeric, integer, timestamptz, text)"
SIGNATURE = "permits_reserve(text, numeric, timestamptz, text, text, text, text, jsonb, numeric, integer, timestamptz)"


class Migration(migrations.Migration):
    dependencies = [("permits", "0006_policies_version")]

    operations = [
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "permits",
            "permits_reserve",
            sha256="93378de0408a11da13ffe3a28938cb1eb3950a079f948cc87ad2258e9df1f8ef",
            reverse_sql=f"DROP FUNCTION IF EXISTS {SIGNATURE};",
        ),
    ]
