"""``permits_policies_version`` (permits/sql/permits_policies_version.sql): a version of the policies on a
wallet's line, which the governed call caches with them and its claim compares."""

from django.db import migrations

from config.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("permits", "0005_verified_reserve_and_quote_consume")]

    operations = [
        run_sql_file(
            "permits", "permits_policies_version", reverse_sql="DROP FUNCTION IF EXISTS permits_policies_version(text[]);"
        ),
    ]
