"""The schema is ready to be sharded by tenant (docs/scaling.md; docs/decisions.md, Foundation, "Tenant-scoped keys").

Read from the migrated test database's catalogue (``pg_class``, ``pg_constraint``, ``pg_index``):
every table is placed (tenant, reference or local, ``common.shardkeys``); a tenant table's tenant
column is NOT NULL and in its primary key, in every unique constraint and unique index, and in every
foreign key to another tenant table, on both sides; a tenant table's sequence-backed columns are
bigint. Each rule is shown failing on a table that breaks it, and the composite foreign keys are
shown refusing a row that points at another tenant's row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from billing.models import SpendBucket, Wallet
from common.shardkeys import LOCAL_TABLES, REFERENCE_TABLES, TENANT_TABLES
from permits.models import Quote
from permits.services.approval import APPROVAL_LOCK_CLASS, approval_lock
from tests.factories import make_key, make_sponsor, make_wallet

pytestmark = pytest.mark.django_db


def _rows(sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


def public_tables() -> set[str]:
    return {
        name
        for (name,) in _rows(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')"
        )
    }


def shard_problems(tenant_tables: Mapping[str, str]) -> list[str]:
    """Every way the catalogue breaks the rules for ``tenant_tables`` (table -> tenant column)."""
    problems: list[str] = []
    for table, tenant in sorted(tenant_tables.items()):
        found = _rows(
            "SELECT attnotnull FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s AND NOT attisdropped",
            [table, tenant],
        )
        if not found:
            problems.append(f"{table}: no column {tenant}")
            continue
        if not found[0][0]:
            problems.append(f"{table}: {tenant} is nullable")
        # Primary key, unique constraints and unique indexes (partial ones too): the tenant is a key column.
        for index, is_primary, has_tenant in _rows(
            """
            SELECT i.indexrelid::regclass::text, i.indisprimary,
                   EXISTS (SELECT 1 FROM pg_attribute a
                            WHERE a.attrelid = i.indrelid AND a.attname = %s
                              AND a.attnum = ANY (i.indkey[0:i.indnkeyatts - 1]))
              FROM pg_index i
             WHERE i.indrelid = %s::regclass AND (i.indisunique OR i.indisprimary)
            """,
            [tenant, table],
        ):
            if not has_tenant:
                problems.append(f"{table}: {'primary key' if is_primary else 'unique index'} {index} lacks {tenant}")
        if not _rows("SELECT 1 FROM pg_index WHERE indrelid = %s::regclass AND indisprimary", [table]):
            problems.append(f"{table}: no primary key")
        # Foreign keys to tenant tables: the tenant column maps to the target's tenant column.
        for name, target, pairs in _rows(
            """
            SELECT c.conname, c.confrelid::regclass::text,
                   array_agg(ARRAY[ca.attname::text, fa.attname::text] ORDER BY k.ord)
              FROM pg_constraint c
              CROSS JOIN LATERAL unnest(c.conkey, c.confkey) WITH ORDINALITY AS k(col, fcol, ord)
              JOIN pg_attribute ca ON ca.attrelid = c.conrelid AND ca.attnum = k.col
              JOIN pg_attribute fa ON fa.attrelid = c.confrelid AND fa.attnum = k.fcol
             WHERE c.contype = 'f' AND c.conrelid = %s::regclass
             GROUP BY c.conname, c.confrelid
            """,
            [table],
        ):
            target_tenant = tenant_tables.get(target)
            if target_tenant is not None and [tenant, target_tenant] not in pairs:
                problems.append(f"{table}: foreign key {name} to {target} does not match {tenant} to {target_tenant}")
        # Sequence-backed columns (serial or identity) are bigint: no 32-bit counter to wrap or to share.
        for column, type_name in _rows(
            """
            SELECT a.attname, format_type(a.atttypid, a.atttypmod)
              FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
             WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
               AND (a.attidentity <> '' OR pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%%')
            """,
            [table],
        ):
            if type_name != "bigint":
                problems.append(f"{table}: sequence-backed column {column} is {type_name}")
    return problems


def test_every_table_is_placed_once() -> None:
    placed = [*TENANT_TABLES, *REFERENCE_TABLES, *LOCAL_TABLES]
    assert len(placed) == len(set(placed))
    assert public_tables() == set(placed)


def test_tenant_tables_follow_the_rules() -> None:
    assert shard_problems(TENANT_TABLES) == []


def test_reference_tables_are_the_small_named_set() -> None:
    """Tools, upstream servers, prices, signing keys, API keys and the transparency log's note key; no reference
    table points at a local table."""
    assert {
        "mcpgateway_tool",
        "mcpgateway_upstream_server",
        "mcpgateway_upstream_credential",
        "billing_tool_price",
        "billing_service_price",
        "audit_signing_key",
        "billing_api_key",
        "tlog_log_key",
    } == REFERENCE_TABLES
    for table in REFERENCE_TABLES:
        targets = {
            t
            for (t,) in _rows(
                "SELECT confrelid::regclass::text FROM pg_constraint WHERE contype = 'f' AND conrelid = %s::regclass",
                [table],
            )
        }
        assert targets <= set(TENANT_TABLES) | REFERENCE_TABLES, table


def test_the_rules_fail_on_a_table_that_breaks_them() -> None:
    """A new tenant table with a single-column primary key, a unique index and a foreign key to the
    wallets that leave the tenant out, a nullable tenant and a 32-bit serial breaks every rule."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE TABLE shard_probe (
                probe_id text PRIMARY KEY,
                tenant_id text,
                counter serial,
                wallet_id varchar(40),
                key text
            );
            CREATE UNIQUE INDEX shard_probe_key ON shard_probe (wallet_id, key);
            CREATE UNIQUE INDEX shard_probe_tenant_included ON shard_probe (wallet_id) INCLUDE (tenant_id);
            ALTER TABLE billing_wallet ADD CONSTRAINT shard_probe_wallet_id UNIQUE (wallet_id);
            ALTER TABLE shard_probe ADD CONSTRAINT shard_probe_wallet
                FOREIGN KEY (wallet_id) REFERENCES billing_wallet (wallet_id);
            """
        )
    problems = shard_problems({**TENANT_TABLES, "shard_probe": "tenant_id"})
    assert sorted(problems) == sorted(
        [
            "billing_wallet: unique index shard_probe_wallet_id lacks tenant_id",
            "shard_probe: tenant_id is nullable",
            "shard_probe: primary key shard_probe_pkey lacks tenant_id",
            "shard_probe: unique index shard_probe_key lacks tenant_id",
            "shard_probe: unique index shard_probe_tenant_included lacks tenant_id",
            "shard_probe: foreign key shard_probe_wallet to billing_wallet does not match tenant_id to tenant_id",
            "shard_probe: sequence-backed column counter is integer",
        ]
    )
    assert "shard_probe" not in TENANT_TABLES
    assert public_tables() - {*TENANT_TABLES, *REFERENCE_TABLES, *LOCAL_TABLES} == {"shard_probe"}


def test_a_tenant_list_that_names_a_table_wrongly_fails() -> None:
    """The audit events are keyed by their chain; checked by tenant_id (nullable there) they fail."""
    assert "audit_event: tenant_id is nullable" in shard_problems({"audit_event": "tenant_id"})


def _two_tenants_agents() -> tuple[Wallet, Wallet]:
    mine = make_wallet(make_sponsor("mine"), "agent")
    theirs = make_wallet(make_sponsor("theirs"), "agent")
    assert mine.tenant_id != theirs.tenant_id
    return mine, theirs


def _immediately(sql: str, params: Sequence[Any]) -> None:
    """Run ``sql`` in a savepoint with the deferred foreign keys checked at once."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(sql, params)


