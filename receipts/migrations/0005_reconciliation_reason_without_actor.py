"""A refund item's ``reason`` no longer names the operator who marked the call not executed.

Items are listed to the wallet's own keys; who marked it stays in ``ReconciliationResult`` and the
audit event. Items recorded before keep their note when the result holds it apart from the reason
(results backfilled by 0004 hold the old reason, actor included, as their note: theirs is dropped).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("receipts", "0004_reconciliation_result")]

    operations = [
        migrations.RunSQL(
            """
            UPDATE receipts_refund_reconciliation item
               SET reason = 'marked not executed'
                   || CASE WHEN result.actor <> '' AND result.note <> '' THEN ': ' || result.note ELSE '' END
              FROM receipts_reconciliation_result result
             WHERE result.receipt_id = item.receipt_id
               AND item.origin = 'operator_not_executed'
               AND item.reason LIKE 'marked not executed by %';
            UPDATE receipts_refund_reconciliation
               SET reason = 'marked not executed'
             WHERE origin = 'operator_not_executed' AND reason LIKE 'marked not executed by %';
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
