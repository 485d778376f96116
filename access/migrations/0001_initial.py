"""LoginThrottle joins access in state only: its table stays ``billing_login_throttle``, created by
billing 0020; billing 0023 removes it from billing's state and moves its content type and
permissions here (docs/decisions.md, Foundation)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="LoginThrottle",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID"),
                        ),
                        (
                            "scope",
                            models.CharField(
                                choices=[
                                    ("client", "account from one client"),
                                    ("account", "account from every client"),
                                    ("address", "client, every account"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("account_key", models.CharField(blank=True, default="", max_length=80)),
                        ("account_label", models.CharField(blank=True, default="", max_length=150)),
                        ("client", models.CharField(blank=True, default="", max_length=64)),
                        ("failures", models.FloatField(default=0)),
                        ("updated_at", models.DateTimeField()),
                        ("level", models.PositiveSmallIntegerField(default=0)),
                        ("locked_until", models.DateTimeField(blank=True, db_index=True, null=True)),
                    ],
                    options={
                        "verbose_name": "sign-in lockout",
                        "db_table": "billing_login_throttle",
                        "permissions": [("unlock_login", "Can unlock locked sign-ins")],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("scope", "account_key", "client"), name="login_throttle_unique"
                            ),
                            models.CheckConstraint(
                                condition=models.Q(("failures__gte", 0)), name="login_throttle_failures_nonnegative"
                            ),
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
