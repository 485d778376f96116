"""Tenant-scoped keys for the receipts app's tables (docs/scaling.md; docs/decisions.md, Foundation,
"Tenant-scoped keys"): primary keys (<id>, tenant_id), the one-to-one fields unique within the
tenant, and foreign keys (<x>_id, tenant_id) -> (<id>, tenant_id)."""

from django.db import migrations

from common.shardkeys import tenant_foreign_key, tenant_primary_key, tenant_unique


class Migration(migrations.Migration):
    dependencies = [
        ("permits", "0012_shard_keys"),
        ("receipts", "0006_shard_keys_prepare"),
    ]

    operations = [
        tenant_primary_key("receipts_receipt", "receipt_id"),
        tenant_primary_key("receipts_refund_reconciliation", "id"),
        tenant_primary_key("receipts_reconciliation_result", "id"),
        tenant_unique("receipts_refund_reconciliation", "receipts_refund_reconciliation_receipt_id_key", "receipt_id"),
        tenant_unique(
            "receipts_refund_reconciliation", "receipts_refund_reconciliation_refund_entry_id_key", "refund_entry_id"
        ),
        tenant_unique("receipts_reconciliation_result", "receipts_reconciliation_result_receipt_id_key", "receipt_id"),
        tenant_foreign_key("receipts_receipt", "wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("receipts_receipt", "permit_id", "permits_permit", "permit_id"),
        tenant_foreign_key("receipts_receipt", "ledger_entry_id", "billing_ledger_entry", "entry_id"),
        tenant_foreign_key("receipts_receipt", "refund_entry_id", "billing_ledger_entry", "entry_id"),
        tenant_foreign_key("receipts_refund_reconciliation", "receipt_id", "receipts_receipt", "receipt_id"),
        tenant_foreign_key("receipts_refund_reconciliation", "refund_entry_id", "billing_ledger_entry", "entry_id"),
        tenant_foreign_key("receipts_reconciliation_result", "receipt_id", "receipts_receipt", "receipt_id"),
    ]
