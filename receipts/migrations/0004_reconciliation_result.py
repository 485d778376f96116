"""One reconciliation result per delivery_uncertain receipt (``ReconciliationResult``).

Backfilled from what was recorded before: a refund item opened by an operator's "not executed",
then, for receipts without one, the first "executed" audit event.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('receipts', '0003_alter_receipt_permit_alter_receipt_tenant_id_and_more'),
        ('audit', '0007_append_function_from_sql_file'),
    ]

    operations = [
        migrations.CreateModel(
            name='ReconciliationResult',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tenant_id', models.CharField(db_index=True, max_length=40)),
                ('verdict', models.CharField(choices=[('executed', 'executed (the charge stands)'), ('not_executed', 'not executed (a refund is owed)')], max_length=16)),
                ('actor', models.CharField(blank=True, default='', max_length=100)),
                ('note', models.CharField(blank=True, default='', max_length=500)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('receipt', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='reconciliation_result', to='receipts.receipt')),
            ],
            options={
                'db_table': 'receipts_reconciliation_result',
            },
        ),
        migrations.RunSQL(
            """
            INSERT INTO receipts_reconciliation_result (receipt_id, tenant_id, verdict, actor, note, created_at)
            SELECT r.receipt_id, r.tenant_id, 'not_executed', '', left(r.reason, 500), r.created_at
              FROM receipts_refund_reconciliation r
             WHERE r.origin = 'operator_not_executed'
            ON CONFLICT (receipt_id) DO NOTHING;
            INSERT INTO receipts_reconciliation_result (receipt_id, tenant_id, verdict, actor, note, created_at)
            SELECT DISTINCT ON (e.detail->>'receipt_id') e.detail->>'receipt_id', e.tenant_id, 'executed',
                   left(coalesce(e.detail->>'actor', ''), 100), left(coalesce(e.detail->>'note', ''), 500), e.created_at
              FROM audit_event e
              JOIN receipts_receipt rc ON rc.receipt_id = e.detail->>'receipt_id'
             WHERE e.event = 'reconciliation.marked_executed'
             ORDER BY e.detail->>'receipt_id', e.seq
            ON CONFLICT (receipt_id) DO NOTHING;
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
