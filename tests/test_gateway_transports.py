"""The MCP transports (docs/architecture.md): /mcp in both protocol eras, /mcp/public and /mcp/messages."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from billing.models import LedgerEntry, Wallet
from billing.services import tool_price_set
from mcpgateway import services
from mcpgateway.models import Action, McpSession
from receipts.models import Receipt
from tests import factories
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import setup_caller
from tests.upstream_server import FaultUpstream

pytestmark = pytest.mark.django_db

STATELESS = "2026-07-28"
ALLOWED_ORIGIN = "http://127.0.0.1:8000"
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[FaultUpstream]:
    with FaultUpstream(hang_seconds=2) as server:
        yield server


@pytest.fixture
def upstream(settings: Any, upstream_server: FaultUpstream) -> FaultUpstream:
    """The module's scripted upstream with fresh counters; its (static) tool list registered at 2 credits."""
    settings.UPSTREAM_READ_TIMEOUT = 1.0
    settings.UPSTREAM_CONNECT_TIMEOUT = 0.5
    settings.ALLOWED_ORIGINS = [ALLOWED_ORIGIN, "http://localhost:8000"]
    settings.UPSTREAM_MCP_URL = upstream_server.url
    with upstream_server.lock:
        upstream_server.messages.clear()
        upstream_server.received.clear()
        upstream_server.meta_keys.clear()
    tools = upstream_server.tools()
    services.tools_sync(remote_tools=tools)
    for spec in tools:
        tool_price_set(tool=spec["name"], credits=Decimal(2))
    return upstream_server


def message(method: str, params: dict[str, Any] | None = None, *, notification: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if not notification:
        body["id"] = next(_ids)
    if params is not None:
        body["params"] = params
    return body


def post(client: APIClient, path: str, body: Any, **headers: Any) -> Any:
    """POST a JSON body; ``headers`` are given as Django META names (HTTP_...)."""
    raw = body if isinstance(body, str) else json.dumps(body)
    return client.post(path, data=raw, content_type="application/json", **headers)


def initialize(client: APIClient, version: str = "2025-11-25") -> tuple[str, Any]:
    r = post(
        client,
        "/mcp",
        message(
            "initialize",
            {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "pytest", "version": "1"}},
        ),
    )
    assert r.status_code == 200, r.content
    return str(r["Mcp-Session-Id"]), r


def session_post(client: APIClient, sid: str, body: Any, **headers: str) -> Any:
    return post(client, "/mcp", body, HTTP_MCP_SESSION_ID=sid, **headers)


def call_params(tool: str, arguments: dict[str, Any], permit_id: str, key: str) -> dict[str, Any]:
    return {"name": tool, "arguments": arguments, "_meta": {"permit_id": permit_id, "idempotency_key": key}}


def stateless_post(
    client: APIClient, path: str, method: str, params: dict[str, Any] | None = None, **headers: str
) -> Any:
    params = dict(params or {})
    params["_meta"] = {**(params.get("_meta") or {}), "io.modelcontextprotocol/protocolVersion": STATELESS}
    meta_headers = {"HTTP_MCP_PROTOCOL_VERSION": STATELESS, "HTTP_MCP_METHOD": method}
    if method == "tools/call":
        meta_headers["HTTP_MCP_NAME"] = str(params.get("name"))
    meta_headers.update(headers)
    return post(client, path, message(method, params), **meta_headers)


def balance(tenant: Tenant) -> Decimal:
    return Wallet.objects.get(pk=tenant.agent.pk).balance


# --- A. /mcp, handshake era ------------------------------------------------------------------


