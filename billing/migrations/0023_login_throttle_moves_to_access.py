"""LoginThrottle moves to the access app in state only: the table (``billing_login_throttle``) and its
rows stay. Its content type moves with it, and so every permission on it (``view_loginthrottle``,
``unlock_login``...) and every grant of one to a group or a user: ``billing.unlock_login`` becomes
``access.unlock_login`` (docs/decisions.md, Foundation)."""

from django.db import migrations

from common.migration_helpers import content_types_move


def to_access(apps, schema_editor):
    content_types_move(apps, models=("loginthrottle",), source="billing", target="access")


def to_billing(apps, schema_editor):
    content_types_move(apps, models=("loginthrottle",), source="access", target="billing")


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
