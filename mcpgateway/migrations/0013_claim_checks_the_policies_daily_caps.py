"""``gateway_claim`` checks the daily caps of the policies that allowed the call again after the debit,
under the locks the debit took (three more arguments: the policies, the wallets whose spend they cap,
the caps). Authorization alone read the spend before any lock, so concurrent calls passed a cap together."""

from importlib import import_module

from django.db import migrations

from common.sqlfiles import run_sql_file

# The signature 0010 created (0011 and 0012 kept it), and the same with the three caps' arrays.
PREVIOUS_SIGNATURE = import_module("mcpgateway.migrations.0010_claim_charges_the_deferred_rate_limit").SIGNATURE
SIGNATURE = PREVIOUS_SIGNATURE.removesuffix(")") + ", text[], text[], numeric[])"


class Migration(migrations.Migration):
    dependencies = [("mcpgateway", "0012_claim_and_finish_call_as_expressions")]

    operations = [
        migrations.RunSQL(f"DROP FUNCTION IF EXISTS {PREVIOUS_SIGNATURE};", reverse_sql=migrations.RunSQL.noop),
        run_sql_file(
            "mcpgateway",
            "gateway_claim",
            sha256="aba2800a59e5ae855ad67faeb892b91c486c56f0782331f7f6c96ada54b4111f",
            reverse_sql=f"DROP FUNCTION IF EXISTS {SIGNATURE};",
        ),
    ]
