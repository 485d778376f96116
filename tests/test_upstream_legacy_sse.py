"""LegacySseClient (the legacy HTTP+SSE transport of MCP 2024-11-05) against the official SDK's SSE server and a
scripted SSE server that loses, refuses or misdirects on demand.

Each fault case asserts the CallResult kind and that the server received the ``tools/call`` at most once:
a lost answer after the POST was accepted is ``uncertain``, a refused connection before sending is
``not_sent``, a refused POST ``http_error``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from mcpgateway.upstream.client import UpstreamError
from mcpgateway.upstream.legacy_sse import LegacySseClient
from tests.upstream_server import free_port, running_sdk_upstream

pytestmark = pytest.mark.timeout(60)


def _client(url: str, **options: Any) -> LegacySseClient:
    return LegacySseClient(url, **{"connect_timeout": 2, "read_timeout": 5, "total_timeout": 10, **options})


def test_initialize_list_ping_and_call_against_the_sdk_sse_server() -> None:
    with running_sdk_upstream("legacy", sse=True) as upstream, _client(upstream.url) as client:
        session = client.initialize()
        assert session.protocol_version == "2024-11-05"
        assert session.server_info["name"] == "legacy"
        assert [tool["name"] for tool in client.list_tools()] == ["charge", "append", "quick"]
        client.ping()
        trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        result = client.call_tool("charge", {"amount": 3}, idempotency_key="w:k1", request_id="act_1", headers=trace)
        assert (result.kind, result.request_id) == ("success", "act_1")
        assert result.result is not None
        assert result.result["structuredContent"] == {"charged": 3, "server": "legacy"}
        assert result.response_sha256
        error = client.call_tool("charge", {"amount": "not a number"}, idempotency_key="w:k2")
        assert error.kind == "tool_error"  # the SDK reports bad arguments as a tool error
        assert upstream.calls["charge"] == 1
        calls = [r for r in upstream.requests if r.method == "tools/call"]
        assert calls[0].meta["io.tollgate/idempotency-key"] == "w:k1"
        assert calls[0].headers["idempotency-key"] == "w:k1"
        assert calls[0].headers["traceparent"] == trace["traceparent"]  # on the call's POST only
        assert all("traceparent" not in r.headers for r in upstream.requests if r.method != "tools/call")


def test_a_bearer_token_goes_on_the_stream_and_the_posts_and_a_refusal_is_not_sent_with_its_status() -> None:
    with running_sdk_upstream("legacy", sse=True, tokens={"sse-token"}) as upstream:
        with _client(upstream.url) as client:
            refused = client.call_tool("charge", {"amount": 1}, idempotency_key="k")
            assert (refused.kind, refused.status_code) == ("not_sent", 401)
            assert refused.reason.startswith("initialize failed:")
            with pytest.raises(UpstreamError) as caught:
                client.list_tools()
            assert caught.value.status_code == 401
            client.authorize("Bearer sse-token")
            assert client.call_tool("charge", {"amount": 1}, idempotency_key="k").kind == "success"
        assert upstream.calls["charge"] == 1
        assert {r.headers["authorization"] for r in upstream.requests} == {"Bearer sse-token"}


def test_a_refused_connection_is_not_sent() -> None:
    with _client(f"http://127.0.0.1:{free_port()}/sse") as client:
        result = client.call_tool("charge", {"amount": 1}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert result.reason.startswith("initialize failed: SSE stream: ConnectError")
        with pytest.raises(UpstreamError):
            client.initialize()


# --- a scripted SSE server ------------------------------------------------------------------------------------


@dataclass
class Scripted:
    """What the scripted server does with a ``tools/call``: ``answer`` (the result), ``lose`` (accept it, then end
    the stream), ``hang`` (accept it, answer nothing), ``refuse`` (400), ``fail`` (503) or ``error`` (a
    JSON-RPC error on the stream); ``endpoint`` overrides the endpoint event's URL."""

    mode: str = "answer"
    endpoint: str | None = None
    calls: int = 0
    streams: dict[str, queue.Queue[bytes | None]] = field(default_factory=dict)


