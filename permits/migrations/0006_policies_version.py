"""``permits_policies_version`` (permits/sql/permits_policies_version.sql): a version of the policies on a
wallet's line, which the governed call caches with them and its claim compares."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("permits", "0005_verified_reserve_and_quote_consume")]

    operations = [
        run_sql_file(
            "permits",
            "permits_policies_version",
            sha256="9563d9bc5a4ae70963675b8479a4af28470a12afb624b81304778d8341774e0d",
            reverse_sql="DROP FUNCTION IF EXISTS permits_policies_version(text[]);",
        ),
    ]
