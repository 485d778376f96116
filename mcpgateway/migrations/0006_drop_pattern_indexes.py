"""Drop the ``varchar_pattern_ops`` twins of the id indexes on the governed call's tables.

PostgreSQL's schema editor gives every indexed ``CharField`` a second index for
``LIKE 'prefix%'`` queries. Nothing filters these tables by an id prefix (ids are
random; the console's searches are ``icontains``, which no btree serves), while
every governed call writes each of these indexes: an action row is inserted and
updated twice, a receipt, two ledger entries and two audit events are inserted.
Dropping the unused twins cuts that write amplification. (Django drops such
indexes with ``IF EXISTS`` when it alters a field later, so no future migration
depends on them.)
"""

from django.db import migrations

TABLES = ("mcpgateway_action", "receipts_receipt", "billing_ledger_entry", "audit_event", "audit_chain_head")

DROP = """
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT indexname FROM pg_indexes
         WHERE schemaname = current_schema() AND tablename IN (%s) AND indexdef LIKE '%%varchar_pattern_ops%%'
    LOOP
        EXECUTE format('DROP INDEX IF EXISTS %%I', r.indexname);
    END LOOP;
END;
$$;
""" % ", ".join(f"'{t}'" for t in TABLES)


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0005_alter_action_wallet"),
        ("receipts", "0003_alter_receipt_permit_alter_receipt_tenant_id_and_more"),
        ("audit", "0006_remove_auditevent_audit_wallet"),
        ("billing", "0008_debit_function"),
    ]

    operations = [migrations.RunSQL(DROP, reverse_sql=migrations.RunSQL.noop)]
