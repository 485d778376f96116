"""Who sets how a tenant's approvers are notified (docs/decisions.md, "Operator console").

*Approver admin* (who manages approvers) and *Operator* set the tenant notifications (email, the
webhook and its write-only secret) and see the webhook deliveries; *Read-only auditor* sees both.
"""

from django.db import migrations

from common.migration_helpers import group_permissions_add, group_permissions_remove

GRANTS = {
    "Approver admin": [
        "view_tenantnotification",
        "add_tenantnotification",
        "change_tenantnotification",
        "view_webhookdelivery",
    ],
    "Operator": [
        "view_tenantnotification",
        "add_tenantnotification",
        "change_tenantnotification",
        "view_webhookdelivery",
    ],
    "Read-only auditor": ["view_tenantnotification", "view_webhookdelivery"],
}


def grant(apps, schema_editor):
    group_permissions_add(apps, "permits", GRANTS)


def revoke(apps, schema_editor):
    group_permissions_remove(apps, "permits", GRANTS)


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0020_shard_keys"),
        ("permits", "0013_approver_notification_webhooks"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
