"""permits_reserve and permits_quote_consume take the tenant first and touch only its rows; permits_reserve_in
and permits_quote_consume_in take permits' reservation and quote consumption as records (docs/decisions.md,
"Records between apps"). The old signatures are dropped."""

from django.db import migrations

from common.sqlfiles import run_sql_file

PREVIOUS_RESERVE = (
    "permits_reserve(text, numeric, timestamptz, text, text, text, text, jsonb, numeric, integer, timestamptz)"
)
RESERVE = "permits_reserve(text, text, numeric, timestamptz, text, text, text, jsonb, numeric, integer, timestamptz)"
PREVIOUS_CONSUME = "permits_quote_consume(text, text, text, numeric, text, text, timestamptz)"
CONSUME = "permits_quote_consume(text, text, text, text, numeric, text, text, timestamptz)"


class Migration(migrations.Migration):
    dependencies = [("permits", "0013_approver_notification_webhooks")]

    operations = [
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_RESERVE};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "permits",
            "permits_reserve",
            sha256="8d172178ea2a72fb59f7b8aca69cf0173ad8dc18ff96bec4617646ee0de3c108",
        ),
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_CONSUME};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "permits",
            "permits_quote_consume",
            sha256="bc2b4c56303ad985645228256f74760c8668a567b81434884d7f133cd199b361",
        ),
    ]
