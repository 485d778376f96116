"""Who sees the signed approvals in the console (docs/decisions.md, Authority, "Approvals are signed"):
*Read-only auditor*, *Operator* and *Approver admin* view them (nobody changes one: the page is read-only)."""

from django.db import migrations

from common.migration_helpers import group_permissions_add, group_permissions_remove

GRANTS = {
    "Read-only auditor": ["view_permitapproval"],
    "Operator": ["view_permitapproval"],
    "Approver admin": ["view_permitapproval"],
}


def grant(apps, schema_editor):
    group_permissions_add(apps, "permits", GRANTS)


def revoke(apps, schema_editor):
    group_permissions_remove(apps, "permits", GRANTS)


class Migration(migrations.Migration):
    dependencies = [
        ("permits", "0015_permit_approval"),
        ("mcpgateway", "0002_console_groups"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
