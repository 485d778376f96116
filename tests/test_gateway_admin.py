"""Operator console for the gateway: tool edits go through the service; reconciliation actions work."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from audit.models import AuditEvent
from mcpgateway.models import Action, Tool, UpstreamProbeSource
from receipts.models import RefundReconciliation
from tests.gateway_helpers import register_upstream, setup_caller
from tests.upstream_server import FaultUpstream

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser(username="ops", password="pw-ops-123456")
    client = Client()
    client.force_login(user)
    return client


def test_tool_admin_edits_through_the_service(staff):
    with FaultUpstream() as upstream:
        register_upstream(upstream.url)
    page = staff.get("/admin/mcpgateway/tool/")
    assert page.status_code == 200
    assert "echo" in page.content.decode()
    r = staff.post("/admin/mcpgateway/tool/echo/change/", {"category": "search", "enabled": ""})
    assert r.status_code == 302, r.content.decode()[:2000]
    tool = Tool.objects.get(pk="echo")
    assert tool.category == "search"
    assert tool.enabled is False
    assert AuditEvent.objects.filter(event="tool.updated", tool="echo").exists()


def two_uncertain_actions(settings: Any, tenant: Any) -> list[Action]:
    """Two governed calls whose upstream never answers in time: delivery_uncertain, the charges kept."""
    settings.UPSTREAM_READ_TIMEOUT = 0.3
    with FaultUpstream(hang_seconds=2) as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="2")
        caller = setup_caller(tenant)
        caller.rpc("hang", {}, key="u1")
        caller.rpc("hang", {}, key="u2")
    return list(Action.objects.filter(state="delivery_uncertain").order_by("created_at"))


def test_reconciliation_actions_on_uncertain_actions(staff, settings, tenant):
    first, second = two_uncertain_actions(settings, tenant)
    page = staff.get("/admin/mcpgateway/action/")
    assert page.status_code == 200
    # First an intermediate confirmation page listing the calls and their effect; nothing recorded yet.
    r = staff.post(
        "/admin/mcpgateway/action/",
        {"action": "reconciled_not_executed", "_selected_action": [first.pk]},
    )
    assert r.status_code == 200
    assert b"Record that these calls WERE NOT executed?" in r.content
    assert first.action_id.encode() in r.content
    assert not RefundReconciliation.objects.filter(receipt_id=first.receipt_id).exists()
    r = staff.post(
        "/admin/mcpgateway/action/",
        {"action": "reconciled_not_executed", "_selected_action": [first.pk], "post": "yes"},
    )
    assert r.status_code == 302
    item = RefundReconciliation.objects.get(receipt_id=first.receipt_id)
    assert item.status == "pending"
    staff.post(
        "/admin/mcpgateway/action/", {"action": "reconciled_executed", "_selected_action": [second.pk], "post": "yes"}
    )
    assert AuditEvent.objects.filter(event="reconciliation.marked_executed").count() == 1
    assert not RefundReconciliation.objects.filter(receipt_id=second.receipt_id).exists()


def test_a_reconciliation_result_is_recorded_once_and_never_contradicted(staff, settings, tenant):
    """One result per receipt: the same result again changes nothing, the other one is refused and the
    first stands (no refund after "executed", no "executed" over a refund owed), in the console and the
    services alike."""
    from receipts.models import ReconciliationResult
    from receipts.services import (
        ReconciliationDecided,
        reconciliation_record_executed,
        refund_reconciliation_mark_not_executed,
    )

    ran, did_not = two_uncertain_actions(settings, tenant)

    def act(name: str, action: Action) -> str:
        r = staff.post(
            "/admin/mcpgateway/action/", {"action": name, "_selected_action": [action.pk], "post": "yes"}, follow=True
        )
        assert r.status_code == 200
        return r.content.decode()

    act("reconciled_executed", ran)
    act("reconciled_executed", ran)  # a second click records nothing more
    refused = act("reconciled_not_executed", ran)
    assert "already reconciled the other way" in refused
    assert not RefundReconciliation.objects.filter(receipt_id=ran.receipt_id).exists()
    staff.post(
        "/admin/receipts/receipt/",
        {"action": "mark_not_executed", "_selected_action": [ran.receipt_id], "post": "yes"},
    )
    assert not RefundReconciliation.objects.filter(receipt_id=ran.receipt_id).exists()
    assert AuditEvent.objects.filter(event="reconciliation.marked_executed").count() == 1

    act("reconciled_not_executed", did_not)
    assert did_not.receipt_id is not None
    item = RefundReconciliation.objects.get(receipt_id=did_not.receipt_id)
    assert refund_reconciliation_mark_not_executed(receipt_id=did_not.receipt_id, actor="again") == item
    with pytest.raises(ReconciliationDecided) as decided:
        reconciliation_record_executed(receipt_id=did_not.receipt_id, actor="second thoughts")
    assert decided.value.extra["recorded"] == "not_executed"
    assert AuditEvent.objects.filter(event="reconciliation.marked_not_executed").count() == 1
    assert dict(ReconciliationResult.objects.values_list("receipt_id", "verdict")) == {
        ran.receipt_id: "executed",
        did_not.receipt_id: "not_executed",
    }


def _staff_with(*codenames: str, username: str = "limited") -> Client:
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(username=username, password="pw-limited-123456", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="mcpgateway", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def test_upstream_server_console_creates_sets_write_only_credentials_syncs_and_tests(staff):
    from mcpgateway.models import UpstreamCredential, UpstreamServer
    from tests.upstream_server import running_sdk_upstream

    with running_sdk_upstream("pay", tokens={"console-token"}) as pay:
        form = {
            "slug": "pay",
            "name": "Payments",
            "url": pay.url,
            "connect_timeout": "2",
            "read_timeout": "15",
            "enabled": "on",
            "default_category": "payments",
            "tool_prefix": "pay",
            "credentials_required": "on",
            "tenant_ids_text": "t1\nt2",
            "credential_kind": "bearer",
            "credential_token": "console-token",
        }
        # A credential header the gateway sets itself is refused on the form: nothing is saved.
        bad = {**form, "credential_kind": "headers", "credential_headers": "Host: evil"}
        r = staff.post("/admin/mcpgateway/upstreamserver/add/", bad)
        assert r.status_code == 200
        assert "header name &#x27;Host&#x27; is not allowed" in r.content.decode()
        assert not UpstreamServer.objects.exists()
        r = staff.post("/admin/mcpgateway/upstreamserver/add/", form)
        assert r.status_code == 302, r.content.decode()[:3000]
        server = UpstreamServer.objects.get(slug="pay")
        assert server.tenant_ids == ["t1", "t2"]
        assert UpstreamCredential.objects.filter(server=server, tenant_id=None, kind="bearer").exists()
        created = AuditEvent.objects.get(event="upstream_server.created")
        assert created.detail["actor"] == "admin:ops"
        page = staff.get(f"/admin/mcpgateway/upstreamserver/{quote(server.pk)}/change/").content.decode()
        assert "console-token" not in page  # write-only

        action = {"_selected_action": [server.pk]}
        r = staff.post("/admin/mcpgateway/upstreamserver/", {**action, "action": "test_connection"}, follow=True)
        assert "pay: reachable, protocol 2026-07-28" in r.content.decode().lower()  # the console capitalizes
        r = staff.post("/admin/mcpgateway/upstreamserver/", {**action, "action": "sync_tools"}, follow=True)
        assert "pay: added pay.charge, pay.append, pay.quick; changed none; disabled none" in r.content.decode().lower()
        assert Tool.objects.get(service_id="pay.charge").category == "payments"
        page = staff.get("/admin/mcpgateway/tool/", {"server__server_id__exact": server.pk}).content.decode()
        assert "pay.charge" in page

        # A staff user who may only view servers can test a connection but not sync or change one.
        viewer = _staff_with("view_upstreamserver")
        r = viewer.post("/admin/mcpgateway/upstreamserver/", {**action, "action": "sync_tools"})
        assert AuditEvent.objects.filter(event="tools.synced").count() == 1
        r = viewer.post(f"/admin/mcpgateway/upstreamserver/{quote(server.pk)}/change/", {**form, "enabled": ""})
        assert r.status_code == 403
        assert UpstreamServer.objects.get(pk=server.pk).enabled is True


def test_upstream_server_console_sets_the_transport_and_oauth_client_credentials_write_only(staff):
    from mcpgateway.models import UpstreamCredential, UpstreamServer

    form = {
        "slug": "ops",
        "name": "Operations",
        "url": "http://127.0.0.1:9/mcp",
        "connect_timeout": "2",
        "read_timeout": "15",
        "enabled": "on",
        "default_category": "tooling",
        "tool_prefix": "ops",
        "transport": "http_sse",
        "credential_kind": "oauth_client_credentials",
        "credential_token_url": "https://auth.example/token",
        "credential_client_id": "gw",
        "credential_client_secret": "console-client-secret",
        "credential_scope": "tools",
        "credential_resource": "https://tools.example/mcp",
    }
    bad = {**form, "credential_token_url": "auth.example/token"}
    r = staff.post("/admin/mcpgateway/upstreamserver/add/", bad)
    assert r.status_code == 200
    assert "token_url: must be the token endpoint" in r.content.decode()
    assert not UpstreamServer.objects.exists()
    r = staff.post("/admin/mcpgateway/upstreamserver/add/", form)
    assert r.status_code == 302, r.content.decode()[:3000]
    server = UpstreamServer.objects.get(slug="ops")
    assert server.transport == "http_sse"
    credential = UpstreamCredential.objects.get(server=server, tenant_id=None)
    assert credential.kind == "oauth_client_credentials"
    assert b"console-client-secret" not in bytes(credential.secret)
    page = staff.get(f"/admin/mcpgateway/upstreamserver/{quote(server.pk)}/change/").content.decode()
    assert "console-client-secret" not in page  # write-only
    assert "(server): oauth_client_credentials, set on " in page
    event = AuditEvent.objects.get(event="upstream_credential.set")
    assert event.detail["actor"] == "admin:ops"
    assert "console-client-secret" not in str(event.detail)


# --- Each upstream server's last state in the console (issue 29, item 8) ----------------------------


def _state_cell(page: str, slug: str) -> str:
    """The text of the state column in ``slug``'s row of the servers list."""
    import re

    row = re.search(rf"<tr[^>]*>(?:(?!</tr>).)*?>{slug}</a>(?:(?!</tr>).)*</tr>", page, re.S)
    assert row is not None, page[:3000]
    cell = re.search(r'<td class="field-server_state">(.*?)</td>', row.group(0), re.S)
    assert cell is not None, row.group(0)
    return re.sub(r"<[^>]+>", "", cell.group(1).replace("<br>", "; "))


