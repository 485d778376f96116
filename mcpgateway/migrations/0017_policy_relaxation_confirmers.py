"""Who confirms a relaxation of human approval (docs/decisions.md, "Operator console").

*Approver admin* gets ``permits.confirm_policy_relaxation`` (and sees the proposals): relaxing a
policy's human approval is proposed by one person (an *Operator* holds ``change_policybundle``) and
confirmed by another. The *Operator* group does not get it: with ``add_apikey`` and ``fund_wallet``
besides, one Operator could lift approval and issue the permits it gates. *Operator* and *Read-only
auditor* see the proposals. A superuser holds every permission but still cannot confirm their own.
"""

from django.db import migrations

GRANTS = {
    "Approver admin": ["view_policychangeproposal", "confirm_policy_relaxation"],
    "Operator": ["view_policychangeproposal"],
    "Read-only auditor": ["view_policychangeproposal"],
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
        ("mcpgateway", "0016_session_key_live_index"),
        ("permits", "0010_policy_change_proposal"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