def _refused(constraint: str, sql: str, params: Sequence[Any]) -> None:
    with pytest.raises(IntegrityError, match=constraint):
        _immediately(sql, params)


def test_a_wallet_under_another_tenants_wallet_is_refused() -> None:
    mine, theirs = _two_tenants_agents()
    _refused(
        "billing_wallet_parent_id_tenant_fk",
        "UPDATE billing_wallet SET parent_id = %s WHERE wallet_id = %s",
        [theirs.parent_id, mine.wallet_id],
    )
    mine.refresh_from_db()
    assert mine.parent_id != theirs.parent_id


def test_a_row_naming_another_tenants_wallet_is_refused() -> None:
    """Rows of tenant A that name tenant B's wallet, written past the services: PostgreSQL refuses them."""
    mine, theirs = _two_tenants_agents()
    now = timezone.now()
    _refused(
        "billing_spend_bucket_wallet_id_tenant_fk",
        "INSERT INTO billing_spend_bucket (wallet_id, tenant_id, hour, amount) VALUES (%s, %s, %s, 1)",
        [theirs.wallet_id, mine.tenant_id, now],
    )
    quote = Quote(
        quote_id="quo_probe",
        tenant_id=mine.tenant_id,
        wallet=theirs,
        tool="t",
        quoted_credits=1,
        created_at=now,
        expires_at=now,
        signed_statement={},
        signature="x",
        key_id="k",
    )
    with transaction.atomic():
        _immediately("SELECT 1", [])  # deferred checks on for the savepoint's statements
        with pytest.raises(IntegrityError, match="permits_quote_wallet_id_tenant_fk"), transaction.atomic():
            quote.save(force_insert=True)
    # The same rows in the wallet's own tenant are accepted.
    _immediately(
        "INSERT INTO billing_spend_bucket (wallet_id, tenant_id, hour, amount) VALUES (%s, %s, %s, 1)",
        [theirs.wallet_id, theirs.tenant_id, now],
    )


