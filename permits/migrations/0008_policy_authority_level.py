"""``PolicyBundle.authority_wallet_id``: the level a policy's rules were last set at, which decides who
may change it. Until now that was the creator's wallet only, so a policy an agent set on itself stayed
the agent's to change after its sponsor tightened it. Existing policies start at their creator's level."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("permits", "0007_reserve_checks_every_signed_column")]

    operations = [
        migrations.AddField(
            model_name="policybundle",
            name="authority_wallet_id",
            field=models.CharField(blank=True, default="", max_length=40),
        ),
        migrations.RunSQL(
            "UPDATE permits_policy_bundle SET authority_wallet_id = created_by_wallet_id",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
