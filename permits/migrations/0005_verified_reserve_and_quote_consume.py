"""The reservation requires the signed limits (permits/sql/permits_reserve.sql); quotes are consumed by
``permits_quote_consume`` (permits/sql/permits_quote_consume.sql). Both are called by the governed call's
single-statement claim and by ``permits.services``."""

import importlib

from django.db import migrations

from common.sqlfiles import run_sql_file

OLD_RESERVE = importlib.import_module("permits.migrations.0004_reserve_function").RESERVE


class Migration(migrations.Migration):
    dependencies = [("permits", "0004_reserve_function")]

    operations = [
        migrations.RunSQL(
            "DROP FUNCTION IF EXISTS permits_reserve(text, numeric, timestamptz);", reverse_sql=OLD_RESERVE
        ),
        run_sql_file(
            "permits",
            "permits_reserve",
            sha256="fc3759c20b7ac7a80bbd2967a7e4071b3126b5f4073153063fb900dc163e82bd",
            reverse_sql=(
                "DROP FUNCTION IF EXISTS permits_reserve(text, numeric, timestamptz, numeric, integer, timestamptz, "
                "text);"
            ),
        ),
        run_sql_file(
            "permits",
            "permits_quote_consume",
            sha256="4ca55f9aba50822db9270a91ccb7462b1eb4351db2c95e64bff65119875cb05e",
            reverse_sql=(
                "DROP FUNCTION IF EXISTS permits_quote_consume(text, text, text, numeric, text, text, timestamptz);"
            ),
        ),
    ]
