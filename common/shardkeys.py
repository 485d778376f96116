"""Tenant-scoped keys: the migration operations that put the tenant into every key of a tenant table.

Tollgate is laid out to be sharded by tenant (docs/scaling.md). A table whose rows belong to one
tenant is a *tenant table*: its tenant column (``tenant_id``; ``chain`` for the audit tables, whose
chain is the tenant's id) is NOT NULL and part of its primary key, of every unique constraint and
unique index, and of every foreign key to another tenant table. The database's primary key is
``(<id>, <tenant>)`` while Django's model keeps the single ``<id>`` as its pk (docs/decisions.md,
Foundation, "Tenant-scoped keys"): the id leads, so a lookup by id alone still walks the primary key
index, and a foreign key ``(<x>_id, tenant_id) -> (<id>, tenant_id)`` makes a row that points at
another tenant's row impossible. Django's foreign keys between tenant tables are
``db_constraint=False``; the constraints below replace them.

``TENANT_TABLES``, ``REFERENCE_TABLES`` and ``LOCAL_TABLES`` are the inventory that
tests/test_shard_ready.py checks against the catalogue: a new table must be placed in one of them.
Migrations spell their tables out (a migration never reads this module's lists, which may change).
"""

from __future__ import annotations

from django.db import migrations

# Tenant tables -> their distribution (tenant) column. Citus: create_distributed_table(table, column).
TENANT_TABLES: dict[str, str] = {
    "billing_wallet": "tenant_id",
    "billing_ledger_entry": "tenant_id",
    "billing_spend_bucket": "tenant_id",
    "billing_charge_idempotency": "tenant_id",
    "billing_key_rotation_log": "tenant_id",
    "permits_permit": "tenant_id",
    "permits_permit_request": "tenant_id",
    "permits_permit_approval": "tenant_id",
    "permits_quote": "tenant_id",
    "permits_policy_bundle": "tenant_id",
    "permits_tenant_approver": "tenant_id",
    "permits_policy_change_proposal": "tenant_id",
    "permits_tenant_notification": "tenant_id",
    "permits_webhook_delivery": "tenant_id",
    "mcpgateway_action": "tenant_id",
    "mcpgateway_partner_note": "tenant_id",
    "receipts_receipt": "tenant_id",
    "receipts_refund_reconciliation": "tenant_id",
    "receipts_reconciliation_result": "tenant_id",
    "audit_event": "chain",
    "audit_chain_head": "chain",
    "audit_chain_verification": "chain",
    "audit_alert": "tenant_id",
    "tlog_pending_leaf": "tenant_id",
    "tlog_leaf": "tenant_id",
    "tlog_tree_hash": "tenant_id",
    "tlog_log": "tenant_id",
}

# Small tables every tenant reads, written off the hot path. Citus: create_reference_table(table).
REFERENCE_TABLES: frozenset[str] = frozenset(
    {
        "mcpgateway_tool",
        "mcpgateway_upstream_server",
        "mcpgateway_upstream_credential",
        "billing_tool_price",
        "billing_service_price",
        "audit_signing_key",
        "billing_api_key",
        "tlog_log_key",
    }
)

# Tables that are neither: they stay on the coordinator (or are distributed by their own key), and
# no hot function joins them with a tenant table. docs/scaling.md says why for each.
LOCAL_TABLES: frozenset[str] = frozenset(
    {
        "billing_rate_limit_window",
        "billing_login_throttle",
        "billing_tool_price_change",
        "mcpgateway_session",
        "mcpgateway_upstream_server_state",
        "tlog_witness_state",
        "auth_group",
        "auth_group_permissions",
        "auth_permission",
        "auth_user",
        "auth_user_groups",
        "auth_user_user_permissions",
        "django_admin_log",
        "django_content_type",
        "django_migrations",
        "django_session",
    }
)


def tenant_primary_key(table: str, column: str, tenant: str = "tenant_id") -> migrations.RunSQL:
    """Make ``table``'s primary key ``(column, tenant)`` (reversible: back to ``(column)``)."""
    swap = f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey, ADD CONSTRAINT {table}_pkey PRIMARY KEY"
    return migrations.RunSQL(f"{swap} ({column}, {tenant})", f"{swap} ({column})")


def tenant_unique(table: str, name: str, column: str, tenant: str = "tenant_id") -> migrations.RunSQL:
    """Widen the single-column unique constraint ``name`` (a one-to-one field's) to ``(column, tenant)``.

    Django's state keeps the one-to-one field: only the database's constraint changes, under the
    same name.
    """
    return migrations.RunSQL(
        f"ALTER TABLE {table} DROP CONSTRAINT {name}, ADD CONSTRAINT {name} UNIQUE ({column}, {tenant})",
        f"ALTER TABLE {table} DROP CONSTRAINT {name}, ADD CONSTRAINT {name} UNIQUE ({column})",
    )


def tenant_foreign_key(
    table: str, column: str, target: str, target_column: str, tenant: str = "tenant_id"
) -> migrations.RunSQL:
    """``(column, tenant) -> target(target_column, tenant_id)``: the referenced row is in the same tenant.

    Deferred to the commit like Django's own foreign keys. A null ``column`` is not checked (MATCH
    SIMPLE), as before.
    """
    name = f"{table}_{column}_tenant_fk"
    return migrations.RunSQL(
        f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({column}, {tenant}) "
        f"REFERENCES {target} ({target_column}, tenant_id) DEFERRABLE INITIALLY DEFERRED",
        f"ALTER TABLE {table} DROP CONSTRAINT {name}",
    )
