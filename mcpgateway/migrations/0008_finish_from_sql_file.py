"""``gateway_finish`` from its own file (mcpgateway/sql/gateway_finish.sql): the claimed action is locked,
checked and updated by one conditional UPDATE instead of a locking read and an update. Same signature."""

import importlib

from django.db import migrations

from common.sqlfiles import run_sql_file

PREVIOUS = importlib.import_module("mcpgateway.migrations.0004_finish_function").FINISH


class Migration(migrations.Migration):
    dependencies = [("mcpgateway", "0007_claim_in_one_statement")]

    operations = [
        run_sql_file(
            "mcpgateway",
            "gateway_finish",
            sha256="e95668733e3c014dd3f4cbb6d261f3ccd9a1e141364de9e9afacc10326e2b3c1",
            reverse_sql=PREVIOUS,
        )
    ]
