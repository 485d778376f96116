"""``permits_policy_verdict``: the one judge of a policy bundle's rules, for the governed call (tool rules
included) and for a charge (billing 0029 has ``billing_charge`` call it and retires
``permits_charge_policies``). It takes the tenant first and reads only its bundles. Backwards
it stays (billing_charge, as billing 0029 leaves it, calls it)."""

from django.db import migrations

from common.sqlfiles import run_sql_file



class Migration(migrations.Migration):
    dependencies = [("permits", "0014_reserve_and_consume_with_the_tenant")]

    operations = [
        run_sql_file(
            "permits",
            "permits_policy_verdict",
            sha256="3c2e6e6b0bf0bc4ec94ea8e5364665f7613109f8e47c7dd8a5ae68f536e7b5cb",
        ),
    ]