def test_initialize_negotiates_the_version_and_opens_a_session(upstream, tenant):
    client = tenant.agent_client
    sid, r = initialize(client, "2025-06-18")
    body = r.json()
    assert body["id"] is not None
    result = body["result"]
    assert result["protocolVersion"] == "2025-06-18"
    assert "tools" in result["capabilities"]
    assert result["serverInfo"]["version"] == "1.3.0"
    assert result["serverInfo"]["name"] == "tollgate"
    session = McpSession.objects.get(session_id=sid)
    assert session.api_key_id == tenant.agent_key_id
    assert session.protocol_version == "2025-06-18"
    assert session.client_info == {"name": "pytest", "version": "1"}

    # An unsupported version is answered with the newest supported handshake revision.
    sid2, r2 = initialize(client, "1999-01-01")
    assert r2.json()["result"]["protocolVersion"] == "2025-11-25"
    assert sid2 != sid


def test_handshake_lifecycle_list_and_call(upstream, tenant):
    caller = setup_caller(tenant)
    client = tenant.agent_client
    sid, _ = initialize(client)
    r = session_post(client, sid, message("notifications/initialized", notification=True))
    assert r.status_code == 202
    assert r.content == b""
    assert McpSession.objects.get(session_id=sid).initialized is True

    r = session_post(client, sid, message("ping"), HTTP_MCP_PROTOCOL_VERSION="2025-11-25")
    assert r.status_code == 200
    assert r.json()["result"] == {}

    r = session_post(client, sid, message("tools/list"))
    assert r.status_code == 200
    assert r["Mcp-Session-Id"] == sid
    names = {t["name"] for t in r.json()["result"]["tools"]}
    assert {"echo", "hang", "rpc_error"} <= names
    assert "ttlMs" not in r.json()["result"]  # only the stateless era's list results are cacheable results

    start = balance(tenant)
    r = session_post(client, sid, message("tools/call", call_params("echo", {"a": 1}, caller.permit_id, "hs-1")))
    assert r.status_code == 200
    result = r.json()["result"]
    assert result["structuredContent"] == {"echo": {"a": 1}}
    assert result["_meta"]["io.tollgate/outcome"] == "success"
    assert result["_meta"]["io.tollgate/credits-charged"] == "2.00000000"
    assert Receipt.objects.get(receipt_id=result["_meta"]["io.tollgate/receipt-id"]).outcome == "success"
    assert balance(tenant) == start - 2
    assert Action.objects.get(idempotency_key="hs-1").transport == "mcp"


def test_requests_without_a_session_are_served_statelessly(upstream, tenant):
    """Sessions are optional: without Mcp-Session-Id a request is served, and no session is created."""
    client = tenant.agent_client
    r = post(client, "/mcp", message("tools/list", {}))
    assert r.status_code == 200
    assert "tools" in r.json()["result"]
    assert "Mcp-Session-Id" not in r
    assert post(client, "/mcp", message("ping", {})).json()["result"] == {}
    # params that are not an object are an invalid request.
    bad = post(client, "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": 5})
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == -32600
    # An array id is not a JSON-RPC id: refused, and never echoed.
    odd = post(client, "/mcp", {"jsonrpc": "2.0", "id": [1], "method": "tools/list"})
    assert odd.status_code == 400
    assert odd.json()["id"] is None


def test_unknown_ended_and_foreign_sessions_are_404(upstream, tenant, other_tenant):
    client = tenant.agent_client
    r = session_post(client, "0" * 32, message("tools/list"))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == -32600

    # A session of another key (even of the same wallet) is not found.
    sid, _ = initialize(client)
    assert session_post(other_tenant.agent_client, sid, message("tools/list")).status_code == 404
    second_key = factories.make_key(tenant.agent)
    assert session_post(client_for(second_key.secret), sid, message("tools/list")).status_code == 404
    assert session_post(client, sid, message("tools/list")).status_code == 200

    # DELETE ends it; afterwards it is gone for every method.
    assert client.delete("/mcp", HTTP_MCP_SESSION_ID=sid).status_code == 204
    for method in ("tools/list", "ping", "tools/call"):
        assert session_post(client, sid, message(method, {})).status_code == 404
    assert McpSession.objects.get(session_id=sid).ended_at is not None
    # Ending it again, or ending an unknown session: 404.
    assert client.delete("/mcp", HTTP_MCP_SESSION_ID=sid).status_code == 404
    assert client.delete("/mcp", HTTP_MCP_SESSION_ID="nope").status_code == 404
    assert client.delete("/mcp").status_code == 404


