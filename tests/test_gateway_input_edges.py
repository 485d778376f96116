"""Agent-controlled strings a governed call cannot store or sign are a 4xx with nothing written, never a 500.

A lone surrogate cannot be encoded as UTF-8 (so not hashed by RFC 8785, nor stored); PostgreSQL text and
jsonb cannot hold NUL; an id longer than its column cannot be written. Each is refused before the call is
looked up: on MCP (``/mcp/messages``, ``/mcp`` with and without the stateless revision) as the JSON-RPC
invalid-params error (-32602), on the REST invoke as a 422 with a ``loc``. No action, receipt, ledger entry
or audit event is written and nothing reaches the upstream.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from audit.models import AuditEvent
from billing.models import LedgerEntry, Wallet
from common.ids import new_id
from mcpgateway.models import Action
from receipts.models import Receipt
from tests.conftest import Tenant
from tests.gateway_helpers import Caller, setup_caller
from tests.upstream_server import FaultUpstream

pytestmark = pytest.mark.django_db

STATELESS = "2026-07-28"
_ids = itertools.count(1)


@pytest.fixture
def caller(fault: FaultUpstream, tenant: Tenant) -> Caller:
    return setup_caller(tenant)


class Written:
    """What a call can write, counted before it, to assert afterwards that nothing was."""

    def __init__(self, tenant: Tenant, fault: FaultUpstream) -> None:
        self.tenant, self.fault = tenant, fault
        self.before = self.counts()

    def counts(self) -> dict[str, Any]:
        wallet_id = self.tenant.agent.wallet_id
        return {
            "actions": Action.objects.count(),
            "receipts": Receipt.objects.count(),
            "ledger": LedgerEntry.objects.filter(wallet_id=wallet_id).count(),
            "audit": AuditEvent.objects.count(),
            "balance": Wallet.objects.get(wallet_id=wallet_id).balance,
            "upstream_calls": self.fault.count("tools/call"),
        }

    def assert_nothing(self) -> None:
        assert self.counts() == self.before


# --- Sending a tools/call on each transport -----------------------------------------------------------------

MCP_TRANSPORTS = ["messages", "streamable", "stateless"]


def mcp_call(client: Any, transport: str, params: dict[str, Any], **headers: Any) -> Any:
    """POST one tools/call; the body is JSON text with ASCII escapes, so lone surrogates and NUL travel as sent."""
    if transport == "stateless":
        params = {**params, "_meta": {**params.get("_meta", {}), "io.modelcontextprotocol/protocolVersion": STATELESS}}
        headers = {"HTTP_MCP_PROTOCOL_VERSION": STATELESS, "HTTP_MCP_METHOD": "tools/call", **headers}
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call", "params": params}
    path = "/mcp/messages" if transport == "messages" else "/mcp"
    return client.generic("POST", path, json.dumps(body), content_type="application/json", **headers)


def invoke(client: Any, tool: str, body: dict[str, Any]) -> Any:
    return client.generic("POST", f"/mcp/tools/{tool}/invoke", json.dumps(body), content_type="application/json")


def call_params(caller: Caller, arguments: Any, *, name: str = "echo", **meta: Any) -> dict[str, Any]:
    meta = {"permit_id": caller.permit_id, "idempotency_key": new_id("k"), **meta}
    return {"name": name, "arguments": arguments, "_meta": meta}


def assert_invalid_params(r: Any, transport: str, error: str, loc: list[Any] | None = None) -> None:
    """The JSON-RPC invalid-params error, as the transport answers its other validation errors."""
    assert r.status_code == (400 if transport == "stateless" else 200), r.content
    body = r.json()
    assert "result" not in body, body
    assert body["error"]["code"] == -32602, body
    assert body["error"]["data"]["error"] == error, body
    if loc is not None:
        assert body["error"]["data"]["loc"] == loc, body


# --- 1 and 2: lone surrogates and NUL in the arguments -------------------------------------------------------

# (arguments, error type, loc): keys and values, at any depth.
BAD_ARGUMENTS = [
    pytest.param({"a": "\ud800"}, "surrogate_characters_not_allowed", ["a"], id="surrogate-value"),
    pytest.param({"a": [{"b": "x\udfff"}]}, "surrogate_characters_not_allowed", ["a", 0, "b"], id="surrogate-nested"),
    pytest.param({"\udc00": 1}, "surrogate_characters_not_allowed", ["\\udc00"], id="surrogate-key"),
    pytest.param({"a": "x\x00y"}, "null_characters_not_allowed", ["a"], id="nul-value"),
    pytest.param({"a": {"b\x00": 1}}, "null_characters_not_allowed", ["a", "b\x00"], id="nul-nested-key"),
    pytest.param({"a": ["ok", "\x00"]}, "null_characters_not_allowed", ["a", 1], id="nul-in-list"),
]


@pytest.mark.parametrize("transport", MCP_TRANSPORTS)
@pytest.mark.parametrize(("arguments", "error", "loc"), BAD_ARGUMENTS)
def test_unstorable_arguments_are_invalid_params_on_mcp(
    fault: FaultUpstream, tenant: Tenant, caller: Caller, transport: str, arguments: Any, error: str, loc: list[Any]
) -> None:
    written = Written(tenant, fault)
    r = mcp_call(tenant.agent_client, transport, call_params(caller, arguments), HTTP_MCP_NAME="echo")
    assert_invalid_params(r, transport, error, ["body", "arguments", *loc])
    written.assert_nothing()


@pytest.mark.parametrize(("arguments", "error", "loc"), BAD_ARGUMENTS)
def test_unstorable_arguments_are_422_on_the_rest_invoke(
    fault: FaultUpstream, tenant: Tenant, caller: Caller, arguments: Any, error: str, loc: list[Any]
) -> None:
    written = Written(tenant, fault)
    body = {"arguments": arguments, "permit_id": caller.permit_id, "idempotency_key": new_id("k")}
    r = invoke(tenant.agent_client, "echo", body)
    assert r.status_code == 422, r.content
    assert r.json()["detail"] == [
        {"loc": ["body", "arguments", *loc], "msg": r.json()["detail"][0]["msg"], "type": error}
    ]
    written.assert_nothing()


# --- 4: the tool name ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", MCP_TRANSPORTS)
@pytest.mark.parametrize(
    ("name", "error"),
    [("ec\x00ho", "null_characters_not_allowed"), ("echo\ud800", "surrogate_characters_not_allowed")],
    ids=["nul", "surrogate"],
)
def test_an_unstorable_tool_name_is_invalid_params(
    fault: FaultUpstream, tenant: Tenant, caller: Caller, transport: str, name: str, error: str
) -> None:
    written = Written(tenant, fault)
    r = mcp_call(tenant.agent_client, transport, call_params(caller, {}, name=name))
    assert_invalid_params(r, transport, error, ["body", "name"])
    written.assert_nothing()


# --- 3 and 4: the call's ids in params._meta, or in headers ---------------------------------------------------

BAD_META = [
    pytest.param({"permit_id": "p" * 41}, "invalid_permit_id", id="permit-too-long"),
    pytest.param({"permit_id": "pmt_\x00"}, "invalid_permit_id", id="permit-nul"),
    pytest.param({"permit_id": "pmt_\ud800"}, "invalid_permit_id", id="permit-surrogate"),
    pytest.param({"quote_id": "q" * 41}, "invalid_quote_id", id="quote-too-long"),
    pytest.param({"quote_id": "qt_\x00"}, "invalid_quote_id", id="quote-nul"),
    pytest.param({"quote_id": "qt_\udfff"}, "invalid_quote_id", id="quote-surrogate"),
    pytest.param({"idempotency_key": "k\x00"}, "invalid_idempotency_key", id="key-nul"),
    pytest.param({"idempotency_key": "k" * 256}, "invalid_idempotency_key", id="key-too-long"),
]


@pytest.mark.parametrize("transport", MCP_TRANSPORTS)
@pytest.mark.parametrize(("meta", "error"), BAD_META)
def test_unstorable_call_ids_in_meta_are_invalid_params(
    fault: FaultUpstream, tenant: Tenant, caller: Caller, transport: str, meta: dict[str, str], error: str
) -> None:
    written = Written(tenant, fault)
    r = mcp_call(tenant.agent_client, transport, call_params(caller, {}, **meta), HTTP_MCP_NAME="echo")
    assert_invalid_params(r, transport, error)
    written.assert_nothing()


@pytest.mark.parametrize(
    ("header", "value", "error"),
    [
        ("HTTP_X_PERMIT_ID", "p" * 41, "invalid_permit_id"),
        ("HTTP_X_PERMIT_ID", "pmt_\x00", "invalid_permit_id"),
        ("HTTP_X_QUOTE_ID", "q" * 41, "invalid_quote_id"),
        ("HTTP_X_QUOTE_ID", "qt_\x00", "invalid_quote_id"),
        ("HTTP_IDEMPOTENCY_KEY", "k\x00", "invalid_idempotency_key"),
    ],
    ids=["permit-too-long", "permit-nul", "quote-too-long", "quote-nul", "key-nul"],
)
def test_unstorable_call_ids_in_headers_are_invalid_params(
    fault: FaultUpstream, tenant: Tenant, caller: Caller, header: str, value: str, error: str
) -> None:
    """The headers stand in for ``params._meta`` and are held to the same limits (a NUL cannot cross a real
    HTTP connection in a header, but the test client can put one there)."""
    written = Written(tenant, fault)
    meta_name = {"HTTP_X_PERMIT_ID": "permit_id", "HTTP_X_QUOTE_ID": "quote_id"}.get(header, "idempotency_key")
    params = call_params(caller, {})
    params["_meta"].pop(meta_name, None)  # the header names it instead
    r = mcp_call(tenant.agent_client, "messages", params, **{header: value})
    assert_invalid_params(r, "messages", error)
    written.assert_nothing()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("permit_id", "p" * 41),
        ("permit_id", "pmt_\x00"),
        ("permit_id", "pmt_\ud800"),
        ("quote_id", "q" * 41),
        ("quote_id", "qt_\x00"),
        ("idempotency_key", "k\x00"),
        ("idempotency_key", "k" * 256),
    ],
    ids=["permit-too-long", "permit-nul", "permit-surrogate", "quote-too-long", "quote-nul", "key-nul", "key-long"],
)
def test_unstorable_call_ids_are_422_on_the_rest_invoke(
    fault: FaultUpstream, tenant: Tenant, caller: Caller, field: str, value: str
) -> None:
    written = Written(tenant, fault)
    body = {"arguments": {}, "permit_id": caller.permit_id, "idempotency_key": new_id("k"), field: value}
    r = invoke(tenant.agent_client, "echo", body)
    assert r.status_code == 422, r.content
    assert [e["loc"] for e in r.json()["detail"]] == [["body", field]]
    written.assert_nothing()


# --- The limits are exact: what fits is still called -----------------------------------------------------------


@pytest.mark.parametrize("transport", MCP_TRANSPORTS)
def test_inputs_within_the_limits_are_called(
    fault: FaultUpstream, tenant: Tenant, caller: Caller, transport: str
) -> None:
    arguments = {"text": "é \u2028 \U0001f600 \ud7ff \ue000", "nested": [{"k\x01": "\x1f"}]}
    r = mcp_call(tenant.agent_client, transport, call_params(caller, arguments), HTTP_MCP_NAME="echo")
    assert r.status_code == 200, r.content
    assert r.json()["result"]["structuredContent"] == {"echo": arguments}
    # Ids of exactly the columns' length are looked up (and refused as unknown, with a receipt).
    r = mcp_call(tenant.agent_client, transport, call_params(caller, {}, permit_id="p" * 40), HTTP_MCP_NAME="echo")
    assert r.json()["error"]["data"]["error"] == "permit_not_found", r.content
    r = mcp_call(tenant.agent_client, transport, call_params(caller, {}, quote_id="q" * 40), HTTP_MCP_NAME="echo")
    assert r.json()["error"]["data"]["outcome"] == "denied", r.content
