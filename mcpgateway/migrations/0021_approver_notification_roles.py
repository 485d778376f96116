"""Who sets how a tenant's approvers are notified (docs/decisions.md, "Operator console").

*Approver admin* (who manages approvers) and *Operator* set the tenant notifications (email, the
webhook and its write-only secret) and see the webhook deliveries; *Read-only auditor* sees both.
"""

from django.db import migrations

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
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after migrate; the groups need them now.
    app_config = apps.get_app_config("permits")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in GRANTS.items():
        group = Group.objects.filter(name=name).first()
        if group is not None:
            group.permissions.add(
                *Permission.objects.filter(content_type__app_label="permits", codename__in=codenames)
            )


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in GRANTS.items():
        group = Group.objects.filter(name=name).first()
        if group is not None:
            group.permissions.remove(
                *Permission.objects.filter(content_type__app_label="permits", codename__in=codenames)
            )


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0020_shard_keys"),
        ("permits", "0013_approver_notification_webhooks"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
