"""UpstreamClient against the SDK demo upstream, a fault-injecting upstream and a raw-socket upstream.

Every fault case asserts the CallResult kind and that the upstream received the
``tools/call`` exactly once: the client never resends a call, not even on a pooled
connection the server has closed. The fault matrix holds in both protocol eras.
The negotiation of the era (the ``server/discover`` probe, the fallback to the
handshake, the re-negotiation when the upstream changes its mind) runs against
the SDK demo upstream and a scripted ``FaultUpstream``. The wire cases
(keep-alive, framing, pool limits, failed writes, TLS, threads) run against
``RawUpstream``, which speaks only the handshake era (its probe answer is not a
discover result).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import Field

from mcpgateway.upstream.client import CallResult, UpstreamClient, UpstreamError
from mcpgateway.upstream.protocol import IDEMPOTENCY_META_KEY
from tests import upstream_server
from tests.upstream_server import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    ECHO_OUTPUT_SCHEMA,
    FAULT_TOOLS,
    PARAM_TOOL_SCHEMA,
    PROTOCOL_VERSION_META_KEY,
    RAW_SLOW_SECONDS,
    STATELESS_VERSION,
    FaultUpstream,
    RawUpstream,
    Scripted,
    discover_result,
    free_port,
    rpc_error,
    rpc_result,
    running_demo_upstream,
)

READ_TIMEOUT = 0.3


@pytest.fixture
def fault() -> Iterator[FaultUpstream]:
    with FaultUpstream() as upstream:
        yield upstream


@pytest.fixture
def client(fault: FaultUpstream) -> Iterator[UpstreamClient]:
    with UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as upstream_client:
        yield upstream_client


@pytest.fixture(params=["handshake", "stateless"])
def era(request: pytest.FixtureRequest) -> str:
    """The protocol era the upstream offers: handshake only, or the stateless revision besides."""
    return str(request.param)


@pytest.fixture
def era_fault(era: str) -> Iterator[FaultUpstream]:
    with FaultUpstream(stateless_versions=[STATELESS_VERSION] if era == "stateless" else []) as upstream:
        yield upstream


@pytest.fixture
def era_client(era_fault: FaultUpstream, era: str) -> Iterator[UpstreamClient]:
    with UpstreamClient(era_fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as upstream_client:
        assert upstream_client.initialize().stateless is (era == "stateless")
        yield upstream_client


def call(client: UpstreamClient, fault: FaultUpstream, tool: str, key: str = "key-1") -> CallResult:
    result = client.call_tool(tool, {"x": 1}, idempotency_key=key, output_schema=ECHO_OUTPUT_SCHEMA)
    assert fault.received[key] == 1, "the upstream must see the call exactly once"
    assert fault.meta_keys[-1] == key
    return result


# -- the SDK demo upstream -----------------------------------------------------------------------


def test_demo_upstream_round_trip() -> None:
    # The SDK serves the stateless revision too, sessions or not: the handshake era is asked for.
    with (
        running_demo_upstream() as demo,
        UpstreamClient(demo.url, connect_timeout=2.0, read_timeout=5.0, era="handshake") as client,
    ):
        session = client.initialize()
        assert session.session_id
        assert session.protocol_version == "2025-11-25"
        assert not session.stateless
        assert session.server_info["name"] == "tollgate-demo-upstream"
        client.ping()

        tools = {tool["name"]: tool for tool in client.list_tools()}
        assert {"notes.append", "notes.list", "math.add", "clock.now", "demo.stats"} <= set(tools)
        schema = tools["notes.append"]["outputSchema"]

        first = client.call_tool("notes.append", {"text": "hello"}, idempotency_key="idem-1", output_schema=schema)
        assert first.kind == "success", first
        assert first.status_code == 200
        assert first.result is not None
        assert first.result["structuredContent"]["notebook_size"] == 1
        assert first.response_sha256

        replay = client.call_tool("notes.append", {"text": "hello"}, idempotency_key="idem-1", output_schema=schema)
        assert replay.kind == "success"
        assert replay.result == first.result

        other = client.call_tool("notes.append", {"text": "again"}, idempotency_key="idem-2", output_schema=schema)
        assert other.result is not None
        assert other.result["structuredContent"]["notebook_size"] == 2

        added = client.call_tool(
            "math.add", {"a": 2, "b": 3}, idempotency_key="idem-3", output_schema=tools["math.add"]["outputSchema"]
        )
        assert added.kind == "success"
        assert added.result is not None
        assert added.result["structuredContent"] == {"sum": 5.0}

        stats = httpx.get(demo.stats_url).json()
        assert stats["notebook_size"] == 2
        assert stats["tool_calls"]["notes.append"] == 3
        assert stats["key_arrivals"] == {"idem-1": 2, "idem-2": 1, "idem-3": 1}
        assert stats["sightings"][0] == {"tool": "notes.append", "header_key": "idem-1", "meta_key": "idem-1"}

        unknown = client.call_tool("no.such.tool", {}, idempotency_key="idem-4")
        assert unknown.kind == "tool_error"  # the SDK answers unknown tools with isError
        assert "server/discover" not in demo.methods()


def test_demo_upstream_session_expiry_reinitializes_for_tools_list() -> None:
    with (
        running_demo_upstream() as demo,
        UpstreamClient(demo.url, connect_timeout=2.0, read_timeout=5.0, era="handshake") as client,
    ):
        first = client.initialize()
        assert first.session_id is not None
        # Terminating the session server-side makes the SDK answer 404 to its id.
        httpx.delete(demo.url, headers={"Mcp-Session-Id": first.session_id, "MCP-Protocol-Version": "2025-11-25"})
        assert len(client.list_tools()) >= 5
        assert client.session is not None
        assert client.session.session_id not in (None, first.session_id)


def test_demo_upstream_command_line() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcpgateway.demo_upstream", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/stats", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        with UpstreamClient(f"http://127.0.0.1:{port}/mcp", connect_timeout=2.0, read_timeout=5.0) as client:
            result = client.call_tool("clock.now", {}, idempotency_key="cli-1")
        assert result.kind == "success"
    finally:
        proc.terminate()
        proc.wait(10)


# -- handshake and safe requests -----------------------------------------------------------------


def test_handshake_sends_initialized_and_session_headers(client: UpstreamClient, fault: FaultUpstream) -> None:
    client.ping()
    methods = [m.method for m in fault.messages]
    # The probe is refused (404, as to any request without a session): the handshake follows.
    assert methods == ["server/discover", "initialize", "notifications/initialized", "ping"]
    assert not client.session.stateless  # type: ignore[union-attr]
    ping = fault.messages[-1]
    assert ping.headers["Mcp-Session-Id"] == client.session.session_id  # type: ignore[union-attr]
    assert ping.headers["MCP-Protocol-Version"] == "2025-11-25"
    assert "text/event-stream" in ping.headers["Accept"]


def test_list_tools_follows_pagination(client: UpstreamClient, fault: FaultUpstream) -> None:
    tools = client.list_tools()
    assert [tool["name"] for tool in tools] == FAULT_TOOLS
    assert fault.count("tools/list") == 3  # 19 tools, 7 per page


def test_session_expiry_on_tools_list_reinitializes_transparently(client: UpstreamClient, fault: FaultUpstream) -> None:
    client.ping()
    fault.expire_sessions()
    assert len(client.list_tools()) == len(FAULT_TOOLS)
    assert fault.count("initialize") == 2


def test_concurrent_expiry_reinitializes_once(client: UpstreamClient, fault: FaultUpstream) -> None:
    client.ping()
    fault.expire_sessions()
    errors: list[BaseException] = []

    def ping() -> None:
        try:
            client.ping()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ping) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # Threads whose 404 arrives after another thread replaced the session reuse the new one.
    assert fault.count("initialize") == 2


def test_unsupported_protocol_version_is_refused() -> None:
    with (
        FaultUpstream(protocol_version="1999-01-01") as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        with pytest.raises(UpstreamError, match="unsupported protocol version"):
            client.ping()
        result = client.call_tool("echo", {}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert fault.received["k"] == 0


# -- the tools/call fault matrix -----------------------------------------------------------------


def test_call_success_carries_key_in_header_and_meta(client: UpstreamClient, fault: FaultUpstream) -> None:
    result = client.call_tool(
        "echo", {"x": 1}, idempotency_key="key-1", request_id="action-42", extra_meta={"trace": "t-1"}
    )
    assert result.kind == "success"
    assert result.request_id == "action-42"
    assert result.result is not None
    assert result.result["structuredContent"] == {"echo": {"x": 1}}
    sent = fault.messages[-1]
    assert sent.headers["Idempotency-Key"] == "key-1"
    assert sent.body["id"] == "action-42"
    assert sent.body["params"]["_meta"] == {IDEMPOTENCY_META_KEY: "key-1", "trace": "t-1"}
    assert fault.received["key-1"] == 1


def test_sse_framed_response(era_client: UpstreamClient, era_fault: FaultUpstream) -> None:
    result = call(era_client, era_fault, "sse_echo")
    assert result.kind == "success", result
    assert result.result is not None
    assert result.result["structuredContent"] == {"echo": {"x": 1}}


@pytest.mark.parametrize(
    ("tool", "kind", "reason"),
    [
        ("rpc_error", "jsonrpc_error", "JSON-RPC error -32602"),
        ("is_error", "tool_error", "isError"),
        ("bad_output", "invalid_response", "violates outputSchema"),
        ("garbage", "invalid_response", "not JSON"),
        ("wrong_id", "invalid_response", "does not match"),
        ("no_result", "invalid_response", "exactly one of result and error"),
        ("accepted", "invalid_response", "empty body (HTTP 202)"),
        ("sse_garbage", "invalid_response", "SSE event data is not JSON"),
        ("hang", "uncertain", "ReadTimeout"),
        ("slow", "uncertain", "ReadTimeout"),
        ("drop", "uncertain", "response interrupted"),
        ("drop_early", "uncertain", "RemoteProtocolError"),
        ("bad_gateway", "uncertain", "HTTP 502"),
        ("sse_no_response", "uncertain", "ended without a response"),
        ("http_400", "http_error", "HTTP 400"),
        ("http_400_rpc", "jsonrpc_error", "JSON-RPC error -32602 (HTTP 400)"),
    ],
)
def test_fault_matrix(
    era_client: UpstreamClient, era_fault: FaultUpstream, era: str, tool: str, kind: str, reason: str
) -> None:
    client, fault = era_client, era_fault
    result = call(client, fault, tool)
    assert result.kind == kind, result
    # A bare 400 is what a handshake-only server answers a stateless request: the era is forgotten.
    assert (client.session is None) is (era == "stateless" and tool == "http_400")
    assert reason in result.reason
    assert result.tool_not_run == (kind in {"jsonrpc_error", "http_error"})
    if kind == "jsonrpc_error":
        assert result.error is not None
        assert result.error["code"] == -32602
    if tool == "rpc_error":
        assert result.error == {"code": -32602, "message": "bad arguments", "data": {"field": "x"}}
    if tool in ("hang", "slow"):
        assert result.elapsed < 1.0


def test_refused_connection_is_not_sent() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with UpstreamClient(url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client:
        result = client.call_tool("echo", {}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert "ConnectError" in result.reason
        assert result.tool_not_run
        with pytest.raises(UpstreamError):
            client.list_tools()


def test_session_expiry_on_tools_call_reinitializes_without_resending(
    client: UpstreamClient, fault: FaultUpstream
) -> None:
    client.ping()
    old_session = client.session
    fault.expire_sessions()
    result = call(client, fault, "echo")
    assert result.kind == "not_sent"
    assert result.reason == "session_expired"
    assert result.status_code == 404
    assert fault.executed["key-1"] == 0
    assert fault.count("initialize") == 2
    assert client.session is not None
    assert client.session is not old_session

    # The caller decides whether to send again; the client did not.
    retried = client.call_tool("echo", {"x": 1}, idempotency_key="key-1")
    assert retried.kind == "success"
    assert fault.received["key-1"] == 2


def test_invalid_output_schema_raises_before_sending(client: UpstreamClient, fault: FaultUpstream) -> None:
    with pytest.raises(ValueError, match="invalid output_schema"):
        client.call_tool("echo", {}, idempotency_key="k", output_schema={"type": 12})
    assert fault.messages == []


def test_a_call_whose_session_was_ready_after_its_send_deadline_is_not_sent(
    client: UpstreamClient, fault: FaultUpstream
) -> None:
    """The negotiation ran (the session is ready), but past ``send_by``: the tools/call is never written."""
    result = client.call_tool("echo", {"n": 1}, idempotency_key="late-1", send_by=time.monotonic() - 0.001)
    assert result.kind == "not_sent"
    assert "send deadline" in result.reason
    assert fault.count("tools/call") == 0
    assert fault.count("initialize") == 1
    assert client.call_tool("echo", {"n": 1}, idempotency_key="late-2", send_by=time.monotonic() + 30).kind == "success"


def test_total_timeout_bounds_a_trickling_stream(fault: FaultUpstream) -> None:
    with UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=5.0, total_timeout=0.3) as client:
        result = client.call_tool("sse_trickle", {}, idempotency_key="k")
    assert result.kind == "uncertain"
    assert result.reason == "total timeout passed before the response arrived"
    assert fault.received["k"] == 1


def test_oversized_response_is_rejected(fault: FaultUpstream) -> None:
    with UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT, max_response_bytes=1000) as client:
        client.initialize()  # the handshake answer fits
        result = client.call_tool("echo", {"x": "a" * 2000}, idempotency_key="k")
    assert result.kind == "invalid_response"
    assert result.reason == "response larger than 1000 bytes"
    assert fault.received["k"] == 1


def test_unencodable_arguments_are_not_sent(client: UpstreamClient, fault: FaultUpstream) -> None:
    result = client.call_tool("echo", {"when": object()}, idempotency_key="k")
    assert result.kind == "not_sent"
    assert result.reason.startswith("request not built: TypeError")
    assert fault.received["k"] == 0


# -- protocol eras: negotiation, the stateless wire, re-negotiation ------------------------------

ENVELOPE_KEYS = {PROTOCOL_VERSION_META_KEY, CLIENT_INFO_META_KEY, CLIENT_CAPABILITIES_META_KEY}


def test_demo_upstream_stateless_round_trip() -> None:
    with (
        running_demo_upstream(stateless=True) as demo,
        UpstreamClient(demo.url, connect_timeout=2.0, read_timeout=5.0) as client,
    ):
        session = client.initialize()
        assert session.stateless
        assert session.session_id is None
        assert session.protocol_version == STATELESS_VERSION
        assert session.server_info["name"] == "tollgate-demo-upstream"
        assert "tools" in session.capabilities
        assert session.instructions is not None
        assert "Demo upstream" in session.instructions
        client.ping()

        tools = {tool["name"]: tool for tool in client.list_tools()}
        schema = tools["notes.append"]["outputSchema"]
        first = client.call_tool(
            "notes.append", {"text": "hello"}, idempotency_key="idem-1", output_schema=schema, extra_meta={"t": 1}
        )
        assert first.kind == "success", first
        assert first.result is not None
        assert first.result["structuredContent"]["notebook_size"] == 1
        replay = client.call_tool("notes.append", {"text": "hello"}, idempotency_key="idem-1", output_schema=schema)
        assert replay.kind == "success"
        assert replay.result is not None
        assert replay.result["structuredContent"] == first.result["structuredContent"]
        added = client.call_tool(
            "math.add", {"a": 2, "b": 3}, idempotency_key="idem-2", output_schema=tools["math.add"]["outputSchema"]
        )
        assert added.kind == "success", added
        assert added.result is not None
        assert added.result["structuredContent"] == {"sum": 5.0}
        assert client.call_tool("no.such.tool", {}, idempotency_key="idem-3").kind == "tool_error"

        stats = httpx.get(demo.stats_url).json()
        assert stats["tool_calls"] == {"notes.append": 2, "math.add": 1}
        assert stats["sightings"][0] == {"tool": "notes.append", "header_key": "idem-1", "meta_key": "idem-1"}

    # No handshake, no session; every request carried the envelope and the headers of its method.
    assert demo.methods() == ["server/discover", "server/discover", "tools/list"] + ["tools/call"] * 4
    for seen in demo.requests:
        assert set(seen.meta) >= ENVELOPE_KEYS, seen
        assert seen.meta[PROTOCOL_VERSION_META_KEY] == STATELESS_VERSION
        assert seen.meta[CLIENT_INFO_META_KEY] == {"name": "tollgate", "version": "1"}
        assert seen.meta[CLIENT_CAPABILITIES_META_KEY] == {}
        assert seen.headers["mcp-protocol-version"] == STATELESS_VERSION
        assert seen.headers["mcp-method"] == seen.method
        assert "mcp-session-id" not in seen.headers
    calls = [seen for seen in demo.requests if seen.method == "tools/call"]
    assert [seen.headers["mcp-name"] for seen in calls] == ["notes.append", "notes.append", "math.add", "no.such.tool"]
    assert calls[0].meta[IDEMPOTENCY_META_KEY] == "idem-1"
    assert calls[0].meta["t"] == 1
    assert calls[0].headers["idempotency-key"] == "idem-1"


def test_demo_upstream_with_sessions_is_reached_in_the_stateless_era_too() -> None:
    with (
        running_demo_upstream() as demo,
        UpstreamClient(demo.url, connect_timeout=2.0, read_timeout=5.0) as client,
    ):
        assert client.call_tool("clock.now", {}, idempotency_key="k").kind == "success"
        assert client.session is not None
        assert client.session.stateless
    assert demo.methods() == ["server/discover", "tools/call"]


def test_handshake_only_upstream_falls_back_and_works_as_before(client: UpstreamClient, fault: FaultUpstream) -> None:
    assert [tool["name"] for tool in client.list_tools()] == FAULT_TOOLS
    assert call(client, fault, "echo").kind == "success"
    probe = fault.messages[0]
    assert probe.method == "server/discover"
    assert probe.headers["MCP-Protocol-Version"] == STATELESS_VERSION
    assert probe.headers["Mcp-Method"] == "server/discover"
    assert set(probe.body["params"]["_meta"]) == ENVELOPE_KEYS
    call_message = fault.messages[-1]
    assert call_message.headers["MCP-Protocol-Version"] == "2025-11-25"
    assert "Mcp-Method" not in call_message.headers
    assert call_message.body["params"]["_meta"] == {IDEMPOTENCY_META_KEY: "key-1"}
    assert fault.count("server/discover") == 1


def test_handshake_era_is_never_probed() -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT, era="handshake") as client,
    ):
        assert call(client, fault, "echo").kind == "success"
        assert fault.methods() == ["initialize", "notifications/initialized", "tools/call"]


def test_unknown_era_is_refused() -> None:
    with pytest.raises(ValueError, match="era must be"):
        UpstreamClient("http://127.0.0.1:1/mcp", connect_timeout=1.0, read_timeout=1.0, era="stateless")  # type: ignore[arg-type]


def test_stateless_call_carries_envelope_and_headers() -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        result = client.call_tool(
            "echo",
            {"x": 1},
            idempotency_key="key-1",
            request_id="action-42",
            extra_meta={"trace": "t-1", PROTOCOL_VERSION_META_KEY: "forged"},
        )
        assert result.kind == "success", result
        sent = fault.messages[-1]
        assert sent.headers["MCP-Protocol-Version"] == STATELESS_VERSION
        assert sent.headers["Mcp-Method"] == "tools/call"
        assert sent.headers["Mcp-Name"] == "echo"
        assert sent.headers["Idempotency-Key"] == "key-1"
        assert "Mcp-Session-Id" not in sent.headers
        assert sent.body["id"] == "action-42"
        assert sent.body["params"]["_meta"] == {
            "trace": "t-1",
            IDEMPOTENCY_META_KEY: "key-1",
            PROTOCOL_VERSION_META_KEY: STATELESS_VERSION,  # the envelope wins over extra_meta
            CLIENT_INFO_META_KEY: {"name": "tollgate", "version": "1"},
            CLIENT_CAPABILITIES_META_KEY: {},
        }
        assert fault.methods() == ["server/discover", "tools/call"]


def test_ping_is_a_discover_in_the_stateless_era(era_fault: FaultUpstream, era_client: UpstreamClient) -> None:
    era_client.ping()
    expected = "server/discover" if era_client.initialize().stateless else "ping"
    assert era_fault.methods()[-1] == expected


def test_tool_name_that_is_not_plain_ascii_travels_base64_wrapped() -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        result = client.call_tool("écho ", {}, idempotency_key="k")
        # The upstream decoded Mcp-Name and found it equal to params.name: the tool is unknown, no header mismatch.
        assert result.kind == "jsonrpc_error"
        assert result.error is not None
        assert result.error["code"] == -32602
        assert fault.messages[-1].headers["Mcp-Name"] == "=?base64?w6ljaG8g?="


def test_mcp_param_headers_mirror_annotated_arguments(era_fault: FaultUpstream, era_client: UpstreamClient) -> None:
    arguments = {"region": "eu-west", "options": {"dry_run": True}, "count": 3, "note": "not mirrored"}
    result = era_client.call_tool("param_echo", arguments, idempotency_key="k", input_schema=PARAM_TOOL_SCHEMA)
    assert result.kind == "success", result
    assert result.result is not None
    headers = result.result["structuredContent"]["headers"]
    if era_client.initialize().stateless:
        assert headers == {"Mcp-Param-Region": "eu-west", "Mcp-Param-Dry-Run": "true", "Mcp-Param-Count": "3"}
    else:
        assert headers == {}  # the handshake era has no Mcp-Param-* headers

    absent = era_client.call_tool(
        "param_echo", {"region": " ünï "}, idempotency_key="k2", input_schema=PARAM_TOOL_SCHEMA
    )
    assert absent.result is not None
    if era_client.initialize().stateless:
        assert absent.result["structuredContent"]["headers"] == {"Mcp-Param-Region": "=?base64?IMO8bsOvIA==?="}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"region": {"type": "number", "x-mcp-header": "Region"}}},  # not allowed
        {
            "type": "object",
            "properties": {"a": {"type": "string", "x-mcp-header": "A"}, "b": {"type": "string", "x-mcp-header": "a"}},
        },
        {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Bad Token"}}},
        {"type": "object", "anyOf": [{"properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}]},
        {"type": "object", "x-mcp-header": "Root"},
    ],
)
def test_invalid_x_mcp_header_annotations_send_no_param_headers(schema: dict[str, Any]) -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        result = client.call_tool(
            "param_echo", {"region": "x", "a": "1", "b": "2"}, idempotency_key="k", input_schema=schema
        )
        assert result.result is not None
        assert result.result["structuredContent"]["headers"] == {}


def test_mcp_param_headers_satisfy_the_sdk_server() -> None:
    """An SDK server refuses a call to a tool with ``x-mcp-header`` arguments unless the headers match."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("param-upstream")

    @server.tool(name="geo.lookup")
    def lookup(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
        verbose: Annotated[bool, Field(json_schema_extra={"x-mcp-header": "Verbose"})] = False,
    ) -> dict[str, Any]:
        return {"region": region, "verbose": verbose}

    app = server.streamable_http_app(streamable_http_path="/mcp", json_response=True, stateless_http=True)
    with running_asgi(app) as url, UpstreamClient(url, connect_timeout=2.0, read_timeout=5.0) as client:
        schema = {tool["name"]: tool for tool in client.list_tools()}["geo.lookup"]["inputSchema"]
        without = client.call_tool("geo.lookup", {"region": "eu", "verbose": True}, idempotency_key="k1")
        assert without.kind == "jsonrpc_error"
        assert without.error is not None
        assert without.error["code"] == -32020  # HEADER_MISMATCH: the tool did not run
        for key, region in (("k2", "eu-west"), ("k3", " über ")):
            result = client.call_tool(
                "geo.lookup", {"region": region, "verbose": True}, idempotency_key=key, input_schema=schema
            )
            assert result.kind == "success", result
            assert result.result is not None
            assert region in result.result["content"][0]["text"]


