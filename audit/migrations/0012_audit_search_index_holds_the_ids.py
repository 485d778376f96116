"""The audit search index holds the ids only: the GIN index on the whole detail (audit.0010) becomes one on
``audit_detail_refs(detail)``, the actor and the ids the detail names (docs/decisions.md, "The audit search
index holds the ids only"). The function comes first: the index is built on it."""

import django.contrib.postgres.indexes
from django.db import migrations, models

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0011_append_in"),
    ]

    operations = [
        run_sql_file(
            "audit",
            "audit_detail_refs",
            sha256="9ea08d235315e4e2b2b598028a91030f36c301ce2482524225fa20318412393c",
            reverse_sql="DROP FUNCTION IF EXISTS audit_detail_refs(jsonb);",
        ),
        migrations.RemoveIndex(
            model_name="auditevent",
            name="audit_detail_path_ops",
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=django.contrib.postgres.indexes.GinIndex(
                django.contrib.postgres.indexes.OpClass(
                    models.Func(models.F("detail"), function="audit_detail_refs", output_field=models.JSONField()),
                    name="jsonb_path_ops",
                ),
                name="audit_detail_refs_path_ops",
            ),
        ),
    ]
