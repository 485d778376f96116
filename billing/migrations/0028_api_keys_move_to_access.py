"""APIKey and KeyRotationLog move to the access app in state only: the tables
(``billing_api_key``, ``billing_key_rotation_log``), their rows and their constraints stay, the
composite foreign keys to ``billing_wallet`` included. Their content types move with them, as
LoginThrottle's did in 0023, and so every permission on them and every grant of one to a group or
a user: ``billing.add_apikey``, ``billing.revoke_key``, ``billing.create_operator_key``... become
``access.add_apikey``, ``access.revoke_key``, ``access.create_operator_key`` (docs/decisions.md,
Foundation, "The access app")."""

from django.db import migrations

from common.migration_helpers import content_types_move

MODELS = ("apikey", "keyrotationlog")


def to_access(apps, schema_editor):
    content_types_move(apps, models=MODELS, source="billing", target="access")


def to_billing(apps, schema_editor):
    content_types_move(apps, models=MODELS, source="access", target="billing")


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
