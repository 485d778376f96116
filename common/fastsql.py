"""Hot-path reads without the ORM's query compiler.

Compiling a queryset costs more CPU than PostgreSQL spends answering a
primary-key lookup. The governed call's fixed lookups (the API key and its
wallet, the tool and its price, the action of an idempotency key, the permit and
the writes of actions and receipts) use this instead: the column list of each model is built once per process, the
SQL is a constant of the caller, and rows become model instances through
``Model.from_db`` with the fields' own database converters (JSON and the
like), so what callers get is what the ORM would have returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models import AutoField, BigAutoField, DateField, DateTimeField, Field, Model, SmallAutoField, TimeField

M = TypeVar("M", bound=Model)


@cache
def _layout(model: type[Model]) -> tuple[list[str], tuple[str, ...], tuple[tuple[int, Callable[..., Any]], ...]]:
    fields = model._meta.concrete_fields
    columns = [f'"{field.column}"' for field in fields]
    names = tuple(field.attname for field in fields)
    converters = tuple(
        (index, field.from_db_value) for index, field in enumerate(fields) if hasattr(field, "from_db_value")
    )
    return columns, names, converters


def columns(model: type[Model], alias: str) -> str:
    """``alias."col1", alias."col2", ...``: every concrete column of ``model``, in field order."""
    return ", ".join(f"{alias}.{column}" for column in _layout(model)[0])


def width(model: type[Model]) -> int:
    return len(_layout(model)[1])


def instance(model: type[M], values: Sequence[Any]) -> M:
    """A model instance from one row's values for ``columns(model, ...)``, as the ORM builds it."""
    _, names, converters = _layout(model)
    row = list(values)
    for index, convert in converters:
        row[index] = convert(row[index], None, connection)
    return model.from_db(connection.alias, names, row)


def fetch_row(sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """The first row of ``sql`` (one round trip), or None."""
    cursor = _reusable_cursor()
    if cursor is None:
        with connection.cursor() as fresh:
            fresh.execute(sql, params)
            row = fresh.fetchone()
    else:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return tuple(row) if row is not None else None


def fetch_all_numbered(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Every row of ``sql`` (one round trip), whose placeholders are PostgreSQL's own ``$1``, ``$2``, ...

    psycopg turns ``%s`` placeholders into these by parsing the statement on every execution once
    it has more than 50 parameters (it caches the result only below that), which costs more than a
    small statement's round trip; a statement written with numbered placeholders goes as it is
    (psycopg's raw cursor). The cursor is Django's like ``fetch_row``'s (errors are Django's,
    execute wrappers and query recording apply) and kept the same way.
    """
    db = connections[DEFAULT_DB_ALIAS]
    # Django's plain wrapper even while queries are recorded: its debug wrapper renders the
    # statement with %s placeholders; this records it below instead.
    cursor = _kept_cursor(db, "_fastsql_raw_cursor", lambda: CursorWrapper(psycopg.RawCursor(db.connection), db))
    start = time.monotonic()
    try:
        cursor.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()]
    finally:
        if db.queries_logged:
            db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - start:.3f}"})


def _reusable_cursor() -> Any:
    """The cursor this thread's connection keeps for the statements run here, or None.

    Creating a cursor costs more than a primary-key lookup (psycopg sets up its adapters
    for each), and the hot path runs its few statements one at a time, so each connection
    keeps one and reuses it. It is Django's cursor (errors are Django's, execute wrappers
    apply), made again whenever the connection is (a reconnect, a closed connection). None
    while queries are being recorded (DEBUG, tests capturing queries): those take a fresh
    cursor, which records them.
    """
    db = connections[DEFAULT_DB_ALIAS]
    if db.queries_logged:
        return None
    return _kept_cursor(db, "_fastsql_cursor", db.cursor)


def _kept_cursor(db: Any, name: str, make: Callable[[], Any]) -> Any:
    """The cursor ``make()`` made for ``db``'s current connection, kept on ``db`` as ``name``; made again
    whenever the connection is (a reconnect, a closed connection)."""
    db.close_if_health_check_failed()  # what opening a cursor does first: once per request
    db.ensure_connection()
    kept = db.__dict__.get(name)
    if kept is None or kept[0] is not db.connection:
        kept = (db.connection, make())
        db.__dict__[name] = kept
    return kept[1]


@cache
def insert_sql(model: type[Model]) -> str:
    """``INSERT INTO table (every column) VALUES (%s, ...)`` for ``model`` (built once per process)."""
    fields = model._meta.concrete_fields
    if any(isinstance(field, AutoField | BigAutoField | SmallAutoField) for field in fields):
        raise TypeError(f"{model.__name__}: fastsql.insert needs a primary key set by the caller")
    names = ", ".join(f'"{field.column}"' for field in fields)
    return f'INSERT INTO "{model._meta.db_table}" ({names}) VALUES ({", ".join(["%s"] * len(fields))})'  # noqa: S608


def insert_values(obj: Model) -> list[Any]:
    """The values of ``insert_sql(type(obj))``, through each field's ``pre_save`` and ``get_db_prep_save``."""
    return [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in type(obj)._meta.concrete_fields]


def inserted(obj: Model) -> None:
    """Mark ``obj`` as stored (after its row was inserted by ``insert_sql`` inside another statement)."""
    obj._state.adding = False
    obj._state.db = connection.alias


def insert(obj: Model) -> None:
    """``obj.save(force_insert=True)`` without query compilation (no signals, no ``save()`` override)."""
    with connection.cursor() as cursor:
        cursor.execute(insert_sql(type(obj)), insert_values(obj))
    inserted(obj)


def update(obj: Model, names: Sequence[str]) -> int:
    """``obj.save(update_fields=names)`` without query compilation; ``auto_now`` fields move too.

    Returns the number of rows updated (0 when the row is gone).
    """
    meta = type(obj)._meta
    fields = [meta.get_field(name) for name in names]
    fields += [f for f in meta.concrete_fields if getattr(f, "auto_now", False) and f not in fields]
    assignments = ", ".join(f'"{field.column}" = %s' for field in fields)  # type: ignore[union-attr]
    values = [field.get_db_prep_save(field.pre_save(obj, False), connection) for field in fields]  # type: ignore[union-attr]
    sql = f'UPDATE "{meta.db_table}" SET {assignments} WHERE "{meta.pk.column}" = %s'  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, obj.pk])
        return int(cursor.rowcount)


