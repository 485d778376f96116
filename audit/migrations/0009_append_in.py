"""audit_append_in: audit_append for an event passed as audit's ``audit_event_in`` record, refusing an event of
another tenant (docs/decisions.md, "Records between apps")."""

from django.db import migrations

from config.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("audit", "0008_event_immutable_from_sql_file")]

    operations = [
        run_sql_file(
            "audit",
            "audit_append",
            sha256="3d08fe83de051d6fb8ef357878fc19ce5286997d389c1528486e005cbb21278e",
        ),
    ]
