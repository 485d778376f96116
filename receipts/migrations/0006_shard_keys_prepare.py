"""The receipts app's side of the tenant-scoped keys, first step (docs/decisions.md, Foundation,
"Tenant-scoped keys"): Django's single-column foreign keys to tenant tables go (db_constraint=False;
receipts 0007 puts composite ones in their place) and a receipt's action id is unique within the tenant."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0024_shard_keys_prepare"),
        ("permits", "0011_shard_keys_prepare"),
        ("receipts", "0005_reconciliation_reason_without_actor"),
    ]

    operations = [
        migrations.AlterField(
            model_name="receipt",
            name="action_id",
            field=models.CharField(max_length=40),
        ),
        migrations.AlterField(
            model_name="receipt",
            name="ledger_entry",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="receipts",
                to="billing.ledgerentry",
            ),
        ),
        migrations.AlterField(
            model_name="receipt",
            name="permit",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="receipts",
                to="permits.permit",
            ),
        ),
        migrations.AlterField(
            model_name="receipt",
            name="refund_entry",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="refund_receipts",
                to="billing.ledgerentry",
            ),
        ),
        migrations.AlterField(
            model_name="receipt",
            name="wallet",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="receipts",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="reconciliationresult",
            name="receipt",
            field=models.OneToOneField(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="reconciliation_result",
                to="receipts.receipt",
            ),
        ),
        migrations.AlterField(
            model_name="refundreconciliation",
            name="receipt",
            field=models.OneToOneField(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="reconciliation",
                to="receipts.receipt",
            ),
        ),
        migrations.AlterField(
            model_name="refundreconciliation",
            name="refund_entry",
            field=models.OneToOneField(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="reconciliation",
                to="billing.ledgerentry",
            ),
        ),
        migrations.AddConstraint(
            model_name="receipt",
            constraint=models.UniqueConstraint(fields=("action_id", "tenant_id"), name="receipt_action_unique"),
        ),
    ]
