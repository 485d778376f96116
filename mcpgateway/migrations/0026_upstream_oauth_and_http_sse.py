"""Upstream credentials of kind ``oauth_client_credentials`` (a longer ``kind``), servers speaking the legacy
HTTP+SSE transport (``transport`` ``http_sse``) and the error class ``credentials_unavailable`` of a server's
last state (a longer ``error_class``, its check constraint replaced); docs/decisions.md, "Upstream servers"."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0025_claim_names_the_verdict_and_the_one_map"),
    ]

    operations = [
        migrations.AlterField(
            model_name="upstreamcredential",
            name="kind",
            field=models.CharField(
                choices=[
                    ("bearer", "Bearer"),
                    ("headers", "Headers"),
                    ("oauth_client_credentials", "Oauth Client Credentials"),
                ],
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="upstreamserver",
            name="transport",
            field=models.CharField(
                choices=[("streamable_http", "Streamable Http"), ("http_sse", "Http Sse")],
                default="streamable_http",
                max_length=16,
            ),
        ),
        migrations.RemoveConstraint(
            model_name="upstreamserverstate",
            name="upstream_server_state_error_class",
        ),
        migrations.AlterField(
            model_name="upstreamserverstate",
            name="error_class",
            field=models.CharField(
                blank=True,
                choices=[
                    ("auth_refused", "Auth Refused"),
                    ("server_error", "Server Error"),
                    ("http_error", "Http Error"),
                    ("timeout", "Timeout"),
                    ("unreachable", "Unreachable"),
                    ("protocol_error", "Protocol Error"),
                    ("credentials_unavailable", "Credentials Unavailable"),
                ],
                default="",
                max_length=32,
            ),
        ),
        migrations.AddConstraint(
            model_name="upstreamserverstate",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("error_class", ""), ("reachable", True)),
                    models.Q(
                        (
                            "error_class__in",
                            [
                                "auth_refused",
                                "server_error",
                                "http_error",
                                "timeout",
                                "unreachable",
                                "protocol_error",
                                "credentials_unavailable",
                            ],
                        ),
                        ("reachable", False),
                    ),
                    _connector="OR",
                ),
                name="upstream_server_state_error_class",
            ),
        ),
    ]