@contextlib.contextmanager
def scripted_sse(script: Scripted) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            session = f"s{len(script.streams)}"
            events: queue.Queue[bytes | None] = queue.Queue()
            script.streams[session] = events
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            endpoint = script.endpoint or f"/messages/?session_id={session}"
            self.wfile.write(f"event: endpoint\r\ndata: {endpoint}\r\n\r\n".encode())
            self.wfile.flush()
            while (event := events.get(timeout=30)) is not None:
                self.wfile.write(event)
                self.wfile.flush()
            self.close_connection = True

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            events = script.streams[parse_qs(urlsplit(self.path).query)["session_id"][0]]
            method, rid = body.get("method"), body.get("id")
            answer: dict[str, Any] | None = None
            status = 202
            result: dict[str, Any]
            if method == "initialize":
                result = {"protocolVersion": "2024-11-05", "capabilities": {}, "serverInfo": {"name": "scripted"}}
                answer = {"jsonrpc": "2.0", "id": rid, "result": result}
            elif method == "tools/call":
                script.calls += 1
                if script.mode == "answer":
                    result = {"content": [{"type": "text", "text": "ok"}]}
                    answer = {"jsonrpc": "2.0", "id": rid, "result": result}
                elif script.mode == "error":
                    answer = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "no such tool"}}
                elif script.mode == "refuse":
                    status = 400
                elif script.mode == "fail":
                    status = 503
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if answer is not None:
                # Another message of the session's, and a notification, come first: both are skipped.
                events.put(b'event: message\r\ndata: {"jsonrpc":"2.0","id":"other","result":{}}\r\n\r\n')
                events.put(b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/message"}\r\n\r\n')
                events.put(f"event: message\r\ndata: {json.dumps(answer)}\r\n\r\n".encode())
            elif method == "tools/call" and script.mode == "lose":
                events.put(None)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/sse"
    finally:
        for events in script.streams.values():
            events.put(None)
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("answer", "success"),
        ("error", "jsonrpc_error"),
        ("refuse", "http_error"),
        ("fail", "uncertain"),
        ("lose", "uncertain"),
        ("hang", "uncertain"),
    ],
)
def test_each_outcome_of_a_call_is_classified_and_the_call_is_sent_once(mode: str, kind: str) -> None:
    script = Scripted(mode=mode)
    with scripted_sse(script) as url, _client(url, read_timeout=0.5, total_timeout=1) as client:
        result = client.call_tool("charge", {"amount": 1}, idempotency_key="k", request_id=7)
        assert result.kind == kind, result.reason
        assert script.calls == 1
    if mode == "lose":
        assert "no answer on the SSE stream" in result.reason
    if mode == "refuse":
        assert result.status_code == 400


def test_an_endpoint_on_another_origin_is_refused_before_anything_is_sent() -> None:
    script = Scripted(endpoint=f"http://127.0.0.1:{free_port()}/messages/?session_id=s0")
    with scripted_sse(script) as url, _client(url) as client:
        result = client.call_tool("charge", {"amount": 1}, idempotency_key="k")
        assert result.kind == "not_sent"
        assert "another origin" in result.reason
    assert script.calls == 0


def test_a_call_past_its_send_deadline_is_not_sent() -> None:
    script = Scripted()
    with scripted_sse(script) as url, _client(url) as client:
        result = client.call_tool("charge", {"amount": 1}, idempotency_key="k", send_by=0.0)
        assert result.kind == "not_sent"
    assert script.calls == 0


def test_a_forked_child_does_not_use_the_parents_kept_alive_connections() -> None:
    script = Scripted()
    with scripted_sse(script) as url, _client(url) as client:
        assert client.call_tool("charge", {}, idempotency_key="k-parent").kind == "success"
        assert client._pool._idle  # the POST connection, kept alive
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 1
            try:
                if not client._pool._idle:
                    code = 0 if client.call_tool("charge", {}, idempotency_key="k-child").kind == "success" else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert client.call_tool("charge", {}, idempotency_key="k-parent-2").kind == "success"
    assert script.calls == 3
