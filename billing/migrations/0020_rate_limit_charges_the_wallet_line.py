"""``billing_rate_limit_key_charge`` again: a wallet key's request charges its wallet line's window as well
as its own, so an agent minting keys (or child wallets with keys) does not multiply its rate limit. Its
callers (the rate limiter's statement, ``gateway_claim``, ``billing_charge``) call it by name and need no change."""

from django.db import migrations

from config.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0019_refill_threshold_counts_the_children")]

    operations = [run_sql_file("billing", "billing_rate_limit_key_charge")]
