"""The tool catalog (manifest, paginated list, detail) and the gateway's management commands."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from io import StringIO
from typing import Any, TypeVar

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from rest_framework.test import APIClient

from audit.models import Alert, AuditEvent
from billing.models import Wallet
from billing.selectors import tool_price
from billing.services import tool_price_set
from mcpgateway import services
from mcpgateway.models import Action, Tool
from receipts.models import Receipt
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import setup_caller
from tests.upstream_server import FAULT_TOOLS, FaultUpstream, free_port

pytestmark = pytest.mark.django_db

T = TypeVar("T")
CATALOGS = ("/mcp/tools.json", "/.well-known/mcp/tools.json", "/mcp/tools")


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[FaultUpstream]:
    with FaultUpstream(hang_seconds=2) as server:
        yield server


@pytest.fixture
def registered(settings: Any, upstream_server: FaultUpstream) -> list[str]:
    """The scripted upstream's tools registered; every tool priced at 2 except ``hang`` (no price)."""
    settings.UPSTREAM_MCP_URL = upstream_server.url
    settings.ENABLE_DOGFOOD_TOOL = False
    settings.TOOL_CATALOG_REQUIRES_KEY = False
    tools = upstream_server.tools()
    services.tools_sync(remote_tools=tools)
    for spec in tools:
        if spec["name"] != "hang":
            tool_price_set(tool=spec["name"], credits=Decimal(2))
    return sorted(t["name"] for t in tools)


def wait_for(probe: Callable[[], T | None], seconds: float = 10.0) -> T:
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def mcp_tools_list(client: APIClient, path: str = "/mcp/public") -> list[dict[str, Any]]:
    r = client.post(path, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, format="json")
    assert r.status_code == 200, r.content
    return list(r.json()["result"]["tools"])


# --- G. Catalog ---------------------------------------------------------------------------------------


def test_manifest_mirrors_tools_list(registered):
    anon = APIClient()
    r = anon.get("/mcp/tools.json")
    assert r.status_code == 200
    manifest = r.json()
    assert manifest["name"] == "Tollgate"
    assert manifest["version"] == "1.3.0"
    assert manifest["mcp_endpoint"] == "/mcp"
    names = [t["name"] for t in manifest["tools"]]
    assert names == registered
    assert names == [t["name"] for t in mcp_tools_list(anon)]
    assert manifest["tools"] == mcp_tools_list(anon)

    echo = next(t for t in manifest["tools"] if t["name"] == "echo")
    assert echo["inputSchema"] == {"type": "object"}
    assert echo["outputSchema"]["required"] == ["echo"]
    assert echo["description"] == "fault tool echo"
    meta = echo["_meta"]
    assert meta["io.tollgate/service-id"] == "echo"
    assert meta["io.tollgate/category"] == "tooling"
    assert meta["io.tollgate/price-credits"] == "2.00000000"
    assert meta["io.tollgate/callable"] is True
    hang = next(t for t in manifest["tools"] if t["name"] == "hang")
    assert hang["_meta"]["io.tollgate/price-credits"] is None
    assert hang["_meta"]["io.tollgate/callable"] is False

    well_known = anon.get("/.well-known/mcp/tools.json")
    assert well_known.status_code == 200
    assert well_known.json() == manifest


def test_manifest_matches_tools_list_for_a_key_holder(registered, tenant):
    client = tenant.agent_client
    manifest = client.get("/mcp/tools.json").json()
    assert [t["name"] for t in manifest["tools"]] == [t["name"] for t in mcp_tools_list(client, "/mcp/messages")]


def test_category_filter(registered):
    Tool.objects.filter(service_id__in=["echo", "garbage"]).update(category="data")
    anon = APIClient()
    for path in CATALOGS:
        r = anon.get(path, {"category": "data"})
        assert r.status_code == 200, path
        body = r.json()
        items = body["tools"] if "tools" in body else body["items"]
        assert [t["name"] for t in items] == ["echo", "garbage"], path
        assert all(t["_meta"]["io.tollgate/category"] == "data" for t in items)
        assert anon.get(path, {"category": "payments"}).json().get("total", 0) == 0
        bad = anon.get(path, {"category": "bogus"})
        assert bad.status_code == 422, path
        assert bad.json()["detail"][0]["loc"][-1] == "category"
    assert anon.get("/mcp/tools", {"category": "data"}).json()["total"] == 2
    assert anon.get("/mcp/tools.json", {"category": "payments"}).json()["tools"] == []


