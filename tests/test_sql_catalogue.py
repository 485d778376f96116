"""The SQL core in one place: every ``<app>/sql/*.sql`` file, the migrations that apply it, and the database.

A file changes with a migration that records its new hash (docs/decisions.md, Foundation, "A SQL file
changes with a migration"); the test database, migrated from scratch, holds exactly the files' functions
and triggers. Each check is also shown failing on a file changed without a migration and on a database
whose functions are not the files'.
"""

from __future__ import annotations

import hashlib
import shutil
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from common import sqlfiles
from common.sqlfiles import RunSqlFile, SqlFile, SqlFileChanged

INVARIANT_TRIGGERS = {
    ("audit", "audit_event_immutable"): ("audit_event_immutable", "audit_event"),
    ("billing", "billing_ledger_entry_immutable"): ("billing_ledger_entry_immutable", "billing_ledger_entry"),
    ("billing", "billing_ledger_transaction_balanced"): ("billing_ledger_transaction_balanced", "billing_ledger_entry"),
}


def records_of(app_label: str, name: str) -> list[sqlfiles.SqlFileRecord]:
    return [r for r in sqlfiles.sql_file_records() if (r.app_label, r.name) == (app_label, name)]


def edit_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, app_label: str, name: str, change) -> None:
    """Edit a copy of one SQL file; ``common.sqlfiles`` reads the copy instead of the file."""
    real = sqlfiles.sql_file_path
    copy = tmp_path / app_label / "sql" / f"{name}.sql"
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(real(app_label, name), copy)
    copy.write_text(change(copy.read_text(encoding="utf-8")), encoding="utf-8")
    monkeypatch.setattr(sqlfiles, "sql_file_path", lambda a, n: copy if (a, n) == (app_label, name) else real(a, n))


@pytest.fixture
def edited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return lambda app_label, name, change: edit_copy(tmp_path, monkeypatch, app_label, name, change)


# The files and the migrations


def test_every_sql_file_is_applied_by_a_migration_that_records_its_current_hash():
    for file in sqlfiles.sql_files():
        assert file.sha256() in {r.sha256 for r in records_of(file.app_label, file.name)}, file.label


def test_the_latest_migration_applying_each_file_records_the_file_as_it_is():
    for file in sqlfiles.sql_files():
        latest = [r for r in records_of(file.app_label, file.name) if r.latest]
        assert [r.sha256 for r in latest] == [file.sha256()], file.label
    assert sqlfiles.sql_catalogue_problems() == []


def test_the_hash_is_the_sha256sum_of_the_file():
    file = SqlFile("billing", "billing_debit")
    path = Path(__file__).resolve().parent.parent / "billing" / "sql" / "billing_debit.sql"
    assert file.sha256() == hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_file_defines_functions_or_triggers_and_no_function_is_in_two_files():
    files = sqlfiles.sql_files()
    assert {(f.app_label, f.name) for f in files} >= set(INVARIANT_TRIGGERS)
    names = Counter(function for file in files for function in file.function_statements())
    assert [n for n, count in names.items() if count > 1] == []
    for file in files:
        assert file.function_statements(), file.label
        assert file.text().startswith("-- "), f"{file.label} starts with a header saying what it guarantees"


def test_the_invariant_triggers_live_in_files():
    for (app_label, name), trigger in INVARIANT_TRIGGERS.items():
        file = SqlFile(app_label, name)
        assert list(file.function_statements()) == [name]
        assert list(file.trigger_statements()) == [trigger]


def test_a_file_changed_without_a_migration_is_reported(edited):
    edited("billing", "billing_debit", lambda text: text.replace("LANGUAGE plpgsql", "LANGUAGE plpgsql  ", 1))
    problems = sqlfiles.sql_catalogue_problems()
    assert len(problems) == 1
    assert problems[0].startswith("billing/sql/billing_debit.sql changed without a migration")
    assert 'run_sql_file("billing", "billing_debit", sha256="' in problems[0]


def test_a_comment_is_a_change_too(edited):
    edited("audit", "audit_event_immutable", lambda text: "-- reviewed\n" + text)
    assert [p.split(":")[0] for p in sqlfiles.sql_catalogue_problems()] == [
        "audit/sql/audit_event_immutable.sql changed without a migration"
    ]


# Migrating


