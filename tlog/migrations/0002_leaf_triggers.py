"""Every statement table's INSERT appends a pending leaf of its tenant's log (tlog/sql; docs/audit-chain.md)."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("tlog", "0001_log_tables"),
        # The statement tables exist from these on (the earliest, so that migrating another app back
        # does not take the log's triggers with it).
        ("audit", "0001_initial"),
        ("permits", "0001_initial"),
        ("receipts", "0001_initial"),
    ]

    operations = [
        run_sql_file(
            "tlog",
            "tlog_leaf_pending",
            sha256="187a66ed483ae9a22237023fb2da06b74caaad3250c9ee84f78cba1de2fd55fa",
            reverse_sql=(
                "DROP TRIGGER IF EXISTS tlog_leaf_receipt ON receipts_receipt; "
                "DROP TRIGGER IF EXISTS tlog_leaf_permit ON permits_permit; "
                "DROP TRIGGER IF EXISTS tlog_leaf_quote ON permits_quote; "
                "DROP TRIGGER IF EXISTS tlog_leaf_audit_event ON audit_event; "
                "DROP FUNCTION IF EXISTS tlog_leaf_pending()"
            ),
        ),
    ]
