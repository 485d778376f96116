"""``audit_append`` from its own file (audit/sql/audit_append.sql), like the other database functions;
the body is the one migration 0005 created."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("audit", "0006_remove_auditevent_audit_wallet")]

    operations = [
        run_sql_file("audit", "audit_append", sha256="69e4b826e70edb6f0e300185ec814809c0f1ce44baf0459f87ff257e55104343")
    ]
