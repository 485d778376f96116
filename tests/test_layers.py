"""Layers that read top to bottom (docs/architecture.md, "The apps"; docs/decisions.md, Foundation).

``common`` imports no app and not ``config``; ``config`` only wires: none of its modules imports an
app when it is imported (a function may, at call time); the settings never start PostgreSQL; the
console index asks each app for its figures.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib import admin

from tests import factories

ROOT = Path(__file__).resolve().parent.parent
APPS = {entry for entry in settings.INSTALLED_APPS if "." not in entry and (ROOT / entry).is_dir()}


def _imports(node: ast.AST, *, module_level: bool) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every import under ``node``; with ``module_level``, not those in a
    function body (they run when called, not when the module is imported)."""
    for child in ast.iter_child_nodes(node):
        if module_level and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield child.lineno, alias.name.split(".")[0]
        elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
            yield child.lineno, child.module.split(".")[0]
        yield from _imports(child, module_level=module_level)


def _offenders(folder: str, forbidden: set[str], *, module_level: bool) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, package in _imports(tree, module_level=module_level):
            if package in forbidden:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {package}")
    return found


def test_the_apps_are_known():
    assert {"audit", "billing", "permits", "receipts", "mcpgateway", "publicsite", "metrics"} <= APPS


def test_common_imports_no_app_and_not_config():
    assert _offenders("common", APPS | {"config"}, module_level=False) == []


def test_config_imports_no_app_at_module_level():
    assert _offenders("config", APPS, module_level=True) == []


def test_access_imports_no_app_above_it():
    """access sits below billing (docs/architecture.md, "The apps"): what it needs of wallets billing
    registers at start-up (access.wallets), so no module of it imports billing or an app above."""
    assert (
        _offenders(
            "access", {"billing", "permits", "receipts", "mcpgateway", "publicsite", "metrics"}, module_level=False
        )
        == []
    )


def test_tlog_imports_no_app_above_it():
    """tlog sits below receipts (docs/architecture.md, "The apps"): it reads the statement tables by name
    (tlog.kinds) and imports audit and access only, so receipts can embed its proofs."""
    assert (
        _offenders(
            "tlog", {"billing", "permits", "receipts", "mcpgateway", "publicsite", "metrics"}, module_level=False
        )
        == []
    )


def test_the_walk_sees_a_module_level_import_and_skips_a_function_body():
    tree = ast.parse("import os\nfrom billing import x\nclass A:\n    import audit\ndef f():\n    import permits\n")
    assert [package for _, package in _imports(tree, module_level=True)] == ["os", "billing", "audit"]
    assert [package for _, package in _imports(tree, module_level=False)][-1] == "permits"


def test_importing_the_settings_never_starts_postgresql(tmp_path):
    """With DATABASE_URL unset and no server running, the settings point at the data directory's
    socket and start nothing (no data directory, no postmaster.pid appear)."""
    data = tmp_path / "postgres"
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update(TOLLGATE_PGDATA=str(data), DJANGO_SETTINGS_MODULE="config.settings")
    code = "import django; django.setup(); from django.conf import settings as s; print(s.DATABASES['default']['HOST'])"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(data)
    assert not (data / "postmaster.pid").exists()
    assert not (data / "PG_VERSION").exists()


def test_the_read_only_pages_share_one_read_only_admin():
    from audit.models import AuditEvent
    from billing.models import LedgerEntry
    from common.console import ReadOnlyAdmin
    from permits.models import Permit

    for model in (AuditEvent, LedgerEntry, Permit):
        assert isinstance(admin.site._registry[model], ReadOnlyAdmin)


def test_the_wsgi_application_is_billings_gateway():
    from billing.fastcharge import Gateway
    from config.wsgi import application

    assert isinstance(application, Gateway)


FIGURES = {
    "billing.view_wallet": "summary-tenants",
    "permits.view_permitrequest": "summary-pending-requests",
    "receipts.view_refundreconciliation": "summary-open-reconciliation",
    "mcpgateway.view_action": "summary-uncertain",
    "audit.view_alert": "summary-alerts",
    "audit.view_auditevent": "summary-last-verification",
}


@pytest.mark.django_db
@pytest.mark.parametrize("permission", sorted(FIGURES))
def test_each_apps_figure_shows_to_a_user_with_its_view_permission_only(permission):
    """The console index's figures come from each app's registration (common.console): a staff user
    with one view permission sees that figure and no other."""
    from tests.test_console_permissions import staff

    factories.make_sponsor("glance", balance=5)
    client, _ = staff(permission)
    page = client.get("/admin/").content.decode()
    shown = {element for element in FIGURES.values() if f'id="{element}"' in page}
    assert shown == {FIGURES[permission]}


@pytest.mark.django_db
def test_a_superuser_sees_every_apps_figure_and_a_bare_staff_user_none(django_user_model, client):
    from django.test import Client

    factories.make_sponsor("glance", balance=5)
    root = django_user_model.objects.create_superuser("root", password="pw-for-tests-only")
    client.force_login(root)
    page = client.get("/admin/").content.decode()
    assert all(f'id="{element}"' in page for element in FIGURES.values())
    bare = django_user_model.objects.create_user("bare", password="pw-for-tests-only", is_staff=True)
    other = Client()
    other.force_login(bare)
    page = other.get("/admin/").content.decode()
    assert not any(f'id="{element}"' in page for element in FIGURES.values())


