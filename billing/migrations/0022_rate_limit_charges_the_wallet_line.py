"""``billing_rate_limit_key_charge`` again: a wallet key's request charges its wallet line's window as well
as its own, so an agent minting keys (or child wallets with keys) does not multiply its rate limit. Its
callers (the rate limiter's statement, ``gateway_claim``, ``billing_charge``) call it by name and need no change."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0021_ledger_triggers_from_sql_files")]

    operations = [
        run_sql_file(
            "billing",
            "billing_rate_limit_key_charge",
            sha256="3640348d605abe440698fa9bbf4da92779806e39cded6ad86c21a027bc3ced9e",
        )
    ]
