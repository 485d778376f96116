"""Database functions and triggers kept as SQL files: one file each under ``<app>/sql/``, applied by migrations.

The money core, the chain link and the ledger's and audit log's invariant triggers are
PostgreSQL objects (docs/architecture.md, "The SQL core"). Each lives in one reviewed file,
``<app>/sql/<name>.sql``, that starts with a comment saying what it guarantees and assumes, then
its ``CREATE OR REPLACE FUNCTION`` (and, for a trigger, ``DROP TRIGGER IF EXISTS`` and
``CREATE TRIGGER``: every file can be applied again).

A migration applies a file with :func:`run_sql_file` and records the SHA-256 of the body it
applies (docs/decisions.md, Foundation, "A SQL file changes with a migration"). Changing a
function means editing its file and adding a migration ``run_sql_file(app, name,
sha256=<sha256sum of the file>)``; the file is read when the migration runs, not when it is
imported, and:

- the operation applies the file when the file still has the hash it records;
- otherwise it applies nothing when the latest migration applying that file records the file's
  current hash (that migration applies it: an older migration's body is gone, so a database
  migrated from scratch gets only the file's current body, from the migrations that record it);
- otherwise the file changed without a migration, and migrating fails (:class:`SqlFileChanged`).

A file whose function gives way to another is retired, not just deleted: a migration
``retire_sql_file(app, name, drop="<signature>")`` drops its function, and the file may then go.
Every migration that applied it applies nothing from then on (its body is gone), and the catalogue
accepts a missing file only when a migration retires it.

Function bodies are not checked against the catalogue while they are created
(``check_function_bodies = off``), so a body may name a table or column that a later migration
of the same run adds. :func:`sql_catalogue_problems` and :func:`sql_database_differences` are
what tests/test_sql_catalogue.py checks: every file's hash recorded by its latest migration, and
the database's functions and triggers (``pg_proc``, ``pg_trigger``) exactly the files'.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlparse
from django.apps import apps
from django.db import router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

ROOT = Path(__file__).resolve().parent.parent

_FUNCTION = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)\s*\(", re.IGNORECASE)
_TRIGGER = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:CONSTRAINT\s+)?TRIGGER\s+(\w+)\s.*?\sON\s+([\w.]+)", re.IGNORECASE | re.DOTALL
)
_DROP_TRIGGER = re.compile(r"DROP\s+TRIGGER\s+(?:IF\s+EXISTS\s+)?(\w+)\s+ON\s+([\w.]+)", re.IGNORECASE)
_SCRATCH_SCHEMA = "sqlfiles_scratch"


class SqlFileChanged(Exception):
    """A SQL file's current body is recorded by no migration that applies it last: it changed without a migration."""


def sql_file_path(app_label: str, name: str) -> Path:
    """Where ``<app>/sql/<name>.sql`` is."""
    try:
        base = Path(apps.get_app_config(app_label).path)
    except LookupError:  # during early start-up the registry may not be ready; apps live at the root
        base = ROOT / app_label
    return base / "sql" / f"{name}.sql"


def sql_file_text(app_label: str, name: str) -> str:
    """The text of ``<app>/sql/<name>.sql``."""
    return sql_file_path(app_label, name).read_text(encoding="utf-8")


def sql_file_sha256(app_label: str, name: str) -> str:
    """The SHA-256 of the file's bytes, in hex: what ``sha256sum <app>/sql/<name>.sql`` prints."""
    return hashlib.sha256(sql_file_path(app_label, name).read_bytes()).hexdigest()


def _label(app_label: str, name: str) -> str:
    return f"{app_label}/sql/{name}.sql"


def _bare(statement: str) -> str:
    """The statement without its comments, on one line."""
    text = sqlparse.format(statement, strip_comments=True)
    return " ".join(text.split()).rstrip(";").strip()


@dataclass(frozen=True)
class SqlFile:
    """One ``<app>/sql/<name>.sql`` and what it defines."""

    app_label: str
    name: str

    @property
    def label(self) -> str:
        return _label(self.app_label, self.name)

    def text(self) -> str:
        return sql_file_text(self.app_label, self.name)

    def sha256(self) -> str:
        return sql_file_sha256(self.app_label, self.name)

    def statements(self) -> list[str]:
        """The file's statements, comments included, in order."""
        return [s for s in sqlparse.split(self.text()) if _bare(s)]

    def function_statements(self) -> dict[str, str]:
        """Each function the file creates (``CREATE OR REPLACE FUNCTION name(``): name -> its statement."""
        found = {}
        for statement in self.statements():
            match = _FUNCTION.match(_bare(statement))
            if match:
                found[match.group(1)] = statement
        return found

    def trigger_statements(self) -> dict[tuple[str, str], str]:
        """Each trigger the file creates: (trigger, table) -> its statement."""
        found = {}
        for statement in self.statements():
            match = _TRIGGER.match(_bare(statement))
            if match:
                found[(match.group(1), match.group(2))] = statement
        return found


