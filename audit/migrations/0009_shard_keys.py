"""Tenant-scoped keys for the audit tables (docs/scaling.md; docs/decisions.md, Foundation,
"Tenant-scoped keys"). An event's chain is its tenant's id (or ``system``) and is the tables'
distribution column: events get the primary key (event_id, chain), alerts (alert_id, tenant_id).
The chain heads and verification records are keyed by the chain already."""

from django.db import migrations

from common.shardkeys import tenant_primary_key


class Migration(migrations.Migration):
    dependencies = [("audit", "0008_event_immutable_from_sql_file")]

    operations = [
        tenant_primary_key("audit_event", "event_id", tenant="chain"),
        tenant_primary_key("audit_alert", "alert_id"),
    ]