def test_the_latest_migration_applies_the_file_it_records():
    (latest,) = [r for r in records_of("billing", "billing_debit") if r.latest]
    sql = RunSqlFile("billing", "billing_debit", sha256=latest.sha256).forwards_sql()
    assert sql is not None
    assert sql.endswith(SqlFile("billing", "billing_debit").text())
    assert sql.startswith("SET LOCAL check_function_bodies = off;")


def test_an_older_migration_whose_body_is_gone_applies_nothing():
    older = [r for r in records_of("billing", "billing_debit") if not r.latest]
    assert older, "billing_debit was applied by several migrations"
    for record in older:
        assert record.sha256 != SqlFile("billing", "billing_debit").sha256()
        assert RunSqlFile("billing", "billing_debit", sha256=record.sha256).forwards_sql() is None


def test_migrating_a_file_changed_without_a_migration_fails(edited):
    edited("mcpgateway", "gateway_claim", lambda text: text + "\n-- one more line\n")
    for record in records_of("mcpgateway", "gateway_claim"):
        with pytest.raises(SqlFileChanged, match=r"^mcpgateway/sql/gateway_claim.sql changed without a migration"):
            RunSqlFile("mcpgateway", "gateway_claim", sha256=record.sha256).forwards_sql()


@pytest.mark.django_db(transaction=True)
def test_migrating_applies_the_file_and_refuses_one_changed_without_a_migration(tmp_path):
    """The latest migration of a trigger's file run again on this database, as a deployment migrates."""
    name = "billing_ledger_entry_immutable"
    (latest,) = [r for r in records_of("billing", name) if r.latest]
    graph = MigrationExecutor(connection).loader.graph
    (before,) = [p.key for p in graph.node_map[latest.migration].parents if p.key[0] == "billing"]
    try:
        MigrationExecutor(connection).migrate([before])
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE billing_ledger_entry DISABLE TRIGGER {name}")
        with pytest.MonkeyPatch.context() as monkeypatch:
            edit_copy(tmp_path, monkeypatch, "billing", name, lambda text: text.replace("(%", "(!%"))
            with pytest.raises(SqlFileChanged, match=rf"^billing/sql/{name}\.sql changed without a migration"):
                MigrationExecutor(connection).migrate([latest.migration])
        assert sqlfiles.sql_database_differences(connection) == [
            f"billing/sql/{name}.sql: trigger {name} on billing_ledger_entry is disabled (D)"
        ]
        # Expectations follow the migration state: the approvals' table (permits 0015) is not created yet, so
        # its log trigger is not expected; a trigger whose table the applied migrations created still is.
        assert "permits_permit_approval" not in sqlfiles.migration_state_tables(connection)
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER tlog_leaf_permit ON permits_permit")
        assert sqlfiles.sql_database_differences(connection) == [
            "tlog/sql/tlog_leaf_pending.sql: trigger tlog_leaf_permit on permits_permit is not in the database",
            f"billing/sql/{name}.sql: trigger {name} on billing_ledger_entry is disabled (D)",
        ]
    finally:
        MigrationExecutor(connection).migrate(graph.leaf_nodes())
    assert sqlfiles.sql_database_differences(connection) == []


# The database


@pytest.mark.django_db
def test_the_database_has_exactly_the_files_functions_and_triggers():
    assert sqlfiles.sql_database_differences(connection) == []


@pytest.mark.django_db
def test_a_function_body_that_is_not_the_files_is_reported():
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION billing_ledger_entry_immutable() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN RETURN OLD; END; $$"
        )
    assert sqlfiles.sql_database_differences(connection) == [
        "billing/sql/billing_ledger_entry_immutable.sql: function billing_ledger_entry_immutable in the database"
        " is not the file's"
    ]


@pytest.mark.django_db
def test_a_file_edited_after_migrating_is_reported(edited):
    edited("permits", "permits_reserve", lambda text: text.replace("SELECT EXISTS", "SELECT  EXISTS"))
    assert sqlfiles.sql_database_differences(connection) == [
        "permits/sql/permits_reserve.sql: function permits_reserve in the database is not the file's"
    ]


@pytest.mark.django_db
def test_a_stale_signature_and_an_orphan_function_are_reported():
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION permits_reserve(p_permit_id text) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$"
        )
        cursor.execute("CREATE FUNCTION tollgate_orphan() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")
    assert sqlfiles.sql_database_differences(connection) == [
        "permits/sql/permits_reserve.sql: function permits_reserve has 2 signatures in the database",
        "function tollgate_orphan is in the database but in no <app>/sql/ file",
    ]


