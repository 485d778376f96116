"""``billing_debit`` from its own file (billing/sql/billing_debit.sql), with one plan per statement for every
call (``plan_cache_mode = force_generic_plan``) and the charge endpoint's idempotency query run only for
keyed charges. The rules are unchanged."""

import importlib

from django.db import migrations

from common.sqlfiles import run_sql_file

PREVIOUS = importlib.import_module("billing.migrations.0008_debit_function").DEBIT


class Migration(migrations.Migration):
    dependencies = [("billing", "0009_charge_function")]

    operations = [
        run_sql_file(
            "billing",
            "billing_debit",
            sha256="9058c430dfb487e70634b8a462987ac094030e4b0870c32ab26812f3b5977efd",
            reverse_sql=PREVIOUS,
        )
    ]
