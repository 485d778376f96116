"""Upstream MCP servers for tests: the SDK demo server in a thread, and a raw fault-injecting server.

Both bind 127.0.0.1 on a free port and stop when their context manager exits.

``FaultUpstream`` speaks just enough MCP Streamable HTTP (initialize,
notifications/initialized, ping, paginated tools/list, tools/call, DELETE) to
drive ``UpstreamClient``; what ``tools/call`` does is chosen by the tool name
(see ``FAULT_TOOLS``). It counts every ``tools/call`` it receives per
idempotency key (``received``, before the session check) and every one it
processes (``executed``), so a test can assert that nothing was resent.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import uvicorn

from mcpgateway.demo_upstream import DemoState, build_app

ECHO_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"echo": {"type": "object"}},
    "required": ["echo"],
}

FAULT_TOOLS = [
    "echo",  # 200 JSON success with structuredContent
    "sse_echo",  # 200 SSE: notification, comment, priming event, then the response, split across writes
    "rpc_error",  # 200 JSON-RPC error -32602
    "is_error",  # 200 result with isError: true
    "bad_output",  # 200 result whose structuredContent violates ECHO_OUTPUT_SCHEMA
    "garbage",  # 200 text/html body
    "wrong_id",  # 200 valid response for another id
    "no_result",  # 200 response with neither result nor error
    "accepted",  # 202 with an empty body
    "hang",  # never answers (until the server stops)
    "slow",  # answers after SLOW_SECONDS
    "drop",  # status line and part of the body, then closes the connection
    "drop_early",  # closes the connection without any response
    "bad_gateway",  # 502 text body
    "http_400",  # 400 text body
    "http_400_rpc",  # 400 with a JSON-RPC error for our id
    "sse_no_response",  # SSE stream that ends after a notification
    "sse_garbage",  # SSE message event whose data is not JSON
    "sse_trickle",  # SSE keepalive comments every 50 ms, never a response
]
SLOW_SECONDS = 1.0


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (and refuses connections now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the SDK demo server -------------------------------------------------------------------------


@dataclass
class RunningDemo:
    url: str
    stats_url: str
    state: DemoState


@contextlib.contextmanager
def running_demo_upstream(*, stateless: bool = False) -> Iterator[RunningDemo]:
    """Run ``mcpgateway.demo_upstream`` with uvicorn in a daemon thread; stop it on exit."""
    state = DemoState()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(state, stateless=stateless), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("demo upstream did not start")
        time.sleep(0.02)
    try:
        yield RunningDemo(url=f"http://127.0.0.1:{port}/mcp", stats_url=f"http://127.0.0.1:{port}/stats", state=state)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


# -- the fault server ----------------------------------------------------------------------------


@dataclass
class ReceivedMessage:
    method: str | None
    headers: dict[str, str]
    body: Any


@dataclass
class FaultUpstream:
    """Scripted upstream; see the module docstring. Use as a context manager."""

    page_size: int = 7
    hang_seconds: float = 10.0
    protocol_version: str = "2025-11-25"
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: set[str] = field(default_factory=set)
    messages: list[ReceivedMessage] = field(default_factory=list)
    received: Counter[str] = field(default_factory=Counter)
    executed: Counter[str] = field(default_factory=Counter)
    meta_keys: list[str | None] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    # -- control ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/mcp"

    def count(self, method: str) -> int:
        with self.lock:
            return sum(1 for m in self.messages if m.method == method)

    def expire_sessions(self) -> None:
        """Forget every session: the next request carrying one gets 404."""
        with self.lock:
            self.sessions.clear()

    def tools(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "description": f"fault tool {name}",
                "inputSchema": {"type": "object"},
                "outputSchema": ECHO_OUTPUT_SCHEMA,
            }
            for name in FAULT_TOOLS
        ]

    def __enter__(self) -> FaultUpstream:
        upstream = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients hanging up on purpose are the point of this server

        class Handler(_Handler):
            pass

        Handler.upstream = upstream
        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        assert self._httpd is not None
        assert self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: FaultUpstream

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- responses -------------------------------------------------------------------------------

    def _send_bytes(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, message: Any, headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, json.dumps(message).encode(), "application/json", headers)

    def _result(self, rid: Any, result: dict[str, Any]) -> None:
        self._json(200, {"jsonrpc": "2.0", "id": rid, "result": result})

    def _sse(self, frames: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for frame in frames:
            self.wfile.write(frame)
            self.wfile.flush()
            time.sleep(0.01)

    # -- methods ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._send_bytes(405, b"", "text/plain", {"Allow": "POST, DELETE"})

    def do_DELETE(self) -> None:
        with self.upstream.lock:
            self.upstream.sessions.discard(self.headers.get("Mcp-Session-Id", ""))
        self._send_bytes(200, b"", "text/plain")

    def do_POST(self) -> None:
        up = self.upstream
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            msg = json.loads(raw)
        except ValueError:
            self._send_bytes(400, b"bad json", "text/plain")
            return
        method = msg.get("method") if isinstance(msg, dict) else None
        rid = msg.get("id") if isinstance(msg, dict) else None
        params = msg.get("params") or {}
        key = self.headers.get("Idempotency-Key")
        with up.lock:
            up.messages.append(ReceivedMessage(method=method, headers=dict(self.headers.items()), body=msg))
            if method == "tools/call":
                up.received[key or "-"] += 1
                up.meta_keys.append((params.get("_meta") or {}).get("io.tollgate/idempotency-key"))

        if method == "initialize":
            session_id = uuid.uuid4().hex
            with up.lock:
                up.sessions.add(session_id)
            result = {
                "protocolVersion": up.protocol_version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "fault-upstream", "version": "0"},
            }
            self._json(200, {"jsonrpc": "2.0", "id": rid, "result": result}, {"Mcp-Session-Id": session_id})
            return
        with up.lock:
            known = self.headers.get("Mcp-Session-Id") in up.sessions
        if not known:
            self._json(404, {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}})
            return
        if method == "notifications/initialized":
            self._send_bytes(202, b"", "text/plain")
        elif method == "ping":
            self._result(rid, {})
        elif method == "tools/list":
            tools = up.tools()
            start = int(params.get("cursor") or 0)
            page: dict[str, Any] = {"tools": tools[start : start + up.page_size]}
            if start + up.page_size < len(tools):
                page["nextCursor"] = str(start + up.page_size)
            self._result(rid, page)
        elif method == "tools/call":
            with up.lock:
                up.executed[key or "-"] += 1
            self._call(rid, params.get("name"), params.get("arguments") or {})
        else:
            self._json(200, {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})

    def _call(self, rid: Any, name: Any, arguments: dict[str, Any]) -> None:
        ok = {
            "content": [{"type": "text", "text": json.dumps(arguments)}],
            "structuredContent": {"echo": arguments},
            "isError": False,
        }
        if name == "echo":
            self._result(rid, ok)
        elif name == "sse_echo":
            response = json.dumps({"jsonrpc": "2.0", "id": rid, "result": ok}).encode()
            progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            self._sse(
                [
                    b"id: 0\r\ndata:\r\n\r\n",
                    b": keepalive\r\n\r\n",
                    b"event: message\r\ndata: " + json.dumps(progress).encode() + b"\r\n\r\n",
                    b"event: message\r",
                    b"\ndata: " + response[:10],
                    response[10:] + b"\r",
                    b"\n\r\n",
                ]
            )
        elif name == "rpc_error":
            error = {"code": -32602, "message": "bad arguments", "data": {"field": "x"}}
            self._json(200, {"jsonrpc": "2.0", "id": rid, "error": error})
        elif name == "is_error":
            self._result(rid, {"content": [{"type": "text", "text": "boom"}], "isError": True})
        elif name == "bad_output":
            self._result(rid, {"content": [], "structuredContent": {"echo": "not an object"}})
        elif name == "garbage":
            self._send_bytes(200, b"<html>oops</html>", "text/html")
        elif name == "wrong_id":
            self._result("someone-else", ok)
        elif name == "no_result":
            self._json(200, {"jsonrpc": "2.0", "id": rid})
        elif name == "accepted":
            self._send_bytes(202, b"", "application/json")
        elif name == "hang":
            self.upstream.stopping.wait(self.upstream.hang_seconds)
            self.close_connection = True
        elif name == "slow":
            time.sleep(SLOW_SECONDS)
            self._result(rid, ok)
        elif name == "drop":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"jsonrpc": "2.0", "id": ')
            self.wfile.flush()
            self.close_connection = True
        elif name == "drop_early":
            self.close_connection = True
        elif name == "bad_gateway":
            self._send_bytes(502, b"Bad Gateway", "text/plain")
        elif name == "http_400":
            self._send_bytes(400, b"Bad Request", "text/plain")
        elif name == "http_400_rpc":
            error = {"code": -32602, "message": "invalid params"}
            self._json(400, {"jsonrpc": "2.0", "id": rid, "error": error})
        elif name == "sse_no_response":
            progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            self._sse([b"data: " + json.dumps(progress).encode() + b"\n\n"])
        elif name == "sse_trickle":
            self._sse([b"data:\n\n"])
            while not self.upstream.stopping.wait(0.05):
                try:
                    self.wfile.write(b": keepalive\n\n")
                    self.wfile.flush()
                except OSError:
                    return
        elif name == "sse_garbage":
            self._sse([b"event: message\ndata: {not json\n\n"])
        else:
            self._json(200, {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"no tool {name}"}})