def test_paginated_tool_list(registered):
    anon = APIClient()
    r = anon.get("/mcp/tools")
    assert r.status_code == 200
    page = r.json()
    assert page["limit"] == 100
    assert page["offset"] == 0
    assert page["total"] == len(FAULT_TOOLS)
    assert [t["name"] for t in page["items"]] == registered
    assert all("inputSchema" in t for t in page["items"])

    page = anon.get("/mcp/tools", {"limit": 5, "offset": 5}).json()
    assert [t["name"] for t in page["items"]] == registered[5:10]
    assert (page["limit"], page["offset"], page["total"]) == (5, 5, len(FAULT_TOOLS))
    tail = anon.get("/mcp/tools", {"limit": 500, "offset": len(registered) - 1}).json()
    assert [t["name"] for t in tail["items"]] == registered[-1:]
    assert anon.get("/mcp/tools", {"offset": 1000}).json()["items"] == []
    assert anon.get("/mcp/tools", {"limit": 1}).json()["items"][0]["name"] == registered[0]

    for query in ({"limit": 0}, {"limit": 501}, {"offset": -1}, {"limit": "x"}):
        bad = anon.get("/mcp/tools", query)
        assert bad.status_code == 422, query
        assert bad.json()["detail"][0]["loc"][-1] == next(iter(query)), query


def test_tool_detail(registered):
    anon = APIClient()
    r = anon.get("/mcp/tools/echo")
    assert r.status_code == 200
    definition = r.json()
    listed = next(t for t in mcp_tools_list(anon) if t["name"] == "echo")
    assert definition == listed
    assert definition["outputSchema"]["properties"] == {"echo": {"type": "object"}}

    missing = anon.get("/mcp/tools/no.such.tool")
    assert missing.status_code == 404
    assert missing.json()["detail"]["error"] == "not_found"


def test_a_disabled_tool_disappears(registered, tenant):
    Tool.objects.filter(service_id="echo").update(enabled=False)
    anon = APIClient()
    assert "echo" not in [t["name"] for t in anon.get("/mcp/tools.json").json()["tools"]]
    assert "echo" not in [t["name"] for t in anon.get("/.well-known/mcp/tools.json").json()["tools"]]
    page = anon.get("/mcp/tools").json()
    assert "echo" not in [t["name"] for t in page["items"]]
    assert page["total"] == len(FAULT_TOOLS) - 1
    assert anon.get("/mcp/tools/echo").status_code == 404
    assert "echo" not in [t["name"] for t in mcp_tools_list(tenant.agent_client, "/mcp/messages")]


def test_the_dogfood_tool_is_listed_only_with_its_flag(registered, settings):
    settings.ENABLE_DOGFOOD_TOOL = True
    services.dogfood_tool_register()
    anon = APIClient()
    tools = {t["name"]: t for t in anon.get("/mcp/tools.json").json()["tools"]}
    assert tools[services.DOGFOOD_TOOL]["_meta"]["io.tollgate/source"] == "local"
    assert tools[services.DOGFOOD_TOOL]["inputSchema"]["required"] == ["text"]
    assert anon.get(f"/mcp/tools/{services.DOGFOOD_TOOL}").status_code == 200
    settings.ENABLE_DOGFOOD_TOOL = False
    assert services.DOGFOOD_TOOL not in {t["name"] for t in anon.get("/mcp/tools.json").json()["tools"]}
    assert anon.get(f"/mcp/tools/{services.DOGFOOD_TOOL}").status_code == 404


def test_catalogs_can_require_a_key(registered, settings, tenant):
    settings.TOOL_CATALOG_REQUIRES_KEY = True
    anon = APIClient()
    for path in (*CATALOGS, "/mcp/tools/echo"):
        r = anon.get(path)
        assert r.status_code == 401, path
        assert r.json()["detail"]["error"] == "not_authenticated"
        assert "WWW-Authenticate" in r
        assert tenant.agent_client.get(path).status_code == 200, path


