"""billing's side of the tenant-scoped keys, first step (docs/decisions.md, Foundation, "Tenant-scoped keys"):
Django's single-column foreign keys between tenant tables go (db_constraint=False; billing 0023 and the
apps' shard_keys migrations put composite ones in their place), the spend bucket's and the charge
idempotency's unique keys gain tenant_id, and billing_debit's upsert names the widened key."""

import django.db.models.deletion
from django.db import migrations, models

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0023_login_throttle_moves_to_access"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="chargeidempotency",
            name="charge_idempotency_wallet_key",
        ),
        migrations.RemoveConstraint(
            model_name="spendbucket",
            name="spend_bucket_wallet_hour",
        ),
        migrations.AlterField(
            model_name="apikey",
            name="wallet",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="api_keys",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="chargeidempotency",
            name="entry",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="billing.ledgerentry",
            ),
        ),
        migrations.AlterField(
            model_name="chargeidempotency",
            name="wallet",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="charge_keys",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="keyrotationlog",
            name="wallet",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="key_logs",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="ledgerentry",
            name="refund_of",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="refunds",
                to="billing.ledgerentry",
            ),
        ),
        migrations.AlterField(
            model_name="ledgerentry",
            name="wallet",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="ledger_entries",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="spendbucket",
            name="wallet",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="wallet",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="children",
                to="billing.wallet",
            ),
        ),
        migrations.AddConstraint(
            model_name="chargeidempotency",
            constraint=models.UniqueConstraint(
                fields=("wallet", "key", "tenant_id"), name="charge_idempotency_wallet_key"
            ),
        ),
        migrations.AddConstraint(
            model_name="spendbucket",
            constraint=models.UniqueConstraint(fields=("wallet", "hour", "tenant_id"), name="spend_bucket_wallet_hour"),
        ),
        # The spend buckets' upsert names the widened unique key (wallet_id, hour, tenant_id).
        run_sql_file(
            "billing", "billing_debit", sha256="3c2087086bb732e37f45f7d0cdcbe5ab2966cb54fb7db869093bccc3ddf2eb81"
        ),
    ]