def test_the_approval_lock_key_derives_from_the_tenant() -> None:
    """The advisory lock is (lock class, hashtext(tenant id)): one tenant's, in the two-int key space."""
    with transaction.atomic():
        approval_lock("spn_shardprobe", shared=False)
        held = _rows(
            "SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks "
            "WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        (expected,) = _rows("SELECT hashtext('spn_shardprobe')::bigint & 4294967295")
    assert held == [(APPROVAL_LOCK_CLASS, expected[0], 2)]


# The schema before the tenant-scoped keys: each app's migration before its first shard-keys migration.
BEFORE_SHARD_KEYS = [
    ("audit", "0008_event_immutable_from_sql_file"),
    ("billing", "0023_login_throttle_moves_to_access"),
    ("permits", "0010_policy_change_proposal"),
    ("receipts", "0005_reconciliation_reason_without_actor"),
    ("mcpgateway", "0018_tool_input_schema_problem"),
]


@pytest.mark.django_db(transaction=True)
def test_a_database_with_rows_migrates_to_the_tenant_scoped_keys() -> None:
    """The schema before the migrations breaks the rules 56 times; a database holding wallets, ledger
    entries, keys, spend buckets and audit events migrates forward with its rows and then keeps them."""
    graph = MigrationExecutor(connection).loader.graph
    try:
        MigrationExecutor(connection).migrate(BEFORE_SHARD_KEYS)
        # The tables that exist at that point (tenant tables added later are created with their keys).
        existing = [t for t in TENANT_TABLES if _rows("SELECT to_regclass(%s) IS NOT NULL", [t])[0][0]]
        before = shard_problems({t: TENANT_TABLES[t] for t in existing})
        keys = [p for p in before if " foreign key " not in p]
        # 18 primary keys and 12 unique keys leave the tenant out (the API keys' primary key, the 31st,
        # is a reference table's), and 26 single-column foreign keys join tenant tables.
        assert (len(keys), len(before) - len(keys)) == (30, 26)
        assert "billing_wallet: primary key billing_wallet_pkey lacks tenant_id" in before
        assert "mcpgateway_action: unique index action_wallet_idempotency_unique lacks tenant_id" in before
        assert any(p.startswith("billing_ledger_entry: foreign key") for p in before)
        sponsor = make_sponsor("before", balance=10)
        agent = make_wallet(sponsor, "agent", balance=5)
        make_key(agent)
        SpendBucket.objects.create(wallet=agent, tenant_id=agent.tenant_id, hour=timezone.now(), amount=1)
        counts = {table: _rows(f"SELECT count(*) FROM {table}")[0][0] for table in existing}
        assert counts["billing_ledger_entry"] > 0
        assert counts["audit_event"] > 0
        MigrationExecutor(connection).migrate(graph.leaf_nodes())
        assert shard_problems(TENANT_TABLES) == []
        assert {table: _rows(f"SELECT count(*) FROM {table}")[0][0] for table in existing} == counts
    finally:
        MigrationExecutor(connection).migrate(graph.leaf_nodes())
