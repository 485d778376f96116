"""APIKey and KeyRotationLog move to the access app in state only: the tables
(``billing_api_key``, ``billing_key_rotation_log``), their rows and their constraints stay, the
composite foreign keys to ``billing_wallet`` included. Their content types move with them, as
LoginThrottle's did in 0023, and so every permission on them and every grant of one to a group or
a user: ``billing.add_apikey``, ``billing.revoke_key``, ``billing.create_operator_key``... become
``access.add_apikey``, ``access.revoke_key``, ``access.create_operator_key`` (docs/decisions.md,
Foundation, "The access app")."""

from django.db import migrations

MODELS = ("apikey", "keyrotationlog")


def _move(apps, source: str, target: str) -> None:
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    User = apps.get_model("auth", "User")
    for model in MODELS:
        old = ContentType.objects.filter(app_label=source, model=model).first()
        if old is None:  # a database that never had the permissions: post_migrate creates them
            continue
        new = ContentType.objects.filter(app_label=target, model=model).first()
        if new is None:
            old.app_label = target
            old.save(update_fields=["app_label"])
            continue
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
        ("access", "0002_api_keys"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("billing", "0027_money_rules_once_with_the_tenant"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(to_access, to_billing),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="APIKey"),
                migrations.DeleteModel(name="KeyRotationLog"),
            ],
            database_operations=[],
        ),
    ]
