"""The governed call's claim charges the API key's rate-limit window when the caller authenticated the
key from its process cache (billing.ratelimit, "deferred"): ``gateway_claim`` takes the key, the
secret's digest, the window and the limit, checks the key and charges the window first, and answers
the window's count (``rate_count``)."""

from importlib import import_module

from django.db import migrations

from common.sqlfiles import run_sql_file

# The signature 0009 created, and the same with the deferred charge's four arguments.
PREVIOUS_SIGNATURE = import_module("mcpgateway.migrations.0009_claim_checks_the_cache").SIGNATURE
SIGNATURE = PREVIOUS_SIGNATURE.removesuffix(")") + ", text, text, bigint, integer)"


class Migration(migrations.Migration):
    dependencies = [("mcpgateway", "0009_claim_checks_the_cache"), ("billing", "0006_rate_limit_windows")]

    operations = [
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_SIGNATURE};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "mcpgateway",
            "gateway_claim",
            sha256="02bda3ab207ad0fcac3bb6ef533e8b9380491a5bd165731c421f8849a685bf92",
            reverse_sql=f"DROP FUNCTION IF EXISTS {SIGNATURE};",
        ),
    ]
