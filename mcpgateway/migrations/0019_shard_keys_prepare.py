"""The gateway's side of the tenant-scoped keys, first step (docs/decisions.md, Foundation,
"Tenant-scoped keys"): Django's single-column foreign keys to tenant tables go (db_constraint=False;
mcpgateway 0018 puts composite ones in their place), the action's idempotency key and the partner
note's action id are unique within the tenant."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0024_shard_keys_prepare"),
        ("mcpgateway", "0018_tool_input_schema_problem"),
        ("permits", "0011_shard_keys_prepare"),
        ("receipts", "0005_reconciliation_reason_without_actor"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="action",
            name="action_wallet_idempotency_unique",
        ),
        migrations.AlterField(
            model_name="action",
            name="ledger_entry",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="actions",
                to="billing.ledgerentry",
            ),
        ),
        migrations.AlterField(
            model_name="action",
            name="permit",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="actions",
                to="permits.permit",
            ),
        ),
        migrations.AlterField(
            model_name="action",
            name="receipt",
            field=models.OneToOneField(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="action",
                to="receipts.receipt",
            ),
        ),
        migrations.AlterField(
            model_name="action",
            name="wallet",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="actions",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="partnernote",
            name="action_id",
            field=models.CharField(max_length=40),
        ),
        migrations.AddConstraint(
            model_name="action",
            constraint=models.UniqueConstraint(
                fields=("wallet", "idempotency_key", "tenant_id"), name="action_wallet_idempotency_unique"
            ),
        ),
        migrations.AddConstraint(
            model_name="partnernote",
            constraint=models.UniqueConstraint(fields=("action_id", "tenant_id"), name="partner_note_action_unique"),
        ),
    ]