def sql_files() -> list[SqlFile]:
    """Every ``<app>/sql/*.sql`` of the installed apps."""
    return [
        SqlFile(config.label, path.stem)
        for config in apps.get_app_configs()
        for path in sorted((Path(config.path) / "sql").glob("*.sql"))
    ]


class RunSqlFile(Operation):
    """Apply ``<app>/sql/<name>.sql`` if the file still has the body this migration records (see the module)."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, app_label: str, name: str, *, sha256: str, reverse_sql: str | None = None) -> None:
        self.app_label, self.name, self.sha256 = app_label, name, sha256
        self.reverse_sql = reverse_sql

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"sha256": self.sha256}
        if self.reverse_sql is not None:
            kwargs["reverse_sql"] = self.reverse_sql
        return self.__class__.__qualname__, [self.app_label, self.name], kwargs

    def describe(self) -> str:
        return f"Apply {_label(self.app_label, self.name)} (sha256 {self.sha256[:12]})"

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        pass

    def forwards_sql(self) -> str | None:
        """The SQL to run now: the file when it has the recorded hash, None when a later migration applies it.

        Raises :class:`SqlFileChanged` when the latest migration applying the file records another hash.
        """
        if _retired(self.app_label, self.name):
            return None  # a later migration drops its function; the file is gone
        current = sql_file_sha256(self.app_label, self.name)
        if current == self.sha256:
            return "SET LOCAL check_function_bodies = off;\n" + sql_file_text(self.app_label, self.name)
        latest = [r for r in sql_file_records() if (r.app_label, r.name) == (self.app_label, self.name) and r.latest]
        if any(r.sha256 == current for r in latest):
            return None
        raise SqlFileChanged(sql_file_changed_message(self.app_label, self.name, current, latest))

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if router.allow_migrate(schema_editor.connection.alias, app_label):
            sql = self.forwards_sql()
            if sql is not None:
                schema_editor.execute(sql, params=None)

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if self.reverse_sql and router.allow_migrate(schema_editor.connection.alias, app_label):
            schema_editor.execute(self.reverse_sql, params=None)


def run_sql_file(app_label: str, name: str, *, sha256: str, reverse_sql: str | None = None) -> RunSqlFile:
    """A migration operation that applies ``<app>/sql/<name>.sql`` when the file's SHA-256 is ``sha256``.

    ``sha256`` is the hash of the body this migration applies (``sha256sum`` of the file).
    ``reverse_sql`` undoes it (usually the ``DROP FUNCTION`` of the signature); without it,
    migrating backwards leaves the function in place.
    """
    return RunSqlFile(app_label, name, sha256=sha256, reverse_sql=reverse_sql)


class RetireSqlFile(Operation):
    """Drop the function of ``<app>/sql/<name>.sql`` for good: the file is deleted with this migration."""

    reduces_to_sql = True
    reversible = True  # backwards it does nothing: the file's body is gone, as every earlier migration's is

    def __init__(self, app_label: str, name: str, *, drop: str) -> None:
        self.app_label, self.name, self.drop = app_label, name, drop

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__qualname__, [self.app_label, self.name], {"drop": self.drop}

    def describe(self) -> str:
        return f"Retire {_label(self.app_label, self.name)} (drop {self.drop})"

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        pass

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if router.allow_migrate(schema_editor.connection.alias, app_label):
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {self.drop}", params=None)

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        pass


def retire_sql_file(app_label: str, name: str, *, drop: str) -> RetireSqlFile:
    """A migration operation that drops the function of ``<app>/sql/<name>.sql`` (``drop``: its signature),
    whose file is deleted: the migrations that applied the file apply nothing from then on."""
    return RetireSqlFile(app_label, name, drop=drop)


@functools.lru_cache(maxsize=1)
def retired_sql_files() -> frozenset[tuple[str, str]]:
    """The (app, name) of every file a migration on disk retires (read once, like ``sql_file_records``)."""
    from django.db.migrations.loader import MigrationLoader

    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    return frozenset(
        (operation.app_label, operation.name)
        for migration in graph.nodes.values()
        for operation in migration.operations
        if isinstance(operation, RetireSqlFile)
    )


def _retired(app_label: str, name: str) -> bool:
    """A retired file that is gone: the migrations that applied it apply nothing."""
    return (app_label, name) in retired_sql_files() and not sql_file_path(app_label, name).exists()


@dataclass(frozen=True)
class SqlFileRecord:
    """A migration's :func:`run_sql_file`: which file, the hash it records, and whether it is the file's latest."""

    app_label: str
    name: str
    sha256: str
    migration: tuple[str, str]
    latest: bool

    @property
    def label(self) -> str:
        return _label(self.app_label, self.name)


@functools.lru_cache(maxsize=1)
def sql_file_records() -> tuple[SqlFileRecord, ...]:
    """Every :func:`run_sql_file` of every migration on disk.

    A record is ``latest`` when no other migration applying the same file comes after it in the
    migration graph. Migrations do not change while a process runs: the records are read once
    (``sql_file_records.cache_clear()`` forgets them).
    """
    from django.db.migrations.loader import MigrationLoader

    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    applying: dict[tuple[str, str], list[tuple[tuple[str, str], RunSqlFile]]] = defaultdict(list)
    for key, migration in graph.nodes.items():
        for operation in migration.operations:
            if isinstance(operation, RunSqlFile):
                applying[(operation.app_label, operation.name)].append((key, operation))
    records = []
    for (app_label, name), found in applying.items():
        earlier = set()  # migrations that come before another one applying the file
        for key, _ in found:
            earlier |= set(graph.forwards_plan(key)) - {key}
        records += [SqlFileRecord(app_label, name, op.sha256, key, latest=key not in earlier) for key, op in found]
    return tuple(sorted(records, key=lambda r: (r.app_label, r.name, r.migration)))


def sql_file_changed_message(app_label: str, name: str, current: str, latest: list[SqlFileRecord]) -> str:
    """Why migrating or the catalogue's check fails, and the migration operation that fixes it."""
    recorded = ", ".join(f"{'.'.join(r.migration)} records {r.sha256}" for r in latest) or "no migration applies it"
    return (
        f"{_label(app_label, name)} changed without a migration: its sha256 is {current} ({recorded}). "
        f'Add a migration with run_sql_file("{app_label}", "{name}", sha256="{current}").'
    )


