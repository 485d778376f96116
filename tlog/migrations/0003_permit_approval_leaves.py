"""A person's signed decision on a permit request is a leaf of its tenant's log, like every signed statement
(tlog/sql/tlog_leaf_pending.sql; docs/audit-chain.md, "Approvals")."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("tlog", "0002_leaf_triggers"),
        # The approvals' table exists from this on.
        ("permits", "0015_permit_approval"),
    ]

    operations = [
        run_sql_file(
            "tlog",
            "tlog_leaf_pending",
            sha256="087156337a16ff644394c860aabbf3a10e1a0aaf5cdcae9cb5987364d7a1762c",
            # The function is the file's before and after: only the approvals' trigger goes.
            reverse_sql="DROP TRIGGER IF EXISTS tlog_leaf_permit_approval ON permits_permit_approval",
        ),
    ]