def test_the_servers_list_shows_each_servers_last_probe_and_probes_nothing(staff):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from mcpgateway.services.upstreams import upstream_server_create
    from tests.test_site_health import closed_port_url

    with FaultUpstream() as live, FaultUpstream() as stopping:
        up = upstream_server_create(slug="up", name="Up", url=live.url, tool_prefix="up", actor="test")
        gone = upstream_server_create(slug="gone", name="Gone", url=stopping.url, tool_prefix="gone", actor="test")
        upstream_server_create(slug="fresh", name="Fresh", url=closed_port_url(), tool_prefix="fresh", actor="test")
        upstream_server_create(slug="off", name="Off", url=live.url, tool_prefix="off", enabled=False, actor="test")
        action = {"_selected_action": [up.pk], "action": "test_connection"}
        staff.post("/admin/mcpgateway/upstreamserver/", action, follow=True)
        stopping.__exit__(None, None, None)  # its upstream stops: the next test finds nothing there
        r = staff.post("/admin/mcpgateway/upstreamserver/", {**action, "_selected_action": [gone.pk]}, follow=True)
        assert "gone: not reachable (unreachable)" in r.content.decode().lower()
        audited = AuditEvent.objects.count()

        sent = len(live.methods())
        with CaptureQueriesContext(connection) as queries:
            page = staff.get("/admin/mcpgateway/upstreamserver/").content.decode()
        # The state comes with the servers (one join), not one query a row.
        assert not [q for q in queries.captured_queries if 'FROM "mcpgateway_upstream_server_state"' in q["sql"]]
        detail = staff.get(f"/admin/mcpgateway/upstreamserver/{quote(up.pk)}/change/").content.decode()
        assert len(live.methods()) == sent  # the list and the page show what was kept: no request upstream

    assert _state_cell(page, "up").startswith("reachable, protocol 2025-11-25; checked ")
    assert _state_cell(page, "up").endswith("(console)")
    assert _state_cell(page, "gone").startswith("unreachable (unreachable); checked ")
    assert _state_cell(page, "fresh") == "never checked"
    assert _state_cell(page, "off") == "disabled"
    assert '<span class="server-state">reachable, protocol 2025-11-25</span><br>' in detail
    assert live.url not in page.split("field-server_state", 1)[1].split("</td>", 1)[0]
    assert AuditEvent.objects.count() == audited  # showing the state writes nothing