def json_row(obj: Model) -> dict[str, Any]:
    """``obj``'s row as a JSON object, column by column, for ``jsonb_populate_record`` in SQL.

    Decimals travel as strings and times in ISO 8601 with their offset, so nothing is
    rounded or shifted on the way; JSON columns travel as JSON.
    """
    row: dict[str, Any] = {}
    for column, attname, field in _row_fields(type(obj)):
        value = getattr(obj, attname) if field is None else field.pre_save(obj, True)
        if isinstance(value, Decimal):
            value = str(value)
        elif isinstance(value, datetime):
            value = value.isoformat()
        row[column] = value
    return row


@cache
def _row_fields(model: type[Model]) -> tuple[tuple[str, str, Field[Any, Any] | None], ...]:
    """(column, attname, field) of ``model``'s concrete fields for ``json_row``; ``field`` is None where
    ``pre_save`` is a plain read of the attribute (every field but the date and time fields that
    set themselves: ``auto_now``, ``auto_now_add``)."""
    out = []
    for field in model._meta.concrete_fields:
        moves = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
        plain = type(field).pre_save in _PLAIN_PRE_SAVE and not moves
        out.append((str(field.column), field.attname, None if plain else field))
    return tuple(out)


# pre_save methods that only read the attribute unless auto_now / auto_now_add is set.
_PLAIN_PRE_SAVE = frozenset({Field.pre_save, DateField.pre_save, DateTimeField.pre_save, TimeField.pre_save})


def attach(instance: Model, name: str, related: Model | None) -> None:
    """Set a forward relation as ``select_related`` would (no query when it is read)."""
    instance._state.fields_cache[name] = related


def own_transaction() -> AbstractContextManager[Any]:
    """Around one statement that is its own transaction (autocommit): nothing to open, nothing to commit.

    PostgreSQL commits the statement as it ends, before its answer reaches this process, so the
    locks it took are not held across a round trip. Inside a caller's transaction (tests run
    in one) the statement gets a savepoint instead, so that a statement that fails rolls back
    alone there too.
    """
    return transaction.atomic() if connection.in_atomic_block else nullcontext()
