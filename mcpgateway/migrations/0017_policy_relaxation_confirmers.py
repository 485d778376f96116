"""Who confirms a relaxation of human approval (docs/decisions.md, "Operator console").

*Approver admin* gets ``permits.confirm_policy_relaxation`` (and sees the proposals): relaxing a
policy's human approval is proposed by one person (an *Operator* holds ``change_policybundle``) and
confirmed by another. The *Operator* group does not get it: with ``add_apikey`` and ``fund_wallet``
besides, one Operator could lift approval and issue the permits it gates. *Operator* and *Read-only
auditor* see the proposals. A superuser holds every permission but still cannot confirm their own.
"""

from django.db import migrations

from common.migration_helpers import group_permissions_add, group_permissions_remove

GRANTS = {
    "Approver admin": ["view_policychangeproposal", "confirm_policy_relaxation"],
    "Operator": ["view_policychangeproposal"],
    "Read-only auditor": ["view_policychangeproposal"],
}


def grant(apps, schema_editor):
    group_permissions_add(apps, "permits", GRANTS)


def revoke(apps, schema_editor):
    group_permissions_remove(apps, "permits", GRANTS)


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0016_session_key_live_index"),
        ("permits", "0010_policy_change_proposal"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