@pytest.mark.django_db
def test_a_missing_disabled_or_different_trigger_is_reported():
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER audit_event_immutable ON audit_event")
        cursor.execute("ALTER TABLE billing_ledger_entry DISABLE TRIGGER billing_ledger_entry_immutable")
        cursor.execute("DROP TRIGGER billing_ledger_transaction_balanced ON billing_ledger_entry")
        cursor.execute(
            "CREATE CONSTRAINT TRIGGER billing_ledger_transaction_balanced AFTER INSERT ON billing_ledger_entry"
            " FOR EACH ROW EXECUTE FUNCTION billing_ledger_transaction_balanced()"
        )
    assert sqlfiles.sql_database_differences(connection) == [
        "audit/sql/audit_event_immutable.sql: trigger audit_event_immutable on audit_event is not in the database",
        "billing/sql/billing_ledger_entry_immutable.sql: trigger billing_ledger_entry_immutable on"
        " billing_ledger_entry is disabled (D)",
        "billing/sql/billing_ledger_transaction_balanced.sql: trigger billing_ledger_transaction_balanced in the"
        " database is not the file's",
    ]


@pytest.mark.django_db
def test_a_trigger_whose_table_the_migrations_created_but_the_database_lacks_is_reported():
    """The expectations come from the migration state, not from the tables the database happens to hold."""
    assert "permits_permit_approval" in sqlfiles.migration_state_tables(connection)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE permits_permit_approval CASCADE")
    assert sqlfiles.sql_database_differences(connection) == [
        "tlog/sql/tlog_leaf_pending.sql: trigger tlog_leaf_permit_approval on permits_permit_approval is not in"
        " the database"
    ]


@pytest.mark.django_db
def test_the_comparison_leaves_nothing_behind():
    sqlfiles.sql_database_differences(connection)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'sqlfiles_scratch'")
        assert cursor.fetchone() == (0,)
        cursor.execute("SHOW search_path")
        assert "sqlfiles_scratch" not in cursor.fetchone()[0]


# One posting function


def test_every_ledger_entry_is_written_by_billing_post():
    """The one posting of money (docs/decisions.md, "One posting function"): no other SQL file inserts ledger
    entries or moves a balance, and no Python module creates entries (they are built in memory from what
    the database wrote)."""
    root = Path(__file__).resolve().parent.parent
    inserting = [f.label for f in sqlfiles.sql_files() if "INSERT INTO billing_ledger_entry" in f.text()]
    assert inserting == ["billing/sql/billing_post.sql"]
    moving = [f.label for f in sqlfiles.sql_files() if "SET balance" in " ".join(f.text().split())]
    assert moving == ["billing/sql/billing_post.sql"]
    creating = [
        str(path.relative_to(root))
        for app in ("audit", "billing", "common", "config", "mcpgateway", "permits", "receipts")
        for path in (root / app).rglob("*.py")
        if "migrations" not in path.parts
        and any(
            marker in path.read_text(encoding="utf-8")
            for marker in ("LedgerEntry.objects.create", "LedgerEntry.objects.bulk_create", "billing_ledger_entry (")
        )
    ]
    assert creating == []


def test_a_retired_file_is_applied_by_none_of_its_migrations_and_may_be_gone():
    """permits_charge_policies gave way to permits_policy_verdict: billing 0029 retires it (drops its
    function), its file is gone, and the migration that applied it applies nothing."""
    app_label, name = "permits", "permits_charge_policies"
    assert (app_label, name) in sqlfiles.retired_sql_files()
    assert not sqlfiles.sql_file_path(app_label, name).exists()
    applied = records_of(app_label, name)
    assert applied
    for record in applied:
        assert RunSqlFile(app_label, name, sha256=record.sha256).forwards_sql() is None
    assert sqlfiles.sql_catalogue_problems() == []


def test_a_missing_file_that_no_migration_retires_is_reported(monkeypatch):
    monkeypatch.setattr(sqlfiles, "retired_sql_files", lambda: frozenset())
    assert sqlfiles.sql_catalogue_problems() == [
        "billing.0018_charge_honours_policies applies permits/sql/permits_charge_policies.sql, which does not exist"
    ]
