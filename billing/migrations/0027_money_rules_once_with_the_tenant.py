"""The money rules once, in PostgreSQL, each function taking its tenant (docs/decisions.md, "Records between
apps" and "Each money rule lives once, in PostgreSQL"):

- billing_post (new): the one posting of money, used by billing_debit (the charge and the auto-refill),
  billing_refund and billing.services.ledger (provision, fund, return on close);
- billing_wallet_may_spend (new): the wallet-status rule, used by billing_debit and by Python;
- billing_refund (new): a refund and the spend it undoes (was Python's ``_move`` and ``_count_spend``);
- billing_debit takes p_tenant_id first (and billing_debit_in, the debit as billing's ``debit_in``
  record); billing_daily_cap_over takes p_tenant_id first; billing_charge passes them its tenant and
  appends its events with audit_append_in (audit 0010).
The old signatures are dropped.
"""

from django.db import migrations

from common.sqlfiles import run_sql_file

PREVIOUS_DEBIT = (
    "billing_debit(text, numeric, timestamptz, text, numeric, text, text, text, text[], numeric, numeric, text)"
)
DEBIT = "billing_debit(text, text, numeric, timestamptz, text, numeric, text, text, text, text[], numeric, numeric, text)"
PREVIOUS_CAP_OVER = "billing_daily_cap_over(text[], text[], numeric[], timestamptz)"
CAP_OVER = "billing_daily_cap_over(text, text[], text[], numeric[], timestamptz)"


class Migration(migrations.Migration):
    dependencies = [("billing", "0026_tool_price_history_and_wallet_settings_permission"), ("audit", "0011_append_in")]

    operations = [
        run_sql_file(
            "billing",
            "billing_post",
            sha256="cd37d19ec0c1d285136737b6b8f63bb15f92c0881d0fbd8c5a938a5418cc1c6b",
        ),
        run_sql_file(
            "billing",
            "billing_wallet_may_spend",
            sha256="9f7f1864fabd2015e1a1907dba453f0b92570893fee578b7b6ea1e14bbf64c67",
        ),
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_DEBIT};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "billing",
            "billing_debit",
            sha256="320ea5c707e613b40a5eae361bba772263d0dab157e620c64fff89d67728b102",
        ),
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_CAP_OVER};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "billing",
            "billing_daily_cap_over",
            sha256="59bcfdc7acb95c10aae351706cfa22a99e117f8b25ebb820a0abb9fc2bf25e5e",
        ),
        run_sql_file(
            "billing",
            "billing_refund",
            sha256="f24b1858050d10d5372cbadd4b5c363400fce4a75d940322284c70b1cfa0e4b3",
        ),
        run_sql_file(
            "billing",
            "billing_charge",
            sha256="87edcca1e563d18bcd57dd82116ba3a198c1d55e353c58251aeb547ac2016be2",
        ),
    ]
