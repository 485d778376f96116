"""The permits app's side of the tenant-scoped keys, first step (docs/decisions.md, Foundation,
"Tenant-scoped keys"): Django's single-column foreign keys to tenant tables go (db_constraint=False;
permits 0011 puts composite ones in their place) and the idempotency unique keys gain tenant_id."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0024_shard_keys_prepare"),
        ("permits", "0010_policy_change_proposal"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="permit",
            name="permit_idempotency_unique",
        ),
        migrations.RemoveConstraint(
            model_name="permitrequest",
            name="permit_request_idempotency_unique",
        ),
        migrations.AlterField(
            model_name="policychangeproposal",
            name="policy",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="change_proposals",
                to="permits.policybundle",
            ),
        ),
        migrations.AlterField(
            model_name="permit",
            name="issuer_wallet",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="issued_permits",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="permit",
            name="wallet",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="permits",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="permitrequest",
            name="permit",
            field=models.OneToOneField(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="minted_from_request",
                to="permits.permit",
            ),
        ),
        migrations.AlterField(
            model_name="permitrequest",
            name="wallet",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="permit_requests",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="policybundle",
            name="wallet",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="policies",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="quote",
            name="wallet",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="quotes",
                to="billing.wallet",
            ),
        ),
        migrations.AlterField(
            model_name="tenantapprover",
            name="tenant",
            field=models.ForeignKey(
                db_constraint=False,
                limit_choices_to={"wallet_type": "sponsor"},
                on_delete=django.db.models.deletion.CASCADE,
                related_name="approvers",
                to="billing.wallet",
            ),
        ),
        migrations.AddConstraint(
            model_name="permit",
            constraint=models.UniqueConstraint(
                condition=models.Q(("idempotency_key", ""), _negated=True),
                fields=("idempotency_scope", "idempotency_key", "tenant_id"),
                name="permit_idempotency_unique",
            ),
        ),
        migrations.AddConstraint(
            model_name="permitrequest",
            constraint=models.UniqueConstraint(
                fields=("idempotency_scope", "idempotency_key", "tenant_id"), name="permit_request_idempotency_unique"
            ),
        ),
    ]
