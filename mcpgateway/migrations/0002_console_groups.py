"""The console's roles as groups (docs/architecture.md, "Tenancy and authority": roles ship as groups).

A superuser adds people to these groups (or grants the permissions one by one).
Money-moving, revoking and reconciling need the custom permissions declared on the
models (billing.provision_credits, billing.fund_wallet, billing.freeze_wallet,
billing.close_wallet, billing.revoke_key, permits.revoke_permit, receipts.reconcile);
creating an operator (full-access) key, billing.create_operator_key, is in no group.
"""

from django.db import migrations

from common.migration_helpers import permissions_create

APPS = ("audit", "billing", "permits", "receipts", "mcpgateway")

# label -> (every view permission of these apps, extra permissions as "app.codename")
GROUPS = {
    "Read-only auditor": (APPS, []),
    "Operator": (
        APPS,
        [
            "billing.add_wallet",
            "billing.provision_credits",
            "billing.fund_wallet",
            "billing.freeze_wallet",
            "billing.close_wallet",
            "billing.add_apikey",
            "billing.revoke_key",
            "billing.change_serviceprice",
            "billing.add_toolprice",
            "billing.change_toolprice",
            "billing.delete_toolprice",
            "permits.revoke_permit",
            "permits.add_policybundle",
            "permits.change_policybundle",
            "permits.add_tenantapprover",
            "permits.change_tenantapprover",
            "permits.delete_tenantapprover",
            "receipts.reconcile",
            "mcpgateway.change_tool",
        ],
    ),
    "Finance": (
        ("billing", "receipts"),
        [
            "billing.provision_credits",
            "billing.fund_wallet",
            "billing.change_serviceprice",
            "billing.add_toolprice",
            "billing.change_toolprice",
            "billing.delete_toolprice",
            "receipts.reconcile",
            "mcpgateway.view_action",
        ],
    ),
    "Approver admin": (
        ("permits",),
        [
            "permits.add_tenantapprover",
            "permits.change_tenantapprover",
            "permits.delete_tenantapprover",
            "auth.view_user",
            "billing.view_wallet",
        ],
    ),
}


def create_groups(apps, schema_editor):
    for app_config in apps.get_app_configs():
        permissions_create(apps, app_config.label)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, (view_apps, extra) in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        perms = list(Permission.objects.filter(content_type__app_label__in=view_apps, codename__startswith="view_"))
        for label in extra:
            app_label, codename = label.split(".")
            perms += list(Permission.objects.filter(content_type__app_label=app_label, codename=codename))
        group.permissions.set(perms)


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=list(GROUPS)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0001_initial"),
        ("audit", "0003_audit_event_immutable"),
        ("billing", "0007_console_permissions"),
        ("permits", "0003_console_permissions"),
        ("receipts", "0002_console_permissions"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_groups, remove_groups)]