def test_a_session_expires_after_its_lifetime_and_the_sweep_deletes_it(upstream, tenant, settings):
    """A session lives MCP_SESSION_TTL_SECONDS after initialize, then answers 404 (the client initializes
    again); the sweep deletes ended and expired sessions, and keeps live ones."""
    from datetime import timedelta

    from django.utils import timezone

    client = tenant.agent_client
    old, _ = initialize(client)
    ended, _ = initialize(client)
    live, _ = initialize(client)
    assert client.delete("/mcp", HTTP_MCP_SESSION_ID=ended).status_code == 204
    McpSession.objects.filter(pk=old).update(created_at=timezone.now() - timedelta(seconds=120))
    settings.MCP_SESSION_TTL_SECONDS = 60
    assert session_post(client, old, message("tools/list")).status_code == 404
    assert session_post(client, live, message("tools/list")).status_code == 200
    assert services.mcp_sessions_purge() == 2  # what sweep_dispatches runs on every sweep
    assert set(McpSession.objects.values_list("session_id", flat=True)) == {live}


def test_another_key_cannot_end_a_session(upstream, tenant, other_tenant):
    sid, _ = initialize(tenant.agent_client)
    assert other_tenant.agent_client.delete("/mcp", HTTP_MCP_SESSION_ID=sid).status_code == 404
    assert McpSession.objects.get(session_id=sid).ended_at is None
    assert session_post(tenant.agent_client, sid, message("ping")).status_code == 200


def test_a_keys_live_sessions_are_capped_and_the_oldest_end(upstream, tenant, other_tenant, settings):
    """Each initialize made a session that lived a day; a key now keeps MCP_SESSIONS_PER_KEY live ones,
    and an initialize beyond them ends its oldest (whose client gets 404 and initializes again)."""
    settings.MCP_SESSIONS_PER_KEY = 2
    theirs, _ = initialize(other_tenant.agent_client)
    first, _ = initialize(tenant.agent_client)
    second, _ = initialize(tenant.agent_client)
    assert session_post(tenant.agent_client, first, message("ping")).status_code == 200
    third, _ = initialize(tenant.agent_client)
    assert session_post(tenant.agent_client, first, message("ping")).status_code == 404
    for sid in (second, third):
        assert session_post(tenant.agent_client, sid, message("ping")).status_code == 200
    assert session_post(other_tenant.agent_client, theirs, message("ping")).status_code == 200
    assert McpSession.objects.filter(api_key_id=tenant.agent_key_id, ended_at__isnull=True).count() == 2


def test_protocol_version_header_must_match_the_session(upstream, tenant):
    client = tenant.agent_client
    sid, _ = initialize(client, "2025-06-18")
    r = session_post(client, sid, message("tools/list"), HTTP_MCP_PROTOCOL_VERSION="2025-11-25")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32600
    r = session_post(client, sid, message("tools/list"), HTTP_MCP_PROTOCOL_VERSION="2025-06-18")
    assert r.status_code == 200


