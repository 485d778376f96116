"""Tenant-scoped keys for the permits app's tables (docs/scaling.md; docs/decisions.md, Foundation,
"Tenant-scoped keys"): primary keys (<id>, tenant_id), the permit request's one-to-one permit unique
within the tenant, and foreign keys (<x>_id, tenant_id) -> (<id>, tenant_id). An approver's tenant
is the sponsor wallet whose wallet_id is the tenant id, hence (tenant_id, tenant_id)."""

from django.db import migrations

from common.shardkeys import tenant_foreign_key, tenant_primary_key, tenant_unique


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0025_shard_keys"),
        ("permits", "0011_shard_keys_prepare"),
    ]

    operations = [
        tenant_primary_key("permits_permit", "permit_id"),
        tenant_primary_key("permits_permit_request", "request_id"),
        tenant_primary_key("permits_quote", "quote_id"),
        tenant_primary_key("permits_policy_bundle", "policy_id"),
        tenant_primary_key("permits_tenant_approver", "id"),
        tenant_primary_key("permits_policy_change_proposal", "proposal_id"),
        tenant_unique("permits_permit_request", "permits_permit_request_permit_id_key", "permit_id"),
        tenant_foreign_key("permits_permit", "wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("permits_permit", "issuer_wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("permits_permit_request", "wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("permits_permit_request", "permit_id", "permits_permit", "permit_id"),
        tenant_foreign_key("permits_quote", "wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("permits_policy_bundle", "wallet_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("permits_tenant_approver", "tenant_id", "billing_wallet", "wallet_id"),
        tenant_foreign_key("permits_policy_change_proposal", "policy_id", "permits_policy_bundle", "policy_id"),
    ]
