"""The charge endpoint as one database function: ``billing_charge`` (billing/sql/billing_charge.sql).

``POST /v1/billing/charge`` becomes one statement in autocommit: the wallet's reach, the
idempotency record, the price, ``billing_debit``, the record's insert and the audit events
(``audit_append``), so the wallet's lock and the chain head are released when the statement
commits on the server.
"""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0008_debit_function"),
        ("audit", "0005_append_function"),
    ]

    operations = [
        run_sql_file(
            "billing",
            "billing_charge",
            sha256="05b3aec5f00b4a5641076160a3f1f3864d83e1e5141e8b9578172a9f64796da5",
            reverse_sql=(
                "DROP FUNCTION IF EXISTS billing_charge(text, text, text, text, numeric, numeric, text, text, text, "
                "timestamptz, text[], numeric, numeric, text, text, jsonb, text, text, text, text, timestamptz, jsonb, "
                "bytea[], text, timestamptz, jsonb, bytea[]);"
            ),
        ),
    ]
