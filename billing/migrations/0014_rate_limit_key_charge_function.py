"""``billing_rate_limit_key_charge`` (billing/sql): one unit on an API key's rate-limit window for the key's
holder only, the one copy of that rule; the rate limiter's statement, ``billing_charge`` and
``gateway_claim`` call it. ``billing_charge`` is applied again to call it."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0013_charge_takes_the_deferred_rate_limit")]

    operations = [
        run_sql_file(
            "billing",
            "billing_rate_limit_key_charge",
            sha256="06c1fed6bd1c3adef321336eff9f5445254bf473a1d2e4de146e52e46a3255ba",
            reverse_sql="DROP FUNCTION IF EXISTS billing_rate_limit_key_charge(text, text, bigint, text);",
        ),
        run_sql_file(
            "billing", "billing_charge", sha256="8e21ee0a5cadd1b93269d779fa34e9a02e488c4616ab3f98c5fe6bc0b0c7bc06"
        ),
    ]
