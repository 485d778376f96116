"""UpstreamClient against the SDK demo upstream and against a fault-injecting upstream.

Every fault case asserts the CallResult kind and that the upstream received the
``tools/call`` exactly once: the client never resends a call.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from mcpgateway.upstream import IDEMPOTENCY_META_KEY, CallResult, UpstreamClient, UpstreamError
from tests.upstream_server import (
    ECHO_OUTPUT_SCHEMA,
    FAULT_TOOLS,
    FaultUpstream,
    free_port,
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


def call(client: UpstreamClient, fault: FaultUpstream, tool: str, key: str = "key-1") -> CallResult:
    result = client.call_tool(tool, {"x": 1}, idempotency_key=key, output_schema=ECHO_OUTPUT_SCHEMA)
    assert fault.received[key] == 1, "the upstream must see the call exactly once"
    assert fault.meta_keys[-1] == key
    return result


# -- the SDK demo upstream -----------------------------------------------------------------------


def test_demo_upstream_round_trip() -> None:
    with (
        running_demo_upstream() as demo,
        UpstreamClient(demo.url, connect_timeout=2.0, read_timeout=5.0) as client,
    ):
        session = client.initialize()
        assert session.session_id
        assert session.protocol_version == "2025-11-25"
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


def test_demo_upstream_session_expiry_reinitializes_for_tools_list() -> None:
    with (
        running_demo_upstream() as demo,
        UpstreamClient(demo.url, connect_timeout=2.0, read_timeout=5.0) as client,
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
    assert methods == ["initialize", "notifications/initialized", "ping"]
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


def test_sse_framed_response(client: UpstreamClient, fault: FaultUpstream) -> None:
    result = call(client, fault, "sse_echo")
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
def test_fault_matrix(client: UpstreamClient, fault: FaultUpstream, tool: str, kind: str, reason: str) -> None:
    result = call(client, fault, tool)
    assert result.kind == kind, result
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
