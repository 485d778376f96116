"""audit_append_in: audit_append for an event passed as audit's ``audit_event_in`` record, refusing an event of
another tenant (docs/decisions.md, "Records between apps")."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("audit", "0010_audit_detail_gin_index_and_verify_permission")]

    operations = [
        run_sql_file(
            "audit",
            "audit_append",
            sha256="0ac1d0620ff8647b3574d60e6ec894653d29dc63c90b17840c7eaf09c1d02710",
        ),
    ]
