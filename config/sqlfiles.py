"""Database functions kept as SQL files: one file per function under ``<app>/sql/``, loaded by migrations.

The money core and the chain link are PostgreSQL functions (docs/architecture.md, "The SQL core").
Each lives in one reviewed file, ``<app>/sql/<function>.sql``, that starts with a
comment saying what the function guarantees and assumes and ends with its
``CREATE OR REPLACE FUNCTION``. A migration applies the file with
:func:`run_sql_file`; changing a function means editing its file and adding a
migration that applies it again, so every database gets the new body.

Files are read when the migration module is imported: a database migrated from
scratch gets today's body at the first migration that names the file, and the
same body again at the later ones. Function bodies are not checked against the
catalogue while they are created (``check_function_bodies = off``), so a body may
name a table or column that a later migration of the same run adds.
"""

from __future__ import annotations

from pathlib import Path

from django.apps import apps
from django.db import migrations

ROOT = Path(__file__).resolve().parent.parent


def sql_file_text(app_label: str, name: str) -> str:
    """The text of ``<app>/sql/<name>.sql``."""
    try:
        base = Path(apps.get_app_config(app_label).path)
    except LookupError:  # during early start-up the registry may not be ready; apps live at the root
        base = ROOT / app_label
    return (base / "sql" / f"{name}.sql").read_text(encoding="utf-8")


def run_sql_file(app_label: str, name: str, *, reverse_sql: str | None = None) -> migrations.RunSQL:
    """A migration operation that applies ``<app>/sql/<name>.sql`` (a ``CREATE OR REPLACE FUNCTION``).

    ``reverse_sql`` undoes it (usually the ``DROP FUNCTION`` of the signature); without it,
    migrating backwards leaves the function in place.
    """
    text = sql_file_text(app_label, name)
    return migrations.RunSQL(
        "SET LOCAL check_function_bodies = off;\n" + text,
        reverse_sql=reverse_sql if reverse_sql is not None else migrations.RunSQL.noop,
    )
