"""common.fastsql: precompiled reads and writes give what the ORM would have given."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection

from common import fastsql
from common.ids import new_id
from mcpgateway.models import Action, Tool

pytestmark = pytest.mark.django_db


def _action(tenant, **extra) -> Action:
    return Action(
        action_id=new_id("act"),
        tenant_id=tenant.agent.tenant_id,
        wallet=tenant.agent,
        api_key_id="key_x",
        idempotency_key=new_id("idem"),
        request_hash="h" * 64,
        tool="demo.echo",
        arguments={"text": "é", "nested": {"n": [1, 2]}},
        transport="streamable",
        quote_id="",
        created_at=datetime(2026, 11, 24, 12, 0, 0, 123456, tzinfo=UTC),
        **extra,
    )


def test_insert_and_instance_round_trip_as_the_orm(tenant) -> None:
    action = _action(tenant, price=Decimal("0.00010000"))
    fastsql.insert(action)
    assert not action._state.adding
    orm = Action.objects.get(pk=action.action_id)
    row = fastsql.fetch_row(
        f"SELECT {fastsql.columns(Action, 'a')} FROM mcpgateway_action a WHERE a.action_id = %s", [action.action_id]
    )
    assert row is not None
    fast = fastsql.instance(Action, row)
    for field in Action._meta.concrete_fields:
        assert getattr(fast, field.attname) == getattr(orm, field.attname), field.name
    assert fast.arguments == {"text": "é", "nested": {"n": [1, 2]}}  # JSON converted, not a string


def test_update_writes_the_named_fields_only(tenant) -> None:
    action = _action(tenant)
    fastsql.insert(action)
    action.state = "dispatch_claimed"
    action.tool = "not.written"
    assert fastsql.update(action, ["state"]) == 1
    stored = Action.objects.get(pk=action.action_id)
    assert (stored.state, stored.tool) == ("dispatch_claimed", "demo.echo")
    ghost = _action(tenant)
    assert fastsql.update(ghost, ["state"]) == 0  # no such row


def test_insert_refuses_models_with_database_generated_keys() -> None:
    from billing.models import SpendBucket

    with pytest.raises(TypeError):
        fastsql.insert_sql(SpendBucket)


def test_json_row_loses_nothing(tenant) -> None:
    action = _action(tenant, price=Decimal("12345678901.12345678"))
    row = fastsql.json_row(action)
    text = json.dumps(row)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.price, r.created_at, r.arguments "
            "FROM jsonb_populate_record(NULL::mcpgateway_action, %s::jsonb) r",
            [text],
        )
        price, created_at, arguments = cursor.fetchone()
    assert price == Decimal("12345678901.12345678")
    assert created_at == action.created_at
    assert (json.loads(arguments) if isinstance(arguments, str) else arguments) == action.arguments


def test_a_tool_row_with_its_schemas(db) -> None:
    Tool.objects.create(service_id="t.x", input_schema={"type": "object"}, output_schema=None)
    row = fastsql.fetch_row(
        f"SELECT {fastsql.columns(Tool, 't')} FROM mcpgateway_tool t WHERE t.service_id = %s", ["t.x"]
    )
    assert row is not None
    tool = fastsql.instance(Tool, row)
    assert (tool.input_schema, tool.output_schema) == ({"type": "object"}, None)
    assert fastsql.width(Tool) == len(row)


def test_json_row_reads_each_field_as_its_pre_save_would(tenant) -> None:
    """The plain-attribute fast path agrees with ``pre_save``; fields that set themselves still do."""
    action = _action(tenant, price=Decimal("1.5"))
    assert fastsql.json_row(action) == {
        str(f.column): (
            str(v)
            if isinstance(v := f.pre_save(action, True), Decimal)
            else v.isoformat()
            if isinstance(v, datetime)
            else v
        )
        for f in Action._meta.concrete_fields
    }
    tool = Tool(service_id="t.y", input_schema={"type": "object"})  # created_at auto_now_add, updated_at auto_now
    before = datetime.now(UTC)
    row = fastsql.json_row(tool)
    assert datetime.fromisoformat(row["created_at"]) >= before
    assert datetime.fromisoformat(row["updated_at"]) >= before
    assert tool.updated_at is not None
    assert row["updated_at"] == tool.updated_at.isoformat()


def test_numbered_statement_past_psycopgs_parse_cache(db, django_assert_num_queries) -> None:
    """60 parameters (past the 50 psycopg caches its placeholder parse for) go as PostgreSQL's own $n."""
    from django.db import DatabaseError

    sql = "SELECT " + ", ".join(f"${n}::int * 2" for n in range(1, 61))
    with django_assert_num_queries(1):  # recorded while queries are captured, as Django's cursor is
        assert fastsql.fetch_all_numbered(sql, list(range(60))) == [tuple(n * 2 for n in range(60))]
    kept = fastsql.fetch_all_numbered("SELECT $1::text UNION ALL SELECT $2::text", ["a", "b"])
    assert kept == [("a",), ("b",)]
    with pytest.raises(DatabaseError) as refused:  # Django's error, psycopg's as its cause
        fastsql.fetch_all_numbered("SELECT 1 / $1::int", [0])
    assert getattr(refused.value.__cause__, "sqlstate", None) == "22012"
