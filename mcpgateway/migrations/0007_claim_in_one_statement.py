"""Phase 1 of the governed call in one statement: ``gateway_claim`` (mcpgateway/sql/gateway_claim.sql)
inserts the action already claimed, consumes the quote, debits, reserves and appends the audit event,
and raises on a refusal so that the statement rolls back whole."""

import importlib

from django.db import migrations

from common.sqlfiles import run_sql_file

_old = importlib.import_module("mcpgateway.migrations.0003_claim_function")

NEW_SIGNATURE = (
    "gateway_claim(jsonb, text, numeric, text, boolean, text, numeric, timestamptz, text, numeric, text, text, text, "
    "text[], numeric, numeric, text, numeric, timestamptz, numeric, integer, timestamptz, text, text, text, text, "
    "text, text, text, text, text, text, text, boolean, jsonb, timestamptz, bytea, bytea)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0006_drop_pattern_indexes"),
        ("permits", "0005_verified_reserve_and_quote_consume"),
    ]

    operations = [
        migrations.RunSQL(_old.DROP, reverse_sql=_old.CLAIM),
        run_sql_file(
            "mcpgateway",
            "gateway_claim",
            sha256="6ee9ce248d84f07116f4d2f46e6bb3db5f089115b20bbe6111368cff4609fc79",
            reverse_sql=f"DROP FUNCTION IF EXISTS {NEW_SIGNATURE};",
        ),
    ]