def test_a_bad_key_is_refused_even_on_public_catalogs(registered):
    bad = client_for("tg_not_a_real_key_0000000000000000")
    for path in (*CATALOGS, "/mcp/tools/echo"):
        r = bad.get(path)
        assert r.status_code == 401, path
        assert r.json()["detail"]["error"] == "invalid_api_key"


# --- H. Management commands ------------------------------------------------------------------------------


def test_sync_tools_registers_and_disables(settings, monkeypatch):
    settings.ENABLE_DOGFOOD_TOOL = False
    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    with FaultUpstream() as upstream:
        out = StringIO()
        call_command("sync_tools", "--url", upstream.url, stdout=out)
        text = out.getvalue()
        assert f"{len(FAULT_TOOLS)} tool(s) from {upstream.url}: {len(FAULT_TOOLS)} new, 0 updated, 0 disabled" in text
        for name in FAULT_TOOLS:
            assert f"  new: {name} (no price yet" in text
        assert set(Tool.objects.filter(enabled=True).values_list("service_id", flat=True)) == set(FAULT_TOOLS)
        assert tool_price("echo") is None  # a new tool has no price
        echo = Tool.objects.get(service_id="echo")
        assert echo.output_schema is not None
        assert echo.synced_at is not None
        assert AuditEvent.objects.filter(event="tools.synced").count() == 1

        tool_price_set(tool="echo", credits=Decimal(3))
        remaining = [t for t in upstream.tools() if t["name"] != "echo"]
        monkeypatch.setattr(upstream, "tools", lambda: remaining)
        out = StringIO()
        call_command("sync_tools", "--url", upstream.url, stdout=out)
        assert f"0 new, {len(FAULT_TOOLS) - 1} updated, 1 disabled" in out.getvalue()
        assert "new:" not in out.getvalue()
        assert Tool.objects.get(service_id="echo").enabled is False
        assert Tool.objects.filter(enabled=True).count() == len(FAULT_TOOLS) - 1
        assert services.tool_get("echo") is None
        event = AuditEvent.objects.filter(event="tools.synced").order_by("-seq").first()
        assert event is not None
        assert event.detail["disabled"] == ["echo"]

        # Back upstream: enabled again, its price untouched.
        monkeypatch.undo()
        call_command("sync_tools", "--url", upstream.url, stdout=StringIO())
        assert Tool.objects.get(service_id="echo").enabled is True
        assert tool_price("echo") == 3


def test_sync_tools_uses_the_configured_upstream_and_registers_the_dogfood_tool(settings):
    settings.ENABLE_DOGFOOD_TOOL = True
    with FaultUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        out = StringIO()
        call_command("sync_tools", stdout=out)
    assert f"registered local tool {services.DOGFOOD_TOOL}" in out.getvalue()
    assert Tool.objects.get(service_id=services.DOGFOOD_TOOL).source == "local"
    assert Tool.objects.filter(source="upstream").count() == len(FAULT_TOOLS)


def test_sync_tools_failures(settings):
    settings.ENABLE_DOGFOOD_TOOL = False
    settings.UPSTREAM_CONNECT_TIMEOUT = 0.5
    settings.UPSTREAM_READ_TIMEOUT = 0.5
    with pytest.raises(CommandError, match="tools/list failed"):
        call_command("sync_tools", "--url", f"http://127.0.0.1:{free_port()}/mcp", stdout=StringIO())
    settings.UPSTREAM_MCP_URL = ""
    with pytest.raises(CommandError, match="No upstream"):
        call_command("sync_tools", stdout=StringIO())
    assert not Tool.objects.exists()


def test_set_tool_price(registered):
    out = StringIO()
    call_command("set_tool_price", "echo", "0.25", stdout=out)
    assert tool_price("echo") == Decimal("0.25")
    assert "echo" in out.getvalue()
    assert APIClient().get("/mcp/tools/echo").json()["_meta"]["io.tollgate/price-credits"] == "0.25000000"
    event = AuditEvent.objects.filter(event="pricing.tool_price_set", tool="echo").order_by("-seq").first()
    assert event is not None
    assert event.detail["credits"] == "0.25000000"

    with pytest.raises(CommandError, match="Unknown tool"):
        call_command("set_tool_price", "no.such.tool", "1", stdout=StringIO())
    assert tool_price("no.such.tool") is None
    for bad in ("abc", "-1", "0.000000001"):
        with pytest.raises(CommandError):
            call_command("set_tool_price", "echo", bad, stdout=StringIO())
    assert tool_price("echo") == Decimal("0.25")

    call_command("set_tool_price", "echo", "none", stdout=StringIO())
    assert tool_price("echo") is None
    assert APIClient().get("/mcp/tools/echo").json()["_meta"]["io.tollgate/callable"] is False
    call_command("set_tool_price", "echo", "0", stdout=StringIO())
    assert tool_price("echo") == 0