@override_settings(UPSTREAM_STATE_READINESS_INTERVAL=0)  # each readiness call probes (bounded otherwise)
def test_readiness_and_a_sync_keep_the_state_and_the_tools_version_does_not_move(staff, anon_client):
    from django.db import connection

    from audit.services import signing_key_ensure
    from mcpgateway.models import UpstreamServerState
    from mcpgateway.services.upstreams import upstream_server_create, upstream_server_sync
    from mcpgateway.upstream.client import UpstreamError

    signing_key_ensure()
    with FaultUpstream() as upstream:
        server = upstream_server_create(slug="srv", name="Srv", url=upstream.url, tool_prefix="srv", actor="test")
        upstream_server_sync(server=server, actor="test")
        state = UpstreamServerState.objects.get(server=server)
        assert (state.reachable, state.protocol_version, state.error_class, state.checked_by) == (
            True,
            "2025-11-25",
            "",
            "sync",
        )

        def tool_version() -> str:
            with connection.cursor() as cursor:
                cursor.execute("SELECT gateway_tool_version('srv.echo')")
                return cursor.fetchone()[0]

        before, audited = tool_version(), AuditEvent.objects.count()
        assert anon_client.get("/health/ready").status_code == 200
    # Probes write the state's own row: the tools' calls are not decided again, nothing is audited.
    assert tool_version() == before
    assert AuditEvent.objects.count() == audited
    assert UpstreamServerState.objects.get(server=server).checked_by == "readiness"

    r = anon_client.get("/health/ready")  # the upstream has stopped
    assert r.status_code == 200  # not required
    page = staff.get("/admin/mcpgateway/upstreamserver/").content.decode()
    assert _state_cell(page, "srv").startswith("unreachable (unreachable); checked ")
    assert _state_cell(page, "srv").endswith("(readiness)")

    with pytest.raises(UpstreamError):
        upstream_server_sync(server=server, actor="test")
    state = UpstreamServerState.objects.get(server=server)
    assert (state.reachable, state.error_class, state.checked_by) == (False, "unreachable", "sync")


