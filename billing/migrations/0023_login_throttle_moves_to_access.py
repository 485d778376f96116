"""LoginThrottle moves to the access app in state only: the table (``billing_login_throttle``) and its
rows stay. Its content type moves with it, and so every permission on it (``view_loginthrottle``,
``unlock_login``...) and every grant of one to a group or a user: ``billing.unlock_login`` becomes
``access.unlock_login`` (docs/decisions.md, Foundation)."""

from django.db import migrations


def _move(apps, source: str, target: str) -> None:
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    User = apps.get_model("auth", "User")
    old = ContentType.objects.filter(app_label=source, model="loginthrottle").first()
    if old is None:  # a database that never had the permissions: post_migrate creates them
        return
    new = ContentType.objects.filter(app_label=target, model="loginthrottle").first()
    if new is None:
        old.app_label = target
        old.save(update_fields=["app_label"])
        return
    # Both exist (a post_migrate ran in between): carry each grant over, then drop the old type.
    for permission in Permission.objects.filter(content_type=old):
        moved, _ = Permission.objects.get_or_create(
            content_type=new, codename=permission.codename, defaults={"name": permission.name}
        )
        for group in Group.objects.filter(permissions=permission):
            group.permissions.add(moved)
        for user in User.objects.filter(user_permissions=permission):
            user.user_permissions.add(moved)
    old.delete()


def to_access(apps, schema_editor):
    _move(apps, "billing", "access")


def to_billing(apps, schema_editor):
    _move(apps, "access", "billing")


class Migration(migrations.Migration):
    dependencies = [
        ("access", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("billing", "0022_rate_limit_charges_the_wallet_line"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(to_access, to_billing),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="LoginThrottle")],
            database_operations=[],
        ),
    ]