@pytest.mark.parametrize("path", ["/mcp", "/mcp/public"])
def test_an_unsupported_protocol_version_header_is_400(upstream, tenant, path):
    """The transport's rule: a request naming a version the server does not serve is refused (400), not
    served as if it named none; -32022 names the versions served. initialize negotiates in its body."""
    client = tenant.agent_client
    r = post(client, path, message("tools/list"), HTTP_MCP_PROTOCOL_VERSION="1999-01-01")
    assert r.status_code == 400, r.content
    error = r.json()["error"]
    assert error["code"] == -32022
    assert error["data"]["requested"] == "1999-01-01"
    assert "2025-11-25" in error["data"]["supported"]
    assert post(client, path, message("tools/list"), HTTP_MCP_PROTOCOL_VERSION="2025-06-18").status_code == 200
    assert post(client, path, message("tools/list")).status_code == 200
    init = message(
        "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    )
    assert post(client, path, init, HTTP_MCP_PROTOCOL_VERSION="1999-01-01").status_code == 200


def test_get_is_405_with_allow(upstream, tenant):
    r = tenant.agent_client.get("/mcp")
    assert r.status_code == 405
    assert set(r["Allow"].replace(" ", "").split(",")) == {"POST", "DELETE"}
    assert r.json()["detail"]["error"] == "method_not_allowed"
    assert APIClient().get("/mcp").status_code == 405


def test_missing_and_bad_keys_are_401(upstream, tenant):
    r = post(APIClient(), "/mcp", message("initialize", {"protocolVersion": "2025-11-25"}))
    assert r.status_code == 401
    assert r["Content-Type"].startswith("application/json")
    assert r.json()["detail"]["error"] == "not_authenticated"
    assert r["WWW-Authenticate"].startswith("Bearer")

    r = post(client_for("tg_not_a_real_key_0000000000000000"), "/mcp", message("initialize", {}))
    assert r.status_code == 401
    assert r.json()["detail"]["error"] == "invalid_api_key"
    assert "WWW-Authenticate" in r
    assert McpSession.objects.count() == 0


def test_origin_is_checked(upstream, tenant):
    client = tenant.agent_client
    body = message("initialize", {"protocolVersion": "2025-11-25"})
    r = post(client, "/mcp", body, HTTP_ORIGIN="https://evil.example")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "origin_not_allowed"
    assert McpSession.objects.count() == 0
    # Even without a key, the Origin is refused first.
    assert post(APIClient(), "/mcp", body, HTTP_ORIGIN="https://evil.example").status_code == 403
    r = post(client, "/mcp", body, HTTP_ORIGIN=ALLOWED_ORIGIN)
    assert r.status_code == 200
    assert post(client, "/mcp", body).status_code == 200  # non-browser clients send no Origin


def test_the_rest_invoke_checks_origin_as_every_mcp_endpoint(upstream, tenant):
    caller = setup_caller(tenant)
    body = {"arguments": {"n": 1}, "permit_id": caller.permit_id, "idempotency_key": "origin-1"}
    r = tenant.agent_client.post("/mcp/tools/echo/invoke", body, format="json", HTTP_ORIGIN="https://evil.example")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "origin_not_allowed"
    assert not Action.objects.exists()
    r = tenant.agent_client.post("/mcp/tools/echo/invoke", body, format="json", HTTP_ORIGIN=ALLOWED_ORIGIN)
    assert r.status_code == 200, r.content


def test_text_an_answer_carries_back_that_utf8_cannot_encode_is_escaped(upstream, tenant):
    """A lone surrogate in an id or a method name is sent back escaped (valid JSON), never a 500."""
    lone_id = '{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}'
    lone_method = '{"jsonrpc":"2.0","id":1,"method":"\\udfff"}'
    for client, path in (
        (APIClient(), "/mcp/public"),
        (tenant.agent_client, "/mcp/messages"),
        (tenant.agent_client, "/mcp"),
    ):
        r = post(client, path, lone_id)
        assert r.status_code == 200, (path, r.content)
        assert r.json() == {"jsonrpc": "2.0", "id": "\ud800", "result": {}}
        assert b"\\ud800" in r.content
        r = post(client, path, lone_method)
        assert r.json()["error"]["code"] == -32601, (path, r.content)


def test_initialize_checks_the_message_and_a_session_keeps_only_short_client_info(upstream, tenant):
    client = tenant.agent_client
    r = post(client, "/mcp", {"method": "initialize", "id": {"x": 1}, "params": {"protocolVersion": "2025-11-25"}})
    assert r.status_code == 400
    assert r.json()["id"] is None
    assert r.json()["error"]["code"] == -32600
    r = post(client, "/mcp", {"jsonrpc": "2.0", "method": "initialize", "id": 1, "params": "x"})
    assert r.status_code == 400
    assert not McpSession.objects.exists()
    info = {"name": "a\u0000b", "title": "t" * 5000, "version": "1", "blob": ["x"] * 10_000}
    r = post(client, "/mcp", message("initialize", {"protocolVersion": "2025-11-25", "clientInfo": info}))
    assert r.status_code == 200, r.content
    assert McpSession.objects.get().client_info == {"title": "t" * 200, "version": "1"}


def test_an_upstream_result_whose_meta_is_not_an_object_is_an_invalid_response():
    from mcpgateway.upstream.protocol import _invalid_call_result

    assert _invalid_call_result({"content": [], "_meta": "x"}) == "result._meta is not an object"
    assert _invalid_call_result({"content": [], "_meta": [["a", 1]]}) == "result._meta is not an object"
    assert _invalid_call_result({"content": [], "_meta": {"a": 1}}) is None


def test_parse_errors_batches_unknown_methods_and_notifications(upstream, tenant):
    client = tenant.agent_client
    r = post(client, "/mcp", "{not json")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32700
    assert r.json()["id"] is None

    r = post(client, "/mcp", [message("ping"), message("ping")])
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32600

    sid, _ = initialize(client)
    r = session_post(client, sid, message("resources/list"))
    body = r.json()
    assert body["error"]["code"] == -32601
    assert "result" not in body

    r = session_post(client, sid, {"jsonrpc": "1.0", "id": 9, "method": "ping"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32600

    r = session_post(client, sid, message("notifications/cancelled", {"requestId": 1}, notification=True))
    assert r.status_code == 202
    assert r.content == b""


def test_a_handshake_session_survives_across_clients(upstream, tenant):
    """Session state is in PostgreSQL: a fresh client (as another instance would) serves the same session."""
    sid, _ = initialize(tenant.agent_client)
    r = session_post(client_for(tenant.agent_secret), sid, message("tools/list"))
    assert r.status_code == 200
    assert r.json()["result"]["tools"]


# --- B. /mcp, the stateless 2026-07-28 era ------------------------------------------------------


def test_server_discover(upstream, tenant):
    r = stateless_post(tenant.agent_client, "/mcp", "server/discover")
    assert r.status_code == 200
    result = r.json()["result"]
    assert STATELESS in result["supportedVersions"]
    assert result["resultType"] == "complete"
    assert "tools" in result["capabilities"]
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["version"] == "1.3.0"
    assert "Mcp-Session-Id" not in r
    assert McpSession.objects.count() == 0


def test_stateless_tools_list_is_a_cacheable_result(upstream, tenant):
    r = stateless_post(tenant.agent_client, "/mcp", "tools/list")
    assert r.status_code == 200
    result = r.json()["result"]
    assert result["resultType"] == "complete"
    assert isinstance(result["ttlMs"], int)
    assert result["cacheScope"] == "private"
    assert {"echo", "rpc_error"} <= {t["name"] for t in result["tools"]}
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "tollgate"


def test_stateless_tools_call_needs_no_session(upstream, tenant):
    caller = setup_caller(tenant)
    start = balance(tenant)
    params = call_params("echo", {"q": "x"}, caller.permit_id, "sl-1")
    r = stateless_post(tenant.agent_client, "/mcp", "tools/call", params)
    assert r.status_code == 200, r.content
    result = r.json()["result"]
    assert result["structuredContent"] == {"echo": {"q": "x"}}
    assert result["resultType"] == "complete"
    assert result["_meta"]["io.tollgate/outcome"] == "success"
    assert balance(tenant) == start - 2
    assert McpSession.objects.count() == 0
    # A replay over the same era is marked and not charged again.
    again = stateless_post(tenant.agent_client, "/mcp", "tools/call", params)
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["result"]["_meta"]["io.tollgate/receipt-id"] == result["_meta"]["io.tollgate/receipt-id"]
    assert balance(tenant) == start - 2
    assert upstream.received[f"{tenant.agent.wallet_id}:sl-1"] == 1


def test_stateless_header_mismatches_are_400(upstream, tenant):
    caller = setup_caller(tenant)
    client = tenant.agent_client
    r = stateless_post(client, "/mcp", "tools/list", HTTP_MCP_METHOD="server/discover")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32020

    params = call_params("echo", {}, caller.permit_id, "sl-name")
    r = stateless_post(client, "/mcp", "tools/call", params, HTTP_MCP_NAME="rpc_error")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32020
    assert not Action.objects.filter(idempotency_key="sl-name").exists()
    assert upstream.count("tools/call") == 0

    r = post(
        client,
        "/mcp",
        message("tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2025-11-25"}}),
        HTTP_MCP_PROTOCOL_VERSION=STATELESS,
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32020


def test_stateless_unknown_and_handshake_only_methods_are_404(upstream, tenant):
    client = tenant.agent_client
    for method in ("resources/list", "ping", "initialize"):
        r = stateless_post(client, "/mcp", method)
        assert r.status_code == 404, method
        assert r.json()["error"]["code"] == -32601, method
    assert McpSession.objects.count() == 0


# --- C. /mcp/public and /mcp/messages ---------------------------------------------------------


def test_public_reads_need_no_key(upstream):
    anon = APIClient()
    r = post(anon, "/mcp/public", message("initialize", {"protocolVersion": "2025-06-18"}))
    assert r.status_code == 200
    assert r.json()["result"]["protocolVersion"] == "2025-06-18"
    assert r.json()["result"]["serverInfo"]["version"] == "1.3.0"
    assert "Mcp-Session-Id" not in r

    assert post(anon, "/mcp/public", message("ping")).json()["result"] == {}

    tools = post(anon, "/mcp/public", message("tools/list")).json()["result"]["tools"]
    assert {"echo", "rpc_error"} <= {t["name"] for t in tools}

    r = stateless_post(anon, "/mcp/public", "server/discover")
    assert r.status_code == 200
    assert STATELESS in r.json()["result"]["supportedVersions"]
    assert r.json()["result"]["cacheScope"] == "public"

    r = stateless_post(anon, "/mcp/public", "tools/list")
    assert r.json()["result"]["cacheScope"] == "public"
    assert r.json()["result"]["resultType"] == "complete"


def test_public_refuses_tool_calls_and_charges_nothing(upstream, tenant):
    caller = setup_caller(tenant)
    start = balance(tenant)
    params = call_params("echo", {}, caller.permit_id, "pub-1")
    for client in (APIClient(), tenant.agent_client):
        body = post(client, "/mcp/public", message("tools/call", params)).json()
        assert "error" in body
        assert "result" not in body
    assert balance(tenant) == start
    assert not Action.objects.exists()
    assert not LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").exists()
    assert upstream.count("tools/call") == 0


def test_public_tool_call_refusal_says_key_required(upstream):
    body = post(APIClient(), "/mcp/public", message("tools/call", {"name": "echo", "arguments": {}})).json()
    assert body["error"]["data"]["error"] == "key_required"


def test_public_checks_a_presented_key_and_the_origin(upstream, settings):
    r = post(client_for("tg_not_a_real_key_0000000000000000"), "/mcp/public", message("tools/list"))
    assert r.status_code == 401
    assert r.json()["detail"]["error"] == "invalid_api_key"
    r = post(APIClient(), "/mcp/public", message("tools/list"), HTTP_ORIGIN="https://evil.example")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "origin_not_allowed"
    assert post(APIClient(), "/mcp/public", message("tools/list"), HTTP_ORIGIN=ALLOWED_ORIGIN).status_code == 200
    assert APIClient().get("/mcp/public").status_code == 405


def test_public_catalog_can_require_a_key(upstream, settings, tenant):
    settings.TOOL_CATALOG_REQUIRES_KEY = True
    body = post(APIClient(), "/mcp/public", message("tools/list")).json()
    assert body["error"]["data"]["error"] == "key_required"
    body = post(tenant.agent_client, "/mcp/public", message("tools/list")).json()
    assert body["result"]["tools"]


def test_messages_needs_a_key_and_is_deprecated(upstream, tenant):
    r = post(APIClient(), "/mcp/messages", message("tools/list"))
    assert r.status_code == 401
    assert r["Deprecation"].startswith("@")
    assert "WWW-Authenticate" in r

    r = post(tenant.agent_client, "/mcp/messages", message("tools/list"))
    assert r.status_code == 200
    assert r["Deprecation"].startswith("@")
    assert int(r["Deprecation"][1:]) > 0
    assert 'rel="successor-version"' in r["Link"]
    assert "</mcp>" in r["Link"]
    assert {"echo"} <= {t["name"] for t in r.json()["result"]["tools"]}

    r = post(tenant.agent_client, "/mcp/messages", message("tools/list"), HTTP_ORIGIN="https://evil.example")
    assert r.status_code == 403
    assert "Deprecation" in r


def test_messages_tools_call_runs_the_governed_path(upstream, tenant):
    caller = setup_caller(tenant)
    start = balance(tenant)
    r = caller.rpc("echo", {"n": 3}, key="msg-1")
    assert r.status_code == 200
    assert "Deprecation" in r
    assert "Link" in r
    result = r.json()["result"]
    assert result["structuredContent"] == {"echo": {"n": 3}}
    assert balance(tenant) == start - 2
    action = Action.objects.get(idempotency_key="msg-1")
    assert action.transport == "mcp_messages"
    assert action.receipt_id == result["_meta"]["io.tollgate/receipt-id"]
    # The forwarded idempotency key, header and _meta.
    agent_key = f"{tenant.agent.wallet_id}:msg-1"
    assert upstream.received[agent_key] == 1
    assert agent_key in upstream.meta_keys


def test_rest_invoke_is_deprecated_too(upstream, tenant):
    caller = setup_caller(tenant)
    r = caller.invoke("echo", {"z": 1}, key="rest-dep")
    assert r.status_code == 200
    assert r["Deprecation"].startswith("@")
    assert "successor-version" in r["Link"]
    # Errors carry it as well.
    r = APIClient().post("/mcp/tools/echo/invoke", {"permit_id": "x", "idempotency_key": "k"}, format="json")
    assert r.status_code == 401
    assert "Deprecation" in r


def test_one_key_space_across_transports(upstream, tenant):
    """An action made on /mcp/messages is replayed (not re-run) by the same key on /mcp and the REST invoke."""
    caller = setup_caller(tenant)
    first = caller.rpc("echo", {"v": 1}, key="cross-1").json()["result"]
    receipt_id = first["_meta"]["io.tollgate/receipt-id"]
    sid, _ = initialize(tenant.agent_client)
    r = session_post(
        tenant.agent_client, sid, message("tools/call", call_params("echo", {"v": 1}, caller.permit_id, "cross-1"))
    )
    assert r["Idempotent-Replayed"] == "true"
    assert r.json()["result"]["_meta"]["io.tollgate/receipt-id"] == receipt_id
    r = caller.invoke("echo", {"v": 1}, key="cross-1")
    assert r.status_code == 200
    assert r["Idempotent-Replayed"] == "true"
    assert r.json()["receipt_id"] == receipt_id
    assert upstream.received[f"{tenant.agent.wallet_id}:cross-1"] == 1
    assert Action.objects.filter(idempotency_key="cross-1").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("params", [False, 0, "", [], "x"])
def test_params_that_are_not_an_object_are_an_invalid_request(params):
    """``params`` may be omitted (or null); anything else but an object is -32600 with HTTP 400."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params}
    r = APIClient().post("/mcp/public", body, format="json")
    assert r.status_code == 400, r.content
    assert r.json()["error"]["code"] == -32600