def test_an_older_probe_does_not_replace_a_newer_one_and_free_text_is_refused(db):
    from datetime import timedelta

    from django.db import IntegrityError
    from django.utils import timezone

    from mcpgateway.models import UpstreamServerState
    from mcpgateway.services.upstreams import upstream_server_create, upstream_server_state_record
    from tests.test_site_health import closed_port_url

    server = upstream_server_create(slug="srv", name="Srv", url=closed_port_url(), tool_prefix="srv", actor="test")
    now = timezone.now()
    up = {"reachable": True, "protocol_version": "2025-11-25", "error": None}
    down = {"reachable": False, "protocol_version": None, "error": "timeout"}
    upstream_server_state_record(server_id=server.pk, probe=up, checked_by=UpstreamProbeSource.CONSOLE, checked_at=now)
    upstream_server_state_record(
        server_id=server.pk, probe=down, checked_by=UpstreamProbeSource.READINESS, checked_at=now - timedelta(seconds=1)
    )
    assert UpstreamServerState.objects.get(server=server).reachable is True  # the late, older probe lost
    upstream_server_state_record(
        server_id=server.pk, probe=down, checked_by=UpstreamProbeSource.READINESS, checked_at=now
    )
    assert UpstreamServerState.objects.get(server=server).error_class == "timeout"

    leak = {"reachable": False, "protocol_version": None, "error": "db.corp: 401"}  # not an error class
    with pytest.raises(IntegrityError):
        upstream_server_state_record(server_id=server.pk, probe=leak, checked_by=UpstreamProbeSource.CONSOLE)
    assert UpstreamServerState.objects.get(server=server).error_class == "timeout"


