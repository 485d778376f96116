import django.db.models.deletion
from decimal import Decimal

from django.db import migrations, models

# Spend windows before this migration were aggregates over the ledger. Seed the counters
# with the net spend of the last 25 hours (all the windows read), for each wallet and for
# the agent above each child wallet, and make an agent's lifetime spend cover its children.
BACKFILL = """
INSERT INTO billing_spend_bucket (wallet_id, tenant_id, hour, amount)
SELECT owner, tenant_id, hour, GREATEST(-SUM(amount), 0)
  FROM (
        SELECT e.wallet_id AS owner, e.tenant_id, date_trunc('hour', e.created_at) AS hour, e.amount
          FROM billing_ledger_entry e
         WHERE e.kind IN ('charge', 'refund') AND e.wallet_id IS NOT NULL
           AND e.created_at >= date_trunc('hour', now()) - interval '24 hours'
        UNION ALL
        SELECT w.parent_id, e.tenant_id, date_trunc('hour', e.created_at), e.amount
          FROM billing_ledger_entry e JOIN billing_wallet w ON w.wallet_id = e.wallet_id
         WHERE e.kind IN ('charge', 'refund') AND w.wallet_type = 'child'
           AND e.created_at >= date_trunc('hour', now()) - interval '24 hours'
       ) AS spend
 GROUP BY owner, tenant_id, hour;

UPDATE billing_wallet AS a
   SET total_spent = a.total_spent + c.spent
  FROM (SELECT parent_id, SUM(total_spent) AS spent FROM billing_wallet
         WHERE wallet_type = 'child' GROUP BY parent_id) AS c
 WHERE a.wallet_id = c.parent_id AND a.wallet_type = 'agent';
"""


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0004_seed_category_prices"),
    ]

    operations = [
        migrations.CreateModel(
            name="SpendBucket",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("tenant_id", models.CharField(max_length=40)),
                ("hour", models.DateTimeField()),
                ("amount", models.DecimalField(decimal_places=8, default=Decimal("0"), max_digits=20)),
                (
                    "wallet",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="billing.wallet",
                    ),
                ),
            ],
            options={
                "db_table": "billing_spend_bucket",
                "constraints": [
                    models.UniqueConstraint(fields=("wallet", "hour"), name="spend_bucket_wallet_hour"),
                    models.CheckConstraint(condition=models.Q(("amount__gte", 0)), name="spend_bucket_non_negative"),
                ],
            },
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