@pytest.mark.parametrize("raw", ["NaN", "sNaN", "Infinity"])
def test_set_tool_price_refuses_non_finite_numbers(registered, raw):
    with pytest.raises(CommandError):
        call_command("set_tool_price", "echo", raw, stdout=StringIO())


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_sweep_dispatches_settles_a_lost_claim_without_resending(settings, tenant: Tenant):
    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    settings.UPSTREAM_READ_TIMEOUT = 5
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    with FaultUpstream(hang_seconds=30) as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        tools = upstream.tools()
        services.tools_sync(remote_tools=tools)
        tool_price_set(tool="hang", credits=Decimal(3))
        caller = setup_caller(tenant)
        start = Wallet.objects.get(pk=tenant.agent.pk).balance
        answers: dict[str, Any] = {}

        def in_flight() -> None:
            try:
                answers["first"] = caller.invoke("hang", {}, key="lost")
            finally:
                connection.close()

        thread = threading.Thread(target=in_flight)
        thread.start()
        try:
            action = wait_for(lambda: Action.objects.filter(idempotency_key="lost", state="dispatch_claimed").first())
            forwarded = f"{tenant.agent.wallet_id}:lost"
            wait_for(lambda: upstream.received[forwarded] == 1)

            # A fresh claim is younger than the default threshold: left alone.
            out = StringIO()
            call_command("sweep_dispatches", stdout=out)
            assert "delivery_uncertain" not in out.getvalue()
            assert Action.objects.get(pk=action.pk).state == "dispatch_claimed"

            out = StringIO()
            call_command("sweep_dispatches", "--older-than", "0", stdout=out)
            assert f"delivery_uncertain: {action.action_id}" in out.getvalue()
        finally:
            signal.signal(signal.SIGTERM, previous_sigterm)
            upstream.stopping.set()
            thread.join(15)
        assert not thread.is_alive()

        action.refresh_from_db()
        assert action.state == "delivery_uncertain"
        assert action.outcome == "delivery_uncertain"
        assert action.reason_code == "dispatch_lost"
        receipt = Receipt.objects.get(action_id=action.action_id)
        assert action.receipt_id == receipt.receipt_id
        assert receipt.outcome == "delivery_uncertain"
        assert receipt.credits_charged == 3
        event = AuditEvent.objects.get(event_id=receipt.audit_event_id)
        assert event.event == "tool_call.delivery_uncertain"
        assert event.detail["swept"] is True
        assert event.detail["action_id"] == action.action_id
        alerts = Alert.objects.filter(kind="delivery_uncertain", wallet_id=tenant.agent.wallet_id)
        assert alerts.count() == 1
        assert alerts.get().detail["action_id"] == action.action_id
        # The charge is kept pending reconciliation.
        assert Wallet.objects.get(pk=tenant.agent.pk).balance == start - 3

        # The in-flight request finished after the sweep: the sweep's receipt stands, nothing was re-sent.
        first = answers["first"]
        assert first.status_code == 504
        assert first.json()["receipt_id"] == receipt.receipt_id
        assert first.json()["reason_code"] == "dispatch_lost"
        replay = caller.invoke("hang", {}, key="lost")
        assert replay["Idempotent-Replayed"] == "true"
        assert replay.json()["receipt_id"] == receipt.receipt_id
        out = StringIO()
        call_command("sweep_dispatches", "--older-than", "0", stdout=out)
        assert "delivery_uncertain:" not in out.getvalue()
        signal.signal(signal.SIGTERM, previous_sigterm)
        assert Receipt.objects.filter(action_id=action.action_id).count() == 1
        assert Alert.objects.filter(kind="delivery_uncertain").count() == 1
        assert upstream.received[forwarded] == 1
        assert upstream.executed[forwarded] == 1
