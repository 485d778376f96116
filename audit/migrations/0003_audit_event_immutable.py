"""Audit events are append-only in PostgreSQL too: UPDATE and DELETE raise.

TRUNCATE (test database flushes) is not a row operation and is unaffected.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION audit_event_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit events are immutable (% refused)', TG_OP USING ERRCODE = 'integrity_constraint_violation';
END;
$$;
CREATE TRIGGER audit_event_immutable
    BEFORE UPDATE OR DELETE ON audit_event
    FOR EACH ROW EXECUTE FUNCTION audit_event_immutable();
"""

DROP = """
DROP TRIGGER IF EXISTS audit_event_immutable ON audit_event;
DROP FUNCTION IF EXISTS audit_event_immutable();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("audit", "0002_signing_keys"),
    ]

    operations = [migrations.RunSQL(CREATE, DROP)]
