"""Tenant-scoped keys for billing's tenant tables (docs/scaling.md; docs/decisions.md, Foundation,
"Tenant-scoped keys"): primary keys become (<id>, tenant_id) and the foreign keys between them
(<x>_id, tenant_id) -> (<id>, tenant_id), so that no row can point at another tenant's row.

Runs after every app's 0xxx_shard_keys_prepare, which dropped Django's single-column foreign keys
(db_constraint=False) that needed the single-column primary keys."""

from django.db import migrations

from common.shardkeys import tenant_foreign_key, tenant_primary_key


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0024_shard_keys_prepare"),
        ("permits", "0011_shard_keys_prepare"),
        ("receipts", "0006_shard_keys_prepare"),
        ("mcpgateway", "0019_shard_keys_prepare"),
    ]

    operations = [
        tenant_primary_key("billing_wallet", "wallet_id"),
        tenant_primary_key("billing_ledger_entry", "entry_id"),
        tenant_primary_key("billing_spend_bucket", "id"),
        tenant_primary_key("billing_charge_idempotency", "id"),
        tenant_primary_key("billing_key_rotation_log", "id"),
        tenant_foreign_key("billing_wallet", "parent_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("billing_ledger_entry", "wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("billing_ledger_entry", "refund_of_id", "billing_ledger_entry", "entry_id"),
        tenant_foreign_key("billing_spend_bucket", "wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("billing_charge_idempotency", "wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("billing_charge_idempotency", "entry_id", "billing_ledger_entry", "entry_id"),
        tenant_foreign_key("billing_key_rotation_log", "wallet_id", "billing_wallet", "wallet_id"),
        # API keys are a reference table (docs/scaling.md): an operator key has no tenant, and a
        # wallet key's tenant must be its wallet's.
        tenant_foreign_key("billing_api_key", "wallet_id", "billing_wallet", "wallet_id"),
    ]
