"""Audit events are append-only in PostgreSQL too: UPDATE and DELETE raise
(audit/sql/audit_event_immutable.sql).

TRUNCATE (test database flushes) is not a row operation and is unaffected. The SQL
was inline here until audit 0008 moved it to the file, unchanged; this migration
applies the file as 0008 does.
"""

from django.db import migrations

from common.sqlfiles import run_sql_file

DROP = """
DROP TRIGGER IF EXISTS audit_event_immutable ON audit_event;
DROP FUNCTION IF EXISTS audit_event_immutable();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0002_signing_keys"),
    ]

    operations = [
        run_sql_file(
            "audit",
            "audit_event_immutable",
            sha256="a7bfc34390e8cc36be6b148c567228492e695193311f82bf44cd062fcd8f1613",
            reverse_sql=DROP,
        ),
    ]
