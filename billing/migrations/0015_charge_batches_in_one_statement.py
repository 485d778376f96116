"""billing_charge again (billing/sql/billing_charge.sql): a batch of one wallet's charges is one statement,
and a charge after the first says so with ``p_batch_later`` (it was a transaction-local setting that the
first charge of the batch moved)."""

from django.db import migrations

from common.sqlfiles import run_sql_file

PREVIOUS_SIGNATURE = (
    "billing_charge(text, text, text, text, numeric, numeric, text, text, text, timestamptz, text[], numeric, "
    "numeric, text, text, jsonb, text, text, text, text, timestamptz, jsonb, bytea[], text, timestamptz, jsonb, "
    "bytea[], text, text, bigint, integer)"
)
SIGNATURE = PREVIOUS_SIGNATURE.removesuffix(")") + ", boolean)"


class Migration(migrations.Migration):
    dependencies = [("billing", "0014_rate_limit_key_charge_function")]

    operations = [
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_SIGNATURE};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "billing",
            "billing_charge",
            sha256="7db5effeff7585c46a492c167f6bd6c0920fbb4fec2b704988255796845475f6",
            reverse_sql=f"DROP FUNCTION IF EXISTS {SIGNATURE};",
        ),
    ]
