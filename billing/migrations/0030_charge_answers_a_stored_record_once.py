"""``billing_charge`` answers a stored idempotency record in one place, ``billing_charge_replay`` (called only
when a record exists), whether the record was found before the locks or after ``billing_debit``'s 'replay'."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("billing", "0029_charge_reads_the_policy_verdict")]

    operations = [
        run_sql_file(
            "billing", "billing_charge", sha256="c1ec1a46de0cbe546711d2989825a69cbe40cc4dabeb36411c2d7e7c4c1c5925"
        ),
    ]
