"""A tool whose outputSchema is not a valid JSON Schema: never charged for a call that cannot be sent.

The upstream client refuses such a schema before it sends anything (``ValueError``). The gateway
finds it first: ``tools_sync`` stores the tool disabled and reports it, a tool with such a schema is
not callable however it got enabled (refused before anything is accepted or charged), and should a
claimed call meet one all the same, phase 2 answers ``not_sent`` and phase 3 refunds: never a 500
left for the sweeper to settle as ``delivery_uncertain`` with the charge kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from audit.models import Alert, AuditEvent
from billing.models import LedgerEntry, Wallet
from mcpgateway import services
from mcpgateway.models import Action, Tool
from mcpgateway.upstream.client import UpstreamClient
from mcpgateway.upstream.validators import output_schema_problem
from permits.models import Permit
from receipts.models import Receipt
from tests.conftest import Tenant
from tests.gateway_helpers import register_upstream, setup_caller
from tests.upstream_server import ECHO_OUTPUT_SCHEMA, FaultUpstream, free_port

pytestmark = pytest.mark.django_db

# "minimum" must be a number: the client cannot compile this schema.
BAD_OUTPUT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer", "minimum": "0"}}}


@dataclass
class BadSchemaUpstream(FaultUpstream):
    """The fault upstream, listing ``echo`` with ``overrides`` applied to its definition (tools/call unchanged)."""

    overrides: dict[str, Any] = field(default_factory=lambda: {"outputSchema": BAD_OUTPUT_SCHEMA})

    def tools(self) -> list[dict[str, Any]]:
        return [{**tool, **self.overrides} if tool["name"] == "echo" else tool for tool in super().tools()]


@pytest.fixture
def bad(settings):
    settings.UPSTREAM_READ_TIMEOUT = 2
    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    with BadSchemaUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="2")  # sync_tools, then the operator prices every tool
        yield upstream


def balance(tenant: Tenant) -> Decimal:
    return Wallet.objects.get(pk=tenant.agent.pk).balance


def charges(tenant: Tenant) -> int:
    return LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count()


@pytest.mark.parametrize(
    ("schema", "usable"),
    [
        (None, True),
        (ECHO_OUTPUT_SCHEMA, True),
        (BAD_OUTPUT_SCHEMA, False),
        ({"type": 12}, False),
        ({"type": "object", "properties": {"s": {"type": "string", "pattern": "("}}}, False),
        ({"$schema": ["not", "a", "string"]}, False),
        (5, False),
    ],
)
def test_output_schema_problem_says_what_call_tool_would_refuse(schema: Any, usable: bool) -> None:
    with UpstreamClient(f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=0.5, read_timeout=0.5) as client:
        for _ in range(2):  # the second time from the cache
            problem = output_schema_problem(schema)
            assert (problem is None) is usable, problem
            if problem is None:
                result = client.call_tool("echo", {}, idempotency_key="k", output_schema=schema)
                assert result.kind == "not_sent"  # nobody listens: refused at connect, not for the schema
            else:
                with pytest.raises(ValueError, match=r"^invalid output_schema: ") as raised:
                    client.call_tool("echo", {}, idempotency_key="k", output_schema=schema)
                assert str(raised.value) == f"invalid output_schema: {problem}"


def test_sync_stores_a_tool_with_an_invalid_output_schema_disabled_and_reports_it(settings) -> None:
    settings.ENABLE_DOGFOOD_TOOL = False
    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    upstream = BadSchemaUpstream()
    with upstream:
        out, err = StringIO(), StringIO()
        call_command("sync_tools", "--url", upstream.url, stdout=out, stderr=err)
        assert "  new: echo " not in out.getvalue()  # no "set a price" hint for it
        assert "  new: is_error " in out.getvalue()
        assert "not callable: echo: its outputSchema is not a valid JSON Schema ('0' is not of type 'number')" in (
            err.getvalue()
        )
        echo = Tool.objects.get(service_id="echo")
        assert echo.output_schema == BAD_OUTPUT_SCHEMA  # stored as listed: the console shows what is wrong
        assert echo.enabled is False
        assert Tool.objects.get(service_id="is_error").enabled is True
        event = AuditEvent.objects.filter(event="tools.synced").order_by("-seq").first()
        assert event is not None
        assert list(event.detail["invalid"]) == ["echo"]
        assert "echo" in event.detail["created"]
        assert services.tool_get("echo") is None
        assert "echo" not in [t.service_id for t in services.tools_catalog()]

        # Fixed upstream: the next sync registers it callable again.
        upstream.overrides = {}
        report = services.tools_sync(remote_tools=upstream.tools())
        assert report.invalid == {}
        assert Tool.objects.get(service_id="echo").enabled is True
        assert services.tool_get("echo") is not None


def test_a_call_to_it_is_refused_before_anything_is_accepted_or_charged(bad, tenant: Tenant) -> None:
    caller = setup_caller(tenant)
    start = balance(tenant)
    first = caller.rpc("echo", {"x": 1}, key="bad-schema")
    assert first.status_code != 500, first.content
    body = first.json()
    assert body["error"]["data"]["error"] == "unknown_tool", body
    again = caller.rpc("echo", {"x": 1}, key="bad-schema")
    assert again.status_code == first.status_code
    assert again.json()["error"] == body["error"]  # the same answer for the same key
    r = caller.invoke("echo", {"x": 1}, key="bad-schema")  # REST: not offered, so not found
    assert r.status_code == 404, r.content

    # An operator who enables it in the console does not make it callable.
    services.tool_update(service_id="echo", category="tooling", enabled=True)
    assert caller.rpc("echo", {"x": 1}, key="bad-schema").json()["error"]["data"]["error"] == "unknown_tool"

    assert balance(tenant) == start
    assert charges(tenant) == 0
    assert not Action.objects.exists()
    assert bad.count("tools/call") == 0
    assert "result" in caller.rpc("is_error", {}).json()  # the upstream's other tools are unaffected


def test_a_stored_tool_whose_output_schema_turns_invalid_is_refused_on_the_next_call(settings, tenant: Tenant) -> None:
    """A row written behind sync's back (or before it checked) while the call path has the tool cached."""
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
                "UPDATE mcpgateway_tool SET output_schema = %s WHERE service_id = 'echo'",
                [json.dumps(BAD_OUTPUT_SCHEMA)],
            )
        r = caller.rpc("echo", {"n": 3}, key="after-change")
        assert r.status_code != 500, r.content
        assert r.json()["error"]["data"]["error"] == "unknown_tool"
        assert balance(tenant) == start
        assert not Action.objects.filter(idempotency_key="after-change").exists()
        assert upstream.count("tools/call") == sent