def sql_catalogue_problems(files: list[SqlFile] | None = None) -> list[str]:
    """What is wrong between the SQL files and the migrations that apply them ([] when nothing).

    Every file is applied by a migration, its latest one (exactly one: migrations applying the same
    file are ordered) records the file's current hash, and every migration names a file that exists.
    """
    files = sql_files() if files is None else files
    records = sql_file_records()
    problems = []
    for file in files:
        current = file.sha256()
        latest = [r for r in records if (r.app_label, r.name) == (file.app_label, file.name) and r.latest]
        if len(latest) > 1:
            problems.append(f"{file.label}: more than one latest migration applies it: {latest}")
        if not any(r.sha256 == current for r in latest):
            problems.append(sql_file_changed_message(file.app_label, file.name, current, latest))
    named = {(f.app_label, f.name) for f in files}
    for record in records:
        if (
            (record.app_label, record.name) not in named
            and not sql_file_path(record.app_label, record.name).exists()
            and (record.app_label, record.name) not in retired_sql_files()
        ):
            problems.append(f"{'.'.join(record.migration)} applies {record.label}, which does not exist")
    return problems


class _Rollback(Exception):
    pass


_FUNCTIONS = """
    SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p
     WHERE p.pronamespace = %s::regnamespace
       AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                       AND d.objid = p.oid AND d.deptype = 'e')
"""
_TRIGGERS = """
    SELECT t.tgname, c.relname, pg_get_triggerdef(t.oid), t.tgenabled FROM pg_trigger t
      JOIN pg_class c ON c.oid = t.tgrelid
     WHERE NOT t.tgisinternal AND c.relnamespace = %s::regnamespace
"""


def migration_state_tables(connection: BaseDatabaseWrapper) -> set[str]:
    """The tables of the models at the connection's migration state (the migrations it has applied).

    Read from the migration graph, not from the catalogue: a table the applied migrations create but
    the database lacks is still expected there.
    """
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection, ignore_no_migrations=True)
    applied = set(loader.applied_migrations)
    heads = [key for key in applied if not any(child.key in applied for child in loader.graph.node_map[key].children)]
    state = loader.graph.make_state(nodes=heads, at_end=True, real_apps=loader.unmigrated_apps)
    return {
        model.options.get("db_table") or f"{app_label}_{model_name}"
        for (app_label, model_name), model in state.models.items()
        if model.options.get("managed", True) and not model.options.get("proxy", False)
    }


