"""Upstream credentials of kind ``oauth_client_credentials`` (a longer ``kind``) and servers speaking the legacy
HTTP+SSE transport (``transport`` ``http_sse``); docs/decisions.md, "Upstream servers"."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("mcpgateway", "0024_upstream_server_state"),
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
    ]