def test_a_claimed_call_that_meets_one_is_not_sent_and_refunded(bad, tenant: Tenant, monkeypatch) -> None:
    """Phase 2's backstop: were such a tool ever claimed, the call ends ``failed_refunded``, not in a 500."""
    from mcpgateway.services import lookup

    monkeypatch.setattr(lookup, "tool_is_callable", lambda tool: tool.enabled)  # the rule before this check
    services.tool_update(service_id="echo", category="tooling", enabled=True)
    caller = setup_caller(tenant)
    start = balance(tenant)
    first = caller.rpc("echo", {"x": 1}, key="claimed")
    assert first.status_code != 500, first.content
    body = first.json()
    data = body["error"]["data"]
    assert data["outcome"] == "failed_refunded", body
    assert data["error"] == "upstream_not_sent"
    assert "outputSchema" in body["error"]["message"]
    receipt = Receipt.objects.get(receipt_id=data["receipt_id"])
    assert receipt.outcome == "failed_refunded"
    assert receipt.credits_charged == 0
    assert receipt.refund_entry is not None
    assert balance(tenant) == start
    assert Permit.objects.get(pk=caller.permit_id).spent_credits == 0
    action = Action.objects.get(idempotency_key="claimed")
    assert action.state == "completed"  # settled now, not left claimed for the sweeper
    assert action.receipt_id == receipt.receipt_id
    assert not Alert.objects.filter(kind="delivery_uncertain").exists()
    assert bad.count("tools/call") == 0

    for _ in range(3):
        again = caller.rpc("echo", {"x": 1}, key="claimed")
        assert again["Idempotent-Replayed"] == "true"
        replayed = again.json()["error"]
        assert replayed["data"].pop("replayed") is True
        assert replayed == {**body["error"], "data": {k: v for k, v in data.items() if k != "replayed"}}
    assert balance(tenant) == start
    assert charges(tenant) == 1  # the one charge, refunded
    assert bad.count("tools/call") == 0


def test_an_invalid_input_schema_is_refused_by_name_not_left_to_the_upstream(settings, tenant: Tenant) -> None:
    """The inputSchema case: the gateway cannot validate, so it refuses the call (test_gateway_input_schema.py)."""
    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    bad_input = {"type": "object", "properties": {"n": {"type": "integer", "minimum": "0"}}}
    with BadSchemaUpstream(overrides={"inputSchema": bad_input}) as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="2")
        assert Tool.objects.get(service_id="echo").enabled is True
        caller = setup_caller(tenant)
        start = balance(tenant)
        r = caller.rpc("echo", {"n": 5}, key="bad-input")
        assert r.status_code != 500, r.content
        assert r.json()["error"]["data"]["error"] == "tool_schema_unusable"
        assert balance(tenant) == start
        assert upstream.count("tools/call") == 0
