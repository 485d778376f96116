"""A tool whose inputSchema the gateway cannot use: found at sync, refused by name at every call, never a 500.

A dangling ``$ref`` used to make every call that reached the property a 500 on ``/mcp`` and the REST
invoke (jsonschema raised in the middle of validating). Now ``tools_sync`` compiles each inputSchema
(``mcpgateway.argschema``), stores the reason on the tool, reports it (report, audit event,
``sync_tools``' output, the console), leaves the tool out of tools/list, and every call of it is
refused with ``tool_schema_unusable`` naming the tool, before anything is accepted or charged.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from io import StringIO
from typing import Any

import httpx2
import pytest
from django.core.management import call_command
from django.db import connection
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from audit.models import AuditEvent
from billing.models import LedgerEntry, Wallet
from mcpgateway import services
from mcpgateway.models import Action, Tool
from tests import factories
from tests.conftest import Tenant, make_tenant
from tests.gateway_helpers import issue_permit, register_upstream, setup_caller
from tests.live import running_gateway
from tests.test_gateway_output_schema import BadSchemaUpstream
from tests.upstream_server import FaultUpstream

DANGLING = {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}
UNUSABLE: dict[str, tuple[Any, str]] = {
    "dangling $ref": (DANGLING, "the $ref '#/$defs/missing' does not resolve"),
    "unknown $schema": ({"$schema": "https://example.com/dialect", "type": "object"}, "is not one the gateway knows"),
    "recursive $ref": (
        {
            "type": "object",
            "$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}},
            "properties": {"x": {"$ref": "#/$defs/a"}},
        },
        "a $ref cycle that does not descend into the arguments",
    ),
    "regex RE2 cannot run": (
        {"type": "object", "properties": {"x": {"type": "string", "pattern": "^(?!admin)"}}},
        "cannot run on RE2",
    ),
    "invalid regex": ({"type": "object", "properties": {"x": {"pattern": "("}}}, "metaschema"),
    "invalid schema": ({"type": "object", "properties": {"x": {"type": "integer", "minimum": "0"}}}, "metaschema"),
}


def balance(tenant: Tenant) -> Decimal:
    return Wallet.objects.get(pk=tenant.agent.pk).balance


def charges(tenant: Tenant) -> int:
    return LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count()


@pytest.mark.django_db
@pytest.mark.parametrize("case", list(UNUSABLE))
def test_sync_finds_the_schema_and_every_call_is_refused_by_name(case: str, settings: Any, tenant: Tenant) -> None:
    schema, reason = UNUSABLE[case]
    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    settings.UPSTREAM_READ_TIMEOUT = 2
    settings.ENABLE_DOGFOOD_TOOL = False
    upstream = BadSchemaUpstream(overrides={"inputSchema": schema})
    with upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        out, err = StringIO(), StringIO()
        call_command("sync_tools", "--url", upstream.url, stdout=out, stderr=err)
        assert "  new: echo " not in out.getvalue()
        assert "not callable: echo: its inputSchema cannot be used to validate arguments (" in err.getvalue()
        assert reason in err.getvalue()
        echo = Tool.objects.get(service_id="echo")
        assert reason in echo.input_schema_problem
        assert echo.input_schema == schema  # stored as listed
        event = AuditEvent.objects.filter(event="tools.synced").order_by("-seq").first()
        assert event is not None
        assert reason in event.detail["unusable"]["echo"]
        register_upstream(upstream.url, price="2")

        caller = setup_caller(tenant)
        start = balance(tenant)
        assert "echo" not in [t["name"] for t in caller.tenant.agent_client.get("/mcp/tools").json()["items"]]
        body = caller.rpc("echo", {"x": "anything"}, key="k1").json()
        assert body["error"]["code"] == -32602, body
        data = body["error"]["data"]
        assert data["error"] == "tool_schema_unusable"
        assert data["tool"] == "echo"
        assert "'echo'" in body["error"]["message"]
        assert reason in body["error"]["message"]
        r = caller.invoke("echo", {"x": "anything"}, key="k2")
        assert r.status_code == 422, r.content
        assert r.json()["detail"]["error"] == "tool_schema_unusable"
        assert r.json()["detail"]["tool"] == "echo"

        assert balance(tenant) == start
        assert charges(tenant) == 0
        assert not Action.objects.exists()
        assert upstream.count("tools/call") == 0
        assert "result" in caller.rpc("is_error", {}).json()  # the upstream's other tools are unaffected

        # Fixed upstream: the next sync clears the reason and the tool is callable.
        upstream.overrides = {}
        report = services.tools_sync(remote_tools=upstream.tools())
        assert report.unusable == {}
        assert Tool.objects.get(service_id="echo").input_schema_problem == ""
        assert "result" in caller.rpc("echo", {"x": 1}).json()


@pytest.mark.django_db
def test_a_row_stored_before_the_check_is_refused_not_a_500(settings: Any, tenant: Tenant) -> None:
    """A row written before tools_sync checked inputSchemas (or behind its back), with the tool cached."""
    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    with FaultUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="2")
        caller = setup_caller(tenant)
        for n in range(2):  # the second call is decided on the process's cache
            assert "result" in caller.rpc("echo", {"n": n}).json()
        start, sent = balance(tenant), upstream.count("tools/call")
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE mcpgateway_tool SET input_schema = %s, input_schema_problem = '' WHERE service_id = 'echo'",
                [json.dumps(DANGLING)],
            )
        r = caller.rpc("echo", {"x": 3}, key="after-change")
        assert r.status_code != 500, r.content
        assert r.json()["error"]["data"]["error"] == "tool_schema_unusable"
        r = caller.invoke("echo", {"x": 3}, key="after-change-rest")
        assert r.status_code == 422, r.content
        assert r.json()["detail"]["error"] == "tool_schema_unusable"
        assert "echo" not in [t.service_id for t in services.tools_catalog()]
        assert caller.tenant.agent_client.get("/mcp/tools/echo").status_code == 404
        assert balance(tenant) == start
        assert not Action.objects.filter(idempotency_key__startswith="after-change").exists()
        assert upstream.count("tools/call") == sent


async def _sdk_call(url: str, key: str, permit_id: str) -> tuple[list[str], Any]:
    http = httpx2.AsyncClient(headers={"X-API-Key": key}, timeout=30)
    try:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy") as client:
            listed = [t.name for t in (await client.list_tools()).tools]
            try:
                await client.call_tool(
                    "echo",
                    {"x": "anything"},
                    meta={"permit_id": permit_id, "idempotency_key": "sdk-1"},  # type: ignore[arg-type]
                )
            except MCPError as exc:
                return listed, exc.error
            return listed, None
    finally:
        await http.aclose()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_official_sdk_client_gets_the_refusal_on_mcp(tmp_path: Any) -> None:
    with BadSchemaUpstream(overrides={"inputSchema": DANGLING}) as upstream:
        register_upstream(upstream.url, price="2")
        tenant = make_tenant("sdk-unusable")
        factories.top_up(tenant.agent, 10)
        permit_id = issue_permit(tenant, max_credits="5")
        with running_gateway(tmp_path, UPSTREAM_MCP_URL=upstream.url) as gw:
            listed, error = asyncio.run(_sdk_call(gw.url, tenant.agent_secret, permit_id))
        assert "echo" not in listed
        assert "is_error" in listed
        assert error is not None
        assert error.code == -32602
        assert error.data["error"] == "tool_schema_unusable"
        assert error.data["tool"] == "echo"
        assert "does not resolve" in error.message
        assert not Action.objects.exists()
        assert upstream.count("tools/call") == 0


@pytest.mark.django_db
def test_the_console_tool_page_shows_the_reason_to_a_staff_user_who_may_view_tools(settings: Any) -> None:
    from tests.test_console_permissions import staff

    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    with BadSchemaUpstream(overrides={"inputSchema": DANGLING}) as upstream:
        register_upstream(upstream.url, price="2")
    client, _ = staff("mcpgateway.view_tool")
    page = client.get("/admin/mcpgateway/tool/echo/change/")
    assert page.status_code == 200
    assert "the $ref &#x27;#/$defs/missing&#x27; does not resolve" in page.content.decode()
    listing = client.get("/admin/mcpgateway/tool/").content.decode()
    assert "inputschema usable" in listing.lower()
    # Viewing is all the permission allows: the reason is the sync's, not the console's, to change.
    r = client.post("/admin/mcpgateway/tool/echo/change/", {"category": "search", "enabled": "on"})
    assert r.status_code == 403
    assert Tool.objects.get(service_id="echo").input_schema_problem


@pytest.mark.django_db
def test_the_arguments_are_validated_once_per_call(settings: Any, tenant: Tenant, monkeypatch: Any) -> None:
    """Once on the fresh path, and once when a call decided on the cache is decided again on fresh rows."""
    from mcpgateway.argschema import ArgumentsSchema

    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    with BadSchemaUpstream(overrides={"inputSchema": schema}) as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="2")
        caller = setup_caller(tenant)
        calls = []
        original = ArgumentsSchema.check

        def counted(self: Any, arguments: Any, **limits: Any) -> Any:
            calls.append(arguments)
            return original(self, arguments, **limits)

        monkeypatch.setattr(ArgumentsSchema, "check", counted)
        attempts: list[dict[str, Any]] = [{"n": "x"}, {"n": 1}, {"n": 2}, {"n": "y"}]
        for n, arguments in enumerate(attempts):  # fresh, fresh, cached, cached
            caller.rpc("echo", arguments, key=f"once-{n}")
            assert len(calls) == n + 1, calls
        assert Action.objects.filter(idempotency_key__startswith="once-").count() == 2