def test_the_figures_registry_holds_each_app_once():
    from common import console

    apps_registered = {figures.__module__.split(".")[0] for figures in console._figures}
    assert apps_registered == {"audit", "billing", "permits", "receipts", "mcpgateway"}
    assert len(console._figures) == len(apps_registered)


@pytest.mark.django_db(transaction=True)
def test_the_sign_in_lockouts_move_to_access_with_their_rows_and_grants():
    """billing 0023 moves LoginThrottle in state only: a lockout row written before it is still there,
    and a group granted billing's ``unlock_login`` before it holds ``access.unlock_login`` after it."""
    from django.contrib.auth.models import Group, Permission
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    from access.models import LoginThrottle

    target = ("billing", "0023_login_throttle_moves_to_access")
    graph = MigrationExecutor(connection).loader.graph
    (before,) = [parent.key for parent in graph.node_map[target].parents if parent.key[0] == "billing"]
    try:
        MigrationExecutor(connection).migrate([before])
        ContentType.objects.clear_cache()
        old = ContentType.objects.get(app_label="billing", model="loginthrottle")
        group = Group.objects.create(name="unlockers")
        group.permissions.add(Permission.objects.get(content_type=old, codename="unlock_login"))
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO billing_login_throttle (scope, account_key, account_label, client, failures,"
                " updated_at, level) VALUES ('client', 'name:x', 'x', '192.0.2.1', 1, %s, 0)",
                [timezone.now()],
            )
        MigrationExecutor(connection).migrate([target])
        ContentType.objects.clear_cache()
        assert not ContentType.objects.filter(app_label="billing", model="loginthrottle").exists()
        assert list(group.permissions.values_list("content_type__app_label", "codename")) == [
            ("access", "unlock_login")
        ]
        assert LoginThrottle.objects.get().account_label == "x"
    finally:
        MigrationExecutor(connection).migrate(graph.leaf_nodes())
        ContentType.objects.clear_cache()


@pytest.mark.django_db(transaction=True)
def test_the_api_keys_move_to_access_with_their_rows_and_grants():
    """billing 0028 moves APIKey and KeyRotationLog in state only: keys and log rows written before it
    are still there (their wallet a plain id), and a group and a user granted billing's key permissions
    before it hold access's after it; reversed, they are billing's again."""
    from django.contrib.auth.models import Group, Permission, User
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from access.models import APIKey, KeyRotationLog

    sponsor = factories.make_sponsor("moving", balance=5)
    issued = factories.make_key(sponsor, name="before the move")
    target = ("billing", "0028_api_keys_move_to_access")
    graph = MigrationExecutor(connection).loader.graph
    (before,) = [parent.key for parent in graph.node_map[target].parents if parent.key[0] == "billing"]
    try:
        MigrationExecutor(connection).migrate([before])
        ContentType.objects.clear_cache()
        old_key = ContentType.objects.get(app_label="billing", model="apikey")
        old_log = ContentType.objects.get(app_label="billing", model="keyrotationlog")
        group = Group.objects.create(name="key keepers")
        group.permissions.add(
            Permission.objects.get(content_type=old_key, codename="add_apikey"),
            Permission.objects.get(content_type=old_key, codename="revoke_key"),
            Permission.objects.get(content_type=old_log, codename="view_keyrotationlog"),
        )
        user = User.objects.create_user("keeper", password="pw-for-tests-only", is_staff=True)
        user.user_permissions.add(Permission.objects.get(content_type=old_key, codename="create_operator_key"))
        MigrationExecutor(connection).migrate([target])
        ContentType.objects.clear_cache()
        assert not ContentType.objects.filter(app_label="billing", model__in=["apikey", "keyrotationlog"]).exists()
        assert sorted(group.permissions.values_list("content_type__app_label", "codename")) == [
            ("access", "add_apikey"),
            ("access", "revoke_key"),
            ("access", "view_keyrotationlog"),
        ]
        assert User.objects.get(pk=user.pk).has_perm("access.create_operator_key")
        key = APIKey.objects.get(pk=issued.key.key_id)
        assert (key.wallet_id, key.name) == (sponsor.wallet_id, "before the move")
        assert KeyRotationLog.objects.filter(wallet_id=sponsor.wallet_id, key_id=key.key_id).exists()
        MigrationExecutor(connection).migrate([before])
        ContentType.objects.clear_cache()
        assert sorted(group.permissions.values_list("content_type__app_label", "codename")) == [
            ("billing", "add_apikey"),
            ("billing", "revoke_key"),
            ("billing", "view_keyrotationlog"),
        ]
    finally:
        MigrationExecutor(connection).migrate(graph.leaf_nodes())
        ContentType.objects.clear_cache()


@pytest.mark.django_db
def test_the_operator_group_holds_the_key_permissions_under_access():
    """The console's Operator group (mcpgateway 0002 granted billing's) issues and revokes keys as
    ``access.add_apikey`` and ``access.revoke_key``; operator keys stay in no group."""
    from django.contrib.auth.models import Group

    operator = set(Group.objects.get(name="Operator").permissions.values_list("content_type__app_label", "codename"))
    assert {("access", "add_apikey"), ("access", "revoke_key"), ("access", "view_apikey")} <= operator
    assert not any(label == "billing" for label, _ in operator if _.endswith(("apikey", "_key")))
    everyone = Group.objects.filter(permissions__codename="create_operator_key")
    assert not everyone.exists()
