"""Upstream credentials of kind ``oauth_client_credentials`` (a longer ``kind``; docs/decisions.md, "Upstream servers")."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('mcpgateway', '0023_upstream_servers'),
    ]

    operations = [
        migrations.AlterField(
            model_name='upstreamcredential',
            name='kind',
            field=models.CharField(choices=[('bearer', 'Bearer'), ('headers', 'Headers'), ('oauth_client_credentials', 'Oauth Client Credentials')], max_length=32),
        ),
    ]
