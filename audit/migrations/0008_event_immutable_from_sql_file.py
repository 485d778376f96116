"""``audit_event_immutable`` from its own file (audit/sql/audit_event_immutable.sql), like the functions:
audit events are never updated or deleted. The body and trigger are the ones 0003 created inline;
applying the file again replaces the function and drops and creates the trigger in this migration's
transaction, so a database that has it keeps it, as it had it."""

from django.db import migrations

from common.sqlfiles import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("audit", "0007_append_function_from_sql_file")]

    operations = [
        run_sql_file(
            "audit",
            "audit_event_immutable",
            sha256="a7bfc34390e8cc36be6b148c567228492e695193311f82bf44cd062fcd8f1613",
        ),
    ]