def test_the_state_is_shown_only_to_staff_who_may_view_servers(staff):
    from mcpgateway.services.upstreams import upstream_server_create, upstream_server_state_record
    from tests.test_site_health import closed_port_url

    server = upstream_server_create(slug="srv", name="Srv", url=closed_port_url(), tool_prefix="srv", actor="test")
    probe = {"reachable": False, "protocol_version": None, "error": "auth_refused"}
    upstream_server_state_record(server_id=server.pk, probe=probe, checked_by=UpstreamProbeSource.CONSOLE)
    for client in (_staff_with("view_tool", username="tools"), _staff_with(username="none")):
        assert client.get("/admin/mcpgateway/upstreamserver/").status_code == 403
        assert client.get(f"/admin/mcpgateway/upstreamserver/{quote(server.pk)}/change/").status_code == 403
    viewer = _staff_with("view_upstreamserver")
    assert _state_cell(viewer.get("/admin/mcpgateway/upstreamserver/").content.decode(), "srv").startswith(
        "unreachable (auth_refused); checked "
    )


@pytest.mark.django_db(transaction=True)
def test_probes_recorded_at_once_keep_the_newest_without_an_error():
    """Readiness in every worker, Test connection and a sync may record the same server at once: the
    upsert neither fails on the row another one is inserting nor lets an older probe win."""
    import threading
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from mcpgateway.models import UpstreamServerState
    from mcpgateway.services.upstreams import upstream_server_create, upstream_server_state_record
    from tests.test_site_health import closed_port_url

    server = upstream_server_create(slug="srv", name="Srv", url=closed_port_url(), tool_prefix="srv", actor="test")
    start, newest = timezone.now(), 7
    barrier, errors = threading.Barrier(8), []

    def record(i: int) -> None:
        probe = (
            {"reachable": True, "protocol_version": "2025-11-25", "error": None}
            if i == newest
            else {"reachable": False, "protocol_version": None, "error": "timeout"}
        )
        try:
            barrier.wait(10)
            upstream_server_state_record(
                server_id=server.pk,
                probe=probe,
                checked_by=UpstreamProbeSource.READINESS,
                checked_at=start + timedelta(seconds=i),
            )
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=record, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    state = UpstreamServerState.objects.get(server=server)
    assert (state.reachable, state.checked_at) == (True, start + timedelta(seconds=newest))


def test_a_refused_row_is_named_and_the_others_counted(staff, settings, tenant):
    """The console's per-row loop (``common.console.console_each``): a row the service refuses is said as
    ``<id>: <message>`` and left out of the count; the action's summary counts the rows done."""
    ran, did_not = two_uncertain_actions(settings, tenant)

    def messages_of(url: str, action: str, *selected: Any) -> list[tuple[str, str]]:
        r = staff.post(url, {"action": action, "_selected_action": list(selected), "post": "yes"}, follow=True)
        assert r.status_code == 200
        return [(m.level_tag, m.message) for m in r.context["messages"]]

    actions = "/admin/mcpgateway/action/"
    assert messages_of(actions, "reconciled_executed", ran.pk) == [
        ("success", "1 delivery_uncertain action(s) recorded as executed.")
    ]
    decided = "This call was already reconciled the other way; nothing was changed."
    assert messages_of(actions, "reconciled_not_executed", ran.pk, did_not.pk) == [
        ("error", f"{ran.action_id}: {decided}"),
        ("success", "1 action(s) marked not executed: retry their refunds under Refund reconciliations."),
    ]
    assert messages_of("/admin/receipts/receipt/", "mark_not_executed", ran.receipt_id) == [
        ("error", f"{ran.receipt_id}: {decided}"),
        ("info", "0 receipt(s) marked not executed; retry their refunds under reconciliation."),
    ]
    item = RefundReconciliation.objects.get(receipt_id=did_not.receipt_id)
    assert messages_of("/admin/receipts/refundreconciliation/", "retry_selected", item.pk) == [
        ("info", "1 of 1 item(s) resolved.")
    ]
    assert LogEntry.objects.filter(object_id=str(item.pk)).get().change_message == "Retried the owed refund: resolved"
