"""Who sees the signed approvals in the console (docs/decisions.md, Authority, "Approvals are signed"):
*Read-only auditor*, *Operator* and *Approver admin* view them (nobody changes one: the page is read-only)."""

from django.db import migrations

GROUPS = ("Read-only auditor", "Operator", "Approver admin")
CODENAME = "view_permitapproval"


def grant(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after migrate; the groups need them now.
    app_config = apps.get_app_config("permits")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    permission = Permission.objects.filter(content_type__app_label="permits", codename=CODENAME).first()
    for group in Group.objects.filter(name__in=GROUPS):
        group.permissions.add(permission)


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    permission = Permission.objects.filter(content_type__app_label="permits", codename=CODENAME).first()
    if permission is not None:
        for group in Group.objects.filter(name__in=GROUPS):
            group.permissions.remove(permission)


class Migration(migrations.Migration):
    dependencies = [
        ("permits", "0015_permit_approval"),
        ("mcpgateway", "0002_console_groups"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