@contextlib.contextmanager
def running_asgi(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a daemon thread; yields its ``/mcp`` URL."""
    with upstream_server.running_asgi(app) as base:
        yield f"{base}/mcp"


@pytest.mark.parametrize(
    "answer",
    [
        Scripted(404, rpc_error(-32600, "Session not found")(None)),  # a handshake server: no session id
        Scripted(405, b"", "text/plain"),
        Scripted(400, b"Bad Request", "text/plain"),
        Scripted(307, b"", "text/plain"),
        Scripted(200, rpc_error(-32601, "Method not found")),
        Scripted(404, rpc_error(-32601, "Method not found")),
        Scripted(500, rpc_error(-32603, "Internal error")),  # a JSON-RPC error, whatever the status
        Scripted(200, b"<html>not json</html>", "text/html"),
        Scripted(200, rpc_result({})),  # not a discover result
        Scripted(200, rpc_result(discover_result(["2025-11-25", "2025-06-18"]))),  # handshake versions only
        Scripted(200, rpc_result({**discover_result([STATELESS_VERSION]), "capabilities": []})),
        Scripted(200, rpc_result({**discover_result([STATELESS_VERSION]), "cacheScope": "everyone"})),
        Scripted(200, rpc_result({**discover_result([STATELESS_VERSION]), "supportedVersions": STATELESS_VERSION})),
        Scripted(202, b""),
        Scripted(200, rpc_error(-32022, "Unsupported protocol version", {"supported": ["2025-11-25"]})),  # no requested
    ],
    ids=lambda answer: f"{answer.status}-{answer.content_type}",
)
def test_probe_answers_without_stateless_evidence_fall_back_to_the_handshake(answer: Scripted) -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION], discover_answers=[answer]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        assert call(client, fault, "echo").kind == "success"
        assert client.session is not None
        assert not client.session.stateless
        assert client.session.session_id
        assert fault.methods() == ["server/discover", "initialize", "notifications/initialized", "tools/call"]


def test_discover_result_with_unknown_members_and_a_negative_ttl_is_adopted() -> None:
    result = {**discover_result(["2025-11-25", STATELESS_VERSION]), "ttlMs": -5, "future": {"x": 1}}
    with (
        FaultUpstream(
            stateless_versions=[STATELESS_VERSION], discover_answers=[Scripted(200, rpc_result(result))]
        ) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        session = client.initialize()
        assert session.stateless
        assert session.server_info == {"name": "fault-upstream", "version": "0"}
        assert session.capabilities == {"tools": {"listChanged": False}}
        assert call(client, fault, "echo").kind == "success"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (Scripted(action="drop"), "server/discover: RemoteProtocolError"),
        (Scripted(502, b"Bad Gateway", "text/plain"), "server/discover: HTTP 502"),
        (Scripted(503, b"", "text/plain"), "server/discover: HTTP 503"),
    ],
)
def test_probe_without_a_complete_answer_is_no_era_verdict(answer: Scripted, reason: str) -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION], discover_answers=[answer, answer]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        result = client.call_tool("echo", {}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert result.tool_not_run
        assert result.reason.startswith(f"initialize failed: {reason}")
        with pytest.raises(UpstreamError, match=reason):
            client.list_tools()
        assert client.session is None
        assert fault.methods() == ["server/discover", "server/discover"]  # no handshake, no tools/call
        assert fault.received["k"] == 0
        # The upstream answers the next probe: the era is negotiated then.
        assert call(client, fault, "echo", key="k2").kind == "success"
        assert client.session is not None
        assert client.session.stateless


def test_probe_refused_connection_is_not_sent_and_an_upstream_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with UpstreamClient(url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client:
        result = client.call_tool("echo", {}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert result.reason.startswith("initialize failed: server/discover: ConnectError")
        with pytest.raises(UpstreamError, match="server/discover: ConnectError"):
            client.list_tools()
        with pytest.raises(UpstreamError, match="server/discover: ConnectError"):
            client.initialize()


def unsupported(*supported: str) -> Scripted:
    data = {"supported": list(supported), "requested": STATELESS_VERSION}
    return Scripted(400, rpc_error(-32022, "Unsupported protocol version", data))


def test_unsupported_version_naming_a_mutual_version_probes_once_more() -> None:
    # A probe that reached a server still settling its era: the second probe is answered.
    with (
        FaultUpstream(
            stateless_versions=[STATELESS_VERSION], discover_answers=[unsupported(STATELESS_VERSION)]
        ) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        assert client.initialize().stateless
        assert fault.methods() == ["server/discover", "server/discover"]


def test_unsupported_version_twice_with_no_handshake_version_is_incompatible() -> None:
    answers = [unsupported(STATELESS_VERSION), unsupported(STATELESS_VERSION)]
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION], discover_answers=answers) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        with pytest.raises(UpstreamError, match="speaks no protocol version this client does"):
            client.initialize()
        assert fault.methods() == ["server/discover", "server/discover"]


def test_unsupported_version_naming_only_unknown_versions_is_incompatible() -> None:
    with (
        FaultUpstream(stateless_versions=["2099-01-01"], handshake=False) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        with pytest.raises(
            UpstreamError, match=r"speaks no protocol version this client does \(it supports 2099-01-01\)"
        ):
            client.initialize()
        result = client.call_tool("echo", {}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert fault.received["k"] == 0
        assert "initialize" not in fault.methods()


def test_unsupported_version_naming_a_handshake_version_falls_back() -> None:
    with (
        FaultUpstream(discover_answers=[unsupported("2099-01-01", "2025-11-25")]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        assert not client.initialize().stateless
        assert fault.methods() == ["server/discover", "initialize", "notifications/initialized"]


def test_handshake_refused_with_unsupported_version_probes_once_more() -> None:
    # The probe was refused, but the handshake's -32022 names the stateless version: the upstream is of
    # that era after all (the SDK's rule for a probe that timed out on a server still settling its era).
    with (
        FaultUpstream(
            stateless_versions=[STATELESS_VERSION], handshake=False, discover_answers=[Scripted(404, b"", "text/plain")]
        ) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        assert client.initialize().stateless
        assert fault.methods() == ["server/discover", "initialize", "server/discover"]
        assert call(client, fault, "echo").kind == "success"


def test_handshake_refused_twice_fails_the_negotiation() -> None:
    answers = [Scripted(404, b"", "text/plain"), Scripted(404, b"", "text/plain")]
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION], handshake=False, discover_answers=answers) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        with pytest.raises(UpstreamError, match="initialize: JSON-RPC error -32022"):
            client.initialize()
        assert fault.methods() == ["server/discover", "initialize", "server/discover", "initialize"]


def test_unsupported_version_on_a_call_renegotiates_without_resending() -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        assert call(client, fault, "echo", key="k1").kind == "success"
        fault.stateless_versions = ["2099-01-01", STATELESS_VERSION]  # the same list the probe would see...
        refused = call(client, fault, "unsupported_version", key="k2")  # ...but this tool answers -32022
        assert refused.kind == "jsonrpc_error"
        assert refused.tool_not_run
        assert refused.error is not None
        assert refused.error["code"] == -32022
        assert client.session is None  # forgotten: the next request negotiates
        assert fault.received["k2"] == 1
        assert call(client, fault, "echo", key="k3").kind == "success"
        assert fault.methods() == ["server/discover", "tools/call", "tools/call", "server/discover", "tools/call"]
        assert fault.received["k2"] == 1  # never resent


def test_upstream_dropping_the_stateless_era_is_renegotiated_into_the_handshake() -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        assert call(client, fault, "echo", key="k1").kind == "success"
        fault.stateless_versions = []  # a handshake-only server now: 404 to a request without a session
        refused = call(client, fault, "echo", key="k2")
        assert refused.kind == "http_error"
        assert refused.reason == "HTTP 404"
        assert fault.executed["k2"] == 0
        assert client.session is None
        assert call(client, fault, "echo", key="k3").kind == "success"
        assert client.session is not None
        assert not client.session.stateless
        assert fault.received["k2"] == 1


def test_upstream_refusing_the_stateless_version_is_renegotiated() -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        assert client.initialize().stateless
        fault.stateless_versions = ["2099-01-01"]
        refused = call(client, fault, "echo", key="k1")
        assert refused.kind == "jsonrpc_error"
        assert refused.reason == "JSON-RPC error -32022 (HTTP 400)"
        assert client.session is None
        fault.stateless_versions = [STATELESS_VERSION]  # rolled back
        assert call(client, fault, "echo", key="k2").kind == "success"
        assert fault.count("server/discover") == 2


def test_list_tools_renegotiates_and_resends_once_when_the_era_is_refused() -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        assert client.initialize().stateless
        fault.stateless_versions = []
        assert [tool["name"] for tool in client.list_tools()] == FAULT_TOOLS
        assert client.session is not None
        assert not client.session.stateless
        assert fault.methods()[:5] == [
            "server/discover",
            "tools/list",
            "server/discover",
            "initialize",
            "notifications/initialized",
        ]


def test_session_expiry_probes_again() -> None:
    # A restart ends the sessions; an upgraded upstream is then reached in the stateless era.
    with (
        FaultUpstream() as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        assert not client.initialize().stateless
        fault.expire_sessions()
        fault.stateless_versions = [STATELESS_VERSION]
        result = call(client, fault, "echo")
        assert result.reason == "session_expired"
        assert client.session is not None
        assert client.session.stateless
        assert call(client, fault, "echo", key="key-2").kind == "success"


@pytest.mark.parametrize(
    ("era_name", "reason"),
    [("stateless", "resultType 'input_required' is not 'complete'"), ("handshake", "result.content is not a list")],
)
def test_input_required_result_is_invalid_response(era_name: str, reason: str) -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION] if era_name == "stateless" else []) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        result = call(client, fault, "input_required")
        assert result.kind == "invalid_response"
        assert reason in result.reason
        assert not result.tool_not_run  # the tool may have run: the charge is kept
        assert result.result is not None
        assert result.result["resultType"] == "input_required"
        assert client.session is not None  # not an era refusal


def test_stateless_list_tools_with_an_incomplete_result_is_an_upstream_error() -> None:
    answer = Scripted(200, rpc_result({"resultType": "input_required", "inputRequests": {}}))
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT) as client,
    ):
        client.initialize()
        fault.discover_answers.append(answer)
        with pytest.raises(UpstreamError, match="server/discover: resultType 'input_required'"):
            client.ping()


def test_concurrent_first_use_negotiates_once() -> None:
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=2.0) as client,
    ):
        results: list[CallResult] = []
        start = threading.Barrier(8)

        def work(i: int) -> None:
            start.wait()
            results.append(client.call_tool("echo", {"i": i}, idempotency_key=f"k{i}"))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [result.kind for result in results] == ["success"] * 8
        assert fault.count("server/discover") == 1
        assert fault.count("initialize") == 0


def test_configured_headers_cannot_replace_the_era_headers() -> None:
    headers = {"Mcp-Method": "forged", "Mcp-Name": "forged", "Mcp-Param-Region": "forged", "X-Trace": "t"}
    with (
        FaultUpstream(stateless_versions=[STATELESS_VERSION]) as fault,
        UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT, headers=headers) as client,
    ):
        result = client.call_tool("param_echo", {"region": "eu"}, idempotency_key="k", input_schema=PARAM_TOOL_SCHEMA)
        assert result.kind == "success", result
        assert result.result is not None
        assert result.result["structuredContent"]["headers"] == {"Mcp-Param-Region": "eu"}
        assert fault.messages[-1].headers["X-Trace"] == "t"


# -- the wire: connections, framing, TLS ---------------------------------------------------------


@pytest.fixture
def raw() -> Iterator[RawUpstream]:
    with RawUpstream() as upstream:
        yield upstream


def raw_client(upstream: RawUpstream, **options: Any) -> UpstreamClient:
    settings: dict[str, Any] = {"connect_timeout": 1.0, "read_timeout": 2.0, **options}
    return UpstreamClient(upstream.url, **settings)


def raw_call(client: UpstreamClient, upstream: RawUpstream, tool: str, key: str) -> CallResult:
    result = client.call_tool(tool, {"x": key}, idempotency_key=key, output_schema=ECHO_OUTPUT_SCHEMA)
    assert upstream.received[key] == 1, "the upstream must see the call exactly once"
    return result


def test_keep_alive_reuses_one_connection(raw: RawUpstream) -> None:
    with raw_client(raw) as client:
        for key in ("k1", "k2", "k3"):
            assert raw_call(client, raw, "echo", key).kind == "success"
    assert raw.connections == 1  # initialize, notifications/initialized and three calls


def test_stale_pooled_connection_is_replaced_not_resent(raw: RawUpstream) -> None:
    with raw_client(raw) as client:
        assert raw_call(client, raw, "echo_then_close", "k1").kind == "success"
        time.sleep(0.05)  # the server's FIN reaches the idle pooled connection
        second = raw_call(client, raw, "echo", "k2")
    assert second.kind == "success", second
    assert raw.connections == 2


def test_idle_connection_expires(raw: RawUpstream) -> None:
    with raw_client(raw, keepalive_expiry=0.05) as client:
        assert raw_call(client, raw, "echo", "k1").kind == "success"
        before = raw.connections
        time.sleep(0.1)
        assert raw_call(client, raw, "echo", "k2").kind == "success"
    assert raw.connections == before + 1


@pytest.mark.parametrize(
    ("tool", "connections"),
    [
        ("chunked", 1),  # chunk extensions and trailers read; the connection is kept
        ("sse_chunked", 1),  # the end of the stream right behind our response is read; kept
        ("interim", 1),  # 1xx answers skipped
        ("close_delimited", 2),  # the body ends at the close; a new connection follows
        ("http10", 2),  # HTTP/1.0: not reused although the server keeps it open
        ("connection_close", 2),  # "Connection: close" honoured although the server keeps it open
        ("trailing_garbage", 2),  # bytes after the body: the connection is not trusted again
    ],
)
def test_response_framing(raw: RawUpstream, tool: str, connections: int) -> None:
    with raw_client(raw) as client:
        first = raw_call(client, raw, tool, "k1")
        assert first.kind == "success", first
        assert first.result is not None
        assert first.result["structuredContent"] == {"echo": {"x": "k1"}}
        assert raw_call(client, raw, "echo", "k2").kind == "success"
    assert raw.connections == connections


def test_connection_close_asked_by_the_client_is_honoured(raw: RawUpstream) -> None:
    with raw_client(raw, headers={"Connection": "close"}) as client:
        for key in ("k1", "k2"):
            assert raw_call(client, raw, "echo", key).kind == "success"
    assert raw.connections == 5  # the probe, initialize, notifications/initialized, two calls: one connection each


@pytest.mark.parametrize(
    ("answer", "kind", "reason"),
    [
        (b"HTTP/1.1 200\r\nContent-Length: {len}\r\n\r\n{body}", "success", "ok"),  # no reason phrase
        (b"HTTP/1.1 200 OK\nContent-Length: {len}\n\n{body}", "success", "ok"),  # bare LF line ends
        (b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: {len}\r\n\r\n{body}", "success", "ok"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Length: {len}\r\n\r\n{body}", "success", "ok"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Length: 1\r\n\r\n{body}", "uncertain", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n{body}", "uncertain", "response interrupted: ReadTimeout"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "uncertain", "RemoteProtocolError: malformed status line"),
        (b"HTTP/2 200\r\n\r\n", "uncertain", "RemoteProtocolError: malformed status line"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "uncertain", "RemoteProtocolError"),
        (b"HTTP/1.1 200 OK\r\nBad Header: 1\r\n\r\n", "uncertain", "RemoteProtocolError: malformed header"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n", "uncertain", "ReadTimeout"),  # head never ends
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", "invalid_response", "empty body (HTTP 204)"),
        (b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", "uncertain", "HTTP 503"),
    ],
)
def test_response_head_parsing(answer: bytes, kind: str, reason: str) -> None:
    with RawUpstream(answers={"scripted": answer}) as upstream, raw_client(upstream, read_timeout=0.3) as client:
        result = raw_call(client, upstream, "scripted", "k1")
        assert result.kind == kind, result
        assert reason in result.reason
        assert raw_call(client, upstream, "echo", "k2").kind == "success"  # whatever came before


def test_malformed_chunked_framing_is_uncertain(raw: RawUpstream) -> None:
    with raw_client(raw) as client:
        result = raw_call(client, raw, "bad_chunk", "k1")
    assert result.kind == "uncertain"
    assert "response interrupted: RemoteProtocolError" in result.reason
    assert result.status_code == 200


def test_redirect_is_not_followed(raw: RawUpstream) -> None:
    with raw_client(raw) as client:
        result = raw_call(client, raw, "redirect", "k1")
    assert result.kind == "http_error"
    assert result.reason == "HTTP 307"
    assert sum(raw.received.values()) == 1


def test_total_timeout_bounds_the_wait_for_the_response_head(fault: FaultUpstream) -> None:
    with UpstreamClient(fault.url, connect_timeout=1.0, read_timeout=5.0, total_timeout=0.3) as client:
        client.initialize()
        result = client.call_tool("hang", {}, idempotency_key="k")
    assert result.kind == "uncertain"
    assert result.reason == "total timeout passed before the response arrived"
    assert result.elapsed < 1.0
    assert fault.received["k"] == 1


def test_forked_child_opens_its_own_connection(raw: RawUpstream) -> None:
    with raw_client(raw) as client:
        assert raw_call(client, raw, "echo", "k-parent").kind == "success"
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 1  # the parent's pooled connection was still there
            try:
                if not client._pool._idle:
                    code = 0 if client.call_tool("echo", {}, idempotency_key="k-child").kind == "success" else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert raw.received["k-child"] == 1
        assert raw_call(client, raw, "echo", "k-parent-2").kind == "success"  # the parent's connection is intact
    assert raw.connections == 2


def test_pool_exhaustion_is_not_sent(raw: RawUpstream) -> None:
    with raw_client(raw, max_connections=1, pool_timeout=0.1) as client:
        client.initialize()
        slow: list[CallResult] = []
        thread = threading.Thread(target=lambda: slow.append(raw_call(client, raw, "slow", "k-slow")))
        thread.start()
        deadline = time.monotonic() + 5
        while raw.received["k-slow"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        waited = client.call_tool("echo", {}, idempotency_key="k-waits")
        assert time.monotonic() - started < RAW_SLOW_SECONDS
        thread.join()
        assert waited.kind == "not_sent"
        assert "PoolTimeout" in waited.reason
        assert raw.received["k-waits"] == 0
        assert slow[0].kind == "success"
        assert raw_call(client, raw, "echo", "k-after").kind == "success"  # the slot came back
    assert raw.connections == 1


def test_pool_wait_within_the_timeout_gets_the_freed_connection(raw: RawUpstream) -> None:
    with raw_client(raw, max_connections=1, pool_timeout=5.0) as client:
        client.initialize()
        thread = threading.Thread(target=raw_call, args=(client, raw, "slow", "k-slow"))
        thread.start()
        while raw.received["k-slow"] == 0:
            time.sleep(0.01)
        assert raw_call(client, raw, "echo", "k-waits").kind == "success"
        thread.join()
    assert raw.connections == 1


@pytest.mark.parametrize(("mode", "reason"), [("reset", "WriteError"), ("stall", "WriteTimeout")])
def test_write_failing_after_a_partial_send_is_uncertain(mode: str, reason: str) -> None:
    with (
        RawUpstream(large_body=64 * 1024, large_body_mode=mode) as upstream,
        raw_client(upstream, write_timeout=0.5) as client,
    ):
        client.initialize()
        # Far more than the socket buffers hold, so the write is still going when the server gives up.
        result = client.call_tool("echo", {"blob": "x" * (16 * 1024 * 1024)}, idempotency_key="k-big")
        assert result.kind == "uncertain", result
        assert reason in result.reason
        assert upstream.received["k-big"] == 1
        assert raw_call(client, upstream, "echo", "k-next").kind == "success"  # a new connection


def test_concurrent_calls_from_many_threads(raw: RawUpstream) -> None:
    with raw_client(raw, max_connections=4, pool_timeout=30.0) as client:
        results: list[CallResult] = []
        lock = threading.Lock()

        def work(worker: int) -> None:
            for i in range(15):
                key = f"w{worker}-{i}"
                result = client.call_tool("echo", {"x": key}, idempotency_key=key, output_schema=ECHO_OUTPUT_SCHEMA)
                assert result.result is not None
                assert result.result["structuredContent"] == {"echo": {"x": key}}  # no crossed answers
                with lock:
                    results.append(result)

        threads = [threading.Thread(target=work, args=(worker,)) for worker in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(results) == 120
    assert {result.kind for result in results} == {"success"}
    assert sum(raw.received.values()) == 120
    assert set(raw.received.values()) == {1}
    assert raw.connections <= 4


def test_unsupported_url_and_closed_client_are_not_sent() -> None:
    with UpstreamClient("ftp://127.0.0.1/mcp", connect_timeout=1.0, read_timeout=1.0) as client:
        result = client.call_tool("echo", {}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert "UnsupportedProtocol" in result.reason
        with pytest.raises(UpstreamError, match="UnsupportedProtocol"):
            client.ping()
    with RawUpstream() as upstream:
        client = raw_client(upstream)
        client.initialize()
        client.close()
        result = client.call_tool("echo", {}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert "ClientClosed" in result.reason
        assert upstream.received["k"] == 0


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1 (certificate file, key file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path)


def tls_server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context


def test_https_with_an_unverifiable_certificate_is_not_sent(tls_files: tuple[Path, Path]) -> None:
    with (
        RawUpstream(tls=tls_server_context(*tls_files)) as upstream,
        UpstreamClient(upstream.url, connect_timeout=2.0, read_timeout=2.0) as client,
    ):
        result = client.call_tool("echo", {}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert "ConnectError" in result.reason
        assert "CERTIFICATE_VERIFY_FAILED" in result.reason
        with pytest.raises(UpstreamError, match="CERTIFICATE_VERIFY_FAILED"):
            client.ping()
        assert upstream.received["k"] == 0


def test_https_round_trip_with_sni_and_keep_alive(tls_files: tuple[Path, Path]) -> None:
    trusting = ssl.create_default_context(cafile=str(tls_files[0]))
    with RawUpstream(tls=tls_server_context(*tls_files)) as upstream:
        url = f"https://localhost:{upstream.port}/mcp"
        with UpstreamClient(url, connect_timeout=2.0, read_timeout=2.0, ssl_context=trusting) as client:
            for key in ("k1", "k2"):
                assert raw_call(client, upstream, "echo", key).kind == "success"
            assert raw_call(client, upstream, "chunked", "k3").kind == "success"
        assert upstream.connections == 1
        assert upstream.sni == ["localhost"]


def test_session_expiry_reinitializes_on_the_only_connection(fault: FaultUpstream) -> None:
    with UpstreamClient(
        fault.url, connect_timeout=1.0, read_timeout=READ_TIMEOUT, max_connections=1, pool_timeout=0.2
    ) as client:
        client.ping()
        fault.expire_sessions()
        result = call(client, fault, "echo")
        assert result.kind == "not_sent"
        assert result.reason == "session_expired"
        assert fault.count("initialize") == 2  # the 404's connection was free for the handshake
        assert call(client, fault, "echo", key="key-2").kind == "success"


@pytest.mark.parametrize("key", ["k\r\nX-Injected: 1", "clé", "k\x00"])
def test_unsendable_idempotency_key_is_not_sent(client: UpstreamClient, fault: FaultUpstream, key: str) -> None:
    result = client.call_tool("echo", {}, idempotency_key=key)
    assert result.kind == "not_sent"
    assert result.reason.startswith("request not built: ValueError")
    assert fault.received[key] == 0
    assert fault.count("tools/call") == 0
