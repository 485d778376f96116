from django.db import migrations, models

BACKFILL = """
UPDATE permits_policy_bundle AS p
   SET created_by_wallet_id = k.wallet_id
  FROM billing_api_key AS k
 WHERE k.key_id = p.created_by_key_id
   AND k.wallet_id IS NOT NULL
"""


class Migration(migrations.Migration):
    dependencies = [
        ("permits", "0001_initial"),
        ("billing", "0004_seed_category_prices"),
    ]

    operations = [
        migrations.AddField(
            model_name="policybundle",
            name="created_by_wallet_id",
            field=models.CharField(blank=True, default="", max_length=40),
        ),
        # Policies created before this column existed: their creator is the wallet of the key
        # that created them (operator keys have no wallet and leave it empty).
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
