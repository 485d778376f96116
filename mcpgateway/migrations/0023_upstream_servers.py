"""Upstream MCP servers as records (with their credentials); tools name their server, actions where they were sent.

``gateway_tool_version`` now also moves with the tool's server row, so a call cached on a server that
was disabled or closed to a tenant since is decided again on fresh rows."""

import django.db.models.deletion
from django.db import migrations, models

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0022_claim_and_finish_take_records"),
    ]

    operations = [
        migrations.AddField(
            model_name="action",
            name="upstream_connect_timeout",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="action",
            name="upstream_read_timeout",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="action",
            name="upstream_server_id",
            field=models.CharField(blank=True, max_length=40, null=True),
        ),
        migrations.AddField(
            model_name="action",
            name="upstream_url",
            field=models.CharField(blank=True, max_length=2000, null=True),
        ),
        migrations.AddField(
            model_name="tool",
            name="remote_name",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.CreateModel(
            name="UpstreamServer",
            fields=[
                ("server_id", models.CharField(max_length=40, primary_key=True, serialize=False)),
                ("slug", models.SlugField(max_length=64, unique=True)),
                ("name", models.CharField(max_length=200)),
                ("url", models.URLField(max_length=2000)),
                (
                    "transport",
                    models.CharField(
                        choices=[("streamable_http", "Streamable Http")], default="streamable_http", max_length=16
                    ),
                ),
                ("connect_timeout", models.FloatField(default=2.0)),
                ("read_timeout", models.FloatField(default=15.0)),
                ("enabled", models.BooleanField(default=True)),
                ("required", models.BooleanField(default=False, help_text="readiness waits for this server")),
                (
                    "default_category",
                    models.CharField(
                        choices=[
                            ("compute", "Compute"),
                            ("data", "Data"),
                            ("search", "Search"),
                            ("storage", "Storage"),
                            ("messaging", "Messaging"),
                            ("payments", "Payments"),
                            ("content", "Content"),
                            ("tooling", "Tooling"),
                            ("other", "Other"),
                        ],
                        default="tooling",
                        max_length=32,
                    ),
                ),
                ("tool_prefix", models.CharField(blank=True, default="", max_length=64)),
                ("tenant_ids", models.JSONField(blank=True, null=True)),
                ("credentials_required", models.BooleanField(default=False)),
                ("credentials_version", models.PositiveIntegerField(default=0)),
                ("last_synced_at", models.DateTimeField(blank=True, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "db_table": "mcpgateway_upstream_server",
                "ordering": ["slug"],
                "constraints": [
                    models.UniqueConstraint(fields=("tool_prefix",), name="upstream_server_tool_prefix_unique"),
                    models.CheckConstraint(
                        condition=models.Q(("connect_timeout__gt", 0), ("read_timeout__gt", 0)),
                        name="upstream_server_timeouts_positive",
                    ),
                ],
            },
        ),
        migrations.AddField(
            model_name="tool",
            name="server",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="tools",
                to="mcpgateway.upstreamserver",
            ),
        ),
        migrations.CreateModel(
            name="UpstreamCredential",
            fields=[
                ("credential_id", models.CharField(max_length=40, primary_key=True, serialize=False)),
                ("tenant_id", models.CharField(blank=True, max_length=40, null=True)),
                ("kind", models.CharField(choices=[("bearer", "Bearer"), ("headers", "Headers")], max_length=16)),
                ("secret", models.BinaryField()),
                ("set_at", models.DateTimeField()),
                (
                    "server",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="credentials",
                        to="mcpgateway.upstreamserver",
                    ),
                ),
            ],
            options={
                "db_table": "mcpgateway_upstream_credential",
                "constraints": [
                    models.UniqueConstraint(fields=("server", "tenant_id"), name="upstream_credential_tenant_unique"),
                    models.UniqueConstraint(
                        condition=models.Q(("tenant_id__isnull", True)),
                        fields=("server",),
                        name="upstream_credential_server_unique",
                    ),
                ],
            },
        ),
        run_sql_file(
            "mcpgateway",
            "gateway_tool_version",
            sha256="4f4202ae181904d2908aba523116dfd37b4b17658137a600c359ce6078916e8a",
        ),
    ]
