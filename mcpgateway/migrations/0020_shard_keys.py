"""Tenant-scoped keys for the gateway's tenant tables (docs/scaling.md; docs/decisions.md,
Foundation, "Tenant-scoped keys"): primary keys (<id>, tenant_id), the action's one-to-one receipt
unique within the tenant, and foreign keys (<x>_id, tenant_id) -> (<id>, tenant_id)."""

from django.db import migrations

from common.shardkeys import tenant_foreign_key, tenant_primary_key, tenant_unique


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0019_shard_keys_prepare"),
        ("receipts", "0007_shard_keys"),
    ]

    operations = [
        tenant_primary_key("mcpgateway_action", "action_id"),
        tenant_primary_key("mcpgateway_partner_note", "note_id"),
        tenant_unique("mcpgateway_action", "mcpgateway_action_receipt_id_key", "receipt_id"),
        tenant_foreign_key("mcpgateway_action", "wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("mcpgateway_action", "permit_id", "permits_permit", "permit_id"),
        tenant_foreign_key("mcpgateway_action", "ledger_entry_id", "billing_ledger_entry", "entry_id"),
        tenant_foreign_key("mcpgateway_action", "receipt_id", "receipts_receipt", "receipt_id"),
    ]