def _on_absent_table(statement: str, absent: set[str]) -> bool:
    match = _TRIGGER.match(_bare(statement)) or _DROP_TRIGGER.match(_bare(statement))
    return match is not None and match.group(2) in absent


def sql_database_differences(connection: BaseDatabaseWrapper, files: list[SqlFile] | None = None) -> list[str]:
    """How the database's functions and triggers differ from the SQL files ([] when they are the files').

    In the connection's current schema: each function a file creates exists once (no other
    overload) and each trigger a file creates exists, enabled, with the definitions PostgreSQL
    prints (``pg_get_functiondef``, ``pg_get_triggerdef``) for the file applied to a scratch schema
    (with empty copies of the triggers' tables) that is rolled back; and no other function or
    trigger exists there (functions of extensions aside).

    What is expected follows the connection's migration state (:func:`migration_state_tables`), not
    the latest migrations on disk: a trigger whose table the applied migrations have not created (a
    database migrated back, the table's migration unapplied) is not expected; one whose table they
    have created is, whether or not the table is really there.
    """
    files = sql_files() if files is None else files
    problems: list[str] = []
    present = migration_state_tables(connection)
    absent = {table for file in files for _, table in file.trigger_statements() if table not in present}
    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("SELECT current_schema()")
            schema = cursor.fetchone()[0]
            cursor.execute(_FUNCTIONS, [schema])
            functions: dict[str, list[str]] = defaultdict(list)
            for name, definition in cursor.fetchall():
                functions[name].append(definition)
            cursor.execute(_TRIGGERS, [schema])
            triggers = {(name, table): (definition, enabled) for name, table, definition, enabled in cursor.fetchall()}

            # The files applied again where they change nothing: a scratch schema first on the search_path.
            quoted = connection.ops.quote_name(schema)
            cursor.execute(f"CREATE SCHEMA {_SCRATCH_SCHEMA}")
            for table in sorted({table for file in files for _, table in file.trigger_statements()} - absent):
                cursor.execute("SELECT to_regclass(%s)", [f"{quoted}.{table}"])
                # A table the migrations created but the database lacks: its trigger is reported missing.
                like = f"LIKE {quoted}.{table}" if cursor.fetchone()[0] is not None else ""
                cursor.execute(f"CREATE TABLE {_SCRATCH_SCHEMA}.{table} ({like})")
            cursor.execute(f"SET LOCAL search_path = {_SCRATCH_SCHEMA}, {quoted}")
            cursor.execute("SET LOCAL check_function_bodies = off")
            for file in files:
                for statement in file.statements():
                    if not _on_absent_table(statement, absent):
                        cursor.execute(statement)
            cursor.execute(_FUNCTIONS, [_SCRATCH_SCHEMA])
            expected_functions = dict(cursor.fetchall())
            cursor.execute(_TRIGGERS, [_SCRATCH_SCHEMA])
            expected_triggers = {(name, table): definition for name, table, definition, _ in cursor.fetchall()}

            def same(definition: str) -> str:
                return definition.replace(f"{_SCRATCH_SCHEMA}.", "").replace(f"{schema}.", "")

            for file in files:
                for function in file.function_statements():
                    found = functions.get(function, [])
                    if not found:
                        problems.append(f"{file.label}: function {function} is not in the database")
                    elif len(found) > 1:
                        problems.append(
                            f"{file.label}: function {function} has {len(found)} signatures in the database"
                        )
                    if found and same(expected_functions[function]) not in [same(d) for d in found]:
                        problems.append(f"{file.label}: function {function} in the database is not the file's")
                for trigger, table in file.trigger_statements():
                    if table in absent:
                        continue
                    definition, enabled = triggers.get((trigger, table), (None, None))
                    if definition is None:
                        problems.append(f"{file.label}: trigger {trigger} on {table} is not in the database")
                    elif same(definition) != same(expected_triggers[(trigger, table)]):
                        problems.append(f"{file.label}: trigger {trigger} in the database is not the file's")
                    elif enabled != "O":
                        problems.append(f"{file.label}: trigger {trigger} on {table} is disabled ({enabled})")
            for function in sorted(set(functions) - set(expected_functions)):
                problems.append(f"function {function} is in the database but in no <app>/sql/ file")
            for trigger, table in sorted(set(triggers) - set(expected_triggers)):
                problems.append(f"trigger {trigger} on {table} is in the database but in no <app>/sql/ file")
            raise _Rollback
    except _Rollback:
        pass
    return problems
