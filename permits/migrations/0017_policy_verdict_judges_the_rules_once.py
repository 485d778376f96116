"""``permits_policy_verdict``: the one judge of a policy bundle's rules, for the governed call (the tool
rules, and the human-approval rule on a permit its statement says a wallet's key issued unapproved) and
for a charge (billing 0029 has ``billing_charge`` call it and retires ``permits_charge_policies``). It
takes the tenant first and reads only its bundles. Backwards it stays (billing_charge, as billing 0029
leaves it, calls it)."""

from django.db import migrations

from common.sqlfiles import run_sql_file



class Migration(migrations.Migration):
    dependencies = [("permits", "0016_permit_approval_view_roles")]

    operations = [
        run_sql_file(
            "permits",
            "permits_policy_verdict",
            sha256="cdbf67407880b320d5864a26d823a46d2d211ee244a2cfda9fa5939ac8a47766",
        ),
    ]
