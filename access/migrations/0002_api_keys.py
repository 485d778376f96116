"""APIKey and KeyRotationLog join access in state only: their tables stay ``billing_api_key`` and
``billing_key_rotation_log`` with every constraint (the composite foreign keys ``(wallet_id,
tenant_id) -> billing_wallet`` of billing 0025 among them); billing 0028 removes them from billing's
state and moves their content types and permissions here. In access's state the wallet is a plain
``wallet_id`` (docs/decisions.md, Foundation, "The access app")."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("access", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="APIKey",
                    fields=[
                        ("key_id", models.CharField(max_length=40, primary_key=True, serialize=False)),
                        (
                            "wallet_id",
                            models.CharField(
                                blank=True,
                                db_column="wallet_id",
                                db_index=True,
                                max_length=40,
                                null=True,
                                verbose_name="wallet",
                            ),
                        ),
                        ("tenant_id", models.CharField(blank=True, db_index=True, max_length=40, null=True)),
                        ("name", models.CharField(blank=True, default="", max_length=200)),
                        ("secret_hash", models.CharField(max_length=64)),
                        ("secret_last4", models.CharField(max_length=4)),
                        (
                            "status",
                            models.CharField(
                                choices=[("active", "Active"), ("revoked", "Revoked")], default="active", max_length=16
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("revoked_at", models.DateTimeField(blank=True, null=True)),
                        ("revoke_reason", models.CharField(blank=True, default="", max_length=200)),
                        ("rotated_from", models.CharField(blank=True, default="", max_length=40)),
                        ("created_by_key_id", models.CharField(blank=True, default="", max_length=40)),
                    ],
                    options={
                        "verbose_name": "API key",
                        "db_table": "billing_api_key",
                        "permissions": [
                            ("revoke_key", "Can revoke API keys"),
                            ("create_operator_key", "Can create operator (full-access) API keys"),
                        ],
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(
                                    models.Q(("revoked_at__isnull", True), ("status", "active")),
                                    models.Q(("revoked_at__isnull", False), ("status", "revoked")),
                                    _connector="OR",
                                ),
                                name="api_key_revocation_consistent",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="KeyRotationLog",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID"),
                        ),
                        (
                            "wallet_id",
                            models.CharField(db_column="wallet_id", db_index=True, max_length=40, verbose_name="wallet"),
                        ),
                        ("tenant_id", models.CharField(db_index=True, max_length=40)),
                        (
                            "action",
                            models.CharField(
                                choices=[
                                    ("created", "Created"),
                                    ("rotated", "Rotated"),
                                    ("revoked", "Revoked"),
                                    ("emergency_revoked", "Emergency Revoked"),
                                ],
                                max_length=32,
                            ),
                        ),
                        ("key_id", models.CharField(max_length=40)),
                        ("new_key_id", models.CharField(blank=True, default="", max_length=40)),
                        ("reason", models.CharField(blank=True, default="", max_length=200)),
                        ("actor_key_id", models.CharField(blank=True, default="", max_length=40)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "db_table": "billing_key_rotation_log",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
