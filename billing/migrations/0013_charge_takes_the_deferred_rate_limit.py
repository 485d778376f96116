"""billing_charge again (billing/sql/billing_charge.sql): it takes the deferred rate-limit charge of a key
the caller authenticated from its process cache (billing.ratelimit, "deferred"), checks the key and
charges its window first, and answers the window's count (``rate_count``)."""

from django.db import migrations

from common.sqlfiles import run_sql_file

PREVIOUS_SIGNATURE = (
    "billing_charge(text, text, text, text, numeric, numeric, text, text, text, timestamptz, text[], numeric, "
    "numeric, text, text, jsonb, text, text, text, text, timestamptz, jsonb, bytea[], text, timestamptz, jsonb, "
    "bytea[])"
)
SIGNATURE = PREVIOUS_SIGNATURE.removesuffix(")") + ", text, text, bigint, integer)"


class Migration(migrations.Migration):
    dependencies = [("billing", "0012_charge_function_batches")]

    operations = [
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_SIGNATURE};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "billing",
            "billing_charge",
            sha256="76cbaace79ffff6bb9dada3bc1f6ce7628c4fa03cdccfb449c84cc5520fc206a",
            reverse_sql=f"DROP FUNCTION IF EXISTS {SIGNATURE};",
        ),
    ]
