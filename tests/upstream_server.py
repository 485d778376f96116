"""Upstream MCP servers for tests: the SDK demo server in a thread, and a raw fault-injecting server.

Both bind 127.0.0.1 on a free port and stop when their context manager exits.

``running_demo_upstream`` records every POST the SDK server receives (method,
headers, ``params._meta``) in ``RunningDemo.requests``, so a test can see the
protocol era's envelope and headers as they arrived.

``FaultUpstream`` speaks just enough MCP Streamable HTTP (initialize,
notifications/initialized, ping, paginated tools/list, tools/call, DELETE) to
drive ``UpstreamClient``; what ``tools/call`` does is chosen by the tool name
(see ``FAULT_TOOLS`` and ``UNLISTED_FAULT_TOOLS``). It counts every ``tools/call`` it receives per
idempotency key (``received``, before the session check) and every one it
processes (``executed``), so a test can assert that nothing was resent. By
default it speaks only the handshake era; with ``stateless_versions`` it also
serves the stateless revision (``server/discover``, the ``_meta`` envelope and
the ``Mcp-Method``/``Mcp-Name``/``Mcp-Param-*`` headers checked as the SDK
server checks them), routed by ``MCP-Protocol-Version`` as the SDK routes it;
``handshake=False`` refuses the handshake with ``-32022``, and
``discover_answers`` scripts the next answers to ``server/discover`` and ``call_answers`` the
answer to every ``tools/call`` of a tool (by name) in place of the tool's own.

``RawUpstream`` writes its answers byte for byte on raw sockets (chunked coding,
close-delimited bodies, HTTP/1.0, interim responses, TLS, a reset in the middle of
a request) and counts the connections it accepts.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import socket
import ssl
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypedDict

import uvicorn

from mcpgateway.demo_upstream import DemoState, build_app

ECHO_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"echo": {"type": "object"}},
    "required": ["echo"],
}


class ChargeResult(TypedDict):
    """Structured output of the SDK servers' tools (``running_sdk_upstream``)."""

    charged: int
    server: str


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
UNLISTED_FAULT_TOOLS = [  # answered like the others, but not in tools/list (the gateway's catalog tests count those)
    "input_required",  # 200 result with resultType "input_required" (an elicitation the client must answer)
    "unsupported_version",  # 400 JSON-RPC error -32022 for our id (the upstream stopped serving our version)
    "param_echo",  # echo, plus the Mcp-Param-* headers received (its inputSchema: PARAM_TOOL_SCHEMA)
]
SLOW_SECONDS = 1.0
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
STATELESS_VERSION = "2026-07-28"
PROTOCOL_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO_META_KEY = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPABILITIES_META_KEY = "io.modelcontextprotocol/clientCapabilities"
PARAM_TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "options": {"type": "object", "properties": {"dry_run": {"type": "boolean", "x-mcp-header": "Dry-Run"}}},
        "count": {"type": "integer", "x-mcp-header": "Count"},
        "note": {"type": "string"},
    },
}
"""inputSchema of the unlisted fault tool ``param_echo``: three arguments mirrored in ``Mcp-Param-*`` headers."""


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (and refuses connections now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the SDK demo server -------------------------------------------------------------------------


@dataclass
class SeenRequest:
    """One POST as the demo upstream received it: JSON-RPC method, headers (lower-case names), ``params._meta``."""

    method: str | None
    headers: dict[str, str]
    meta: dict[str, Any]


@dataclass
class RunningDemo:
    url: str
    stats_url: str
    state: DemoState
    requests: list[SeenRequest] = field(default_factory=list)

    def methods(self) -> list[str | None]:
        return [request.method for request in self.requests]


_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_App = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


def _recording(app: _App, seen: list[SeenRequest]) -> _App:
    """``app`` behind an ASGI layer that records each POST (its body is read once and replayed to ``app``)."""

    async def recorded(scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body arrived
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        params = decoded.get("params") if isinstance(decoded, dict) else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        seen.append(
            SeenRequest(
                method=decoded.get("method") if isinstance(decoded, dict) else None,
                headers={k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]},
                meta=meta if isinstance(meta, dict) else {},
            )
        )
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return recorded


@contextlib.contextmanager
def running_asgi(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a daemon thread on 127.0.0.1; yields its base URL; stops it on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the ASGI server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextlib.contextmanager
def running_demo_upstream(*, stateless: bool = False) -> Iterator[RunningDemo]:
    """Run ``mcpgateway.demo_upstream`` with uvicorn in a daemon thread, recording its POSTs; stop it on exit.

    The SDK serves both protocol eras either way: ``stateless`` only turns off the
    handshake era's ``Mcp-Session-Id`` sessions.
    """
    state = DemoState()
    seen: list[SeenRequest] = []
    with running_asgi(_recording(build_app(state, stateless=stateless), seen)) as base:
        yield RunningDemo(url=f"{base}/mcp", stats_url=f"{base}/stats", state=state, requests=seen)


# -- the fault server ----------------------------------------------------------------------------


@dataclass
class ReceivedMessage:
    method: str | None
    headers: dict[str, str]
    body: Any


@dataclass
class Scripted:
    """One scripted HTTP answer: ``status`` and ``body`` (bytes as they are; a callable of the request id, or
    any other value, as JSON), or ``action`` ``"drop"`` (close without answering)."""

    status: int = 200
    body: Any = b""
    content_type: str = "application/json"
    action: str = ""


def rpc_error(code: int, message: str = "error", data: Any = None) -> Callable[[Any], dict[str, Any]]:
    """A ``Scripted`` body: a JSON-RPC error for the request's id."""

    def body(rid: Any) -> dict[str, Any]:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        return {"jsonrpc": "2.0", "id": rid, "error": error}

    return body


def rpc_result(result: dict[str, Any]) -> Callable[[Any], dict[str, Any]]:
    """A ``Scripted`` body: a JSON-RPC result for the request's id."""
    return lambda rid: {"jsonrpc": "2.0", "id": rid, "result": result}


def discover_result(versions: list[str]) -> dict[str, Any]:
    """A ``server/discover`` result listing ``versions``, shaped as the SDK server shapes it."""
    return {
        "supportedVersions": versions,
        "capabilities": {"tools": {"listChanged": False}},
        "instructions": "fault upstream",
        "resultType": "complete",
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "fault-upstream", "version": "0"}},
    }


def decode_header_value(value: str | None) -> str | None:
    """A stateless-era header value as sent (``=?base64?...?=`` unwrapped); ``None`` if absent or malformed."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    try:
        return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


@dataclass
class FaultUpstream:
    """Scripted upstream; see the module docstring. Use as a context manager.

    ``stateless_versions`` (empty: handshake only) may be changed while it runs,
    to make the upstream change its mind; so may ``handshake`` and
    ``discover_answers`` (consumed first to last, whatever the era).
    """

    page_size: int = 7
    hang_seconds: float = 10.0
    protocol_version: str = "2025-11-25"
    stateless_versions: list[str] = field(default_factory=list)
    handshake: bool = True
    discover_answers: list[Scripted] = field(default_factory=list)
    call_answers: dict[str, Scripted] = field(default_factory=dict)
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

    def methods(self) -> list[str | None]:
        with self.lock:
            return [m.method for m in self.messages]

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
            # Tests open up to 8 connections at once: the default listen backlog (5) can overflow on a busy
            # host, and the kernel then retries the SYN a second later, past the clients' 1 s connect timeout.
            request_queue_size = 64

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
            scripted = up.discover_answers.pop(0) if method == "server/discover" and up.discover_answers else None
            stateless = bool(up.stateless_versions)

        if scripted is not None:
            self._scripted(scripted, rid)
            return
        version = self.headers.get("MCP-Protocol-Version")
        # The SDK's routing: a version header that is not a handshake revision goes to the stateless
        # era, anything else (no header: initialize) to the handshake era.
        if stateless and version is not None and version not in HANDSHAKE_VERSIONS:
            self._stateless(method, rid, params, key)
            return
        if not up.handshake:
            data = {"supported": list(up.stateless_versions), "requested": version or params.get("protocolVersion")}
            self._json(400, rpc_error(-32022, "Unsupported protocol version", data)(rid))
            return
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
            self._result(rid, self._tools_page(params))
        elif method == "tools/call":
            self._executed_call(rid, params.get("name"), params, key)
        else:
            self._json(200, {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})

    def _scripted(self, answer: Scripted, rid: Any) -> None:
        if answer.action == "drop":
            self.close_connection = True
            return
        body = answer.body(rid) if callable(answer.body) else answer.body
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self._send_bytes(answer.status, raw, answer.content_type)

    def _stateless(self, method: Any, rid: Any, params: dict[str, Any], key: str | None) -> None:
        """A stateless-era request, checked in the SDK server's order: envelope, headers, version."""
        up = self.upstream
        meta = params.get("_meta") if isinstance(params, dict) else None
        if not isinstance(meta, dict) or not {PROTOCOL_VERSION_META_KEY, CLIENT_CAPABILITIES_META_KEY} <= set(meta):
            self._json(400, rpc_error(-32602, "params._meta lacks the envelope")(rid))
            return
        version = meta[PROTOCOL_VERSION_META_KEY]
        name = params.get("name")
        if (
            self.headers.get("MCP-Protocol-Version") != version
            or self.headers.get("Mcp-Method") != method
            or (method == "tools/call" and decode_header_value(self.headers.get("Mcp-Name")) != name)
        ):
            self._json(400, rpc_error(-32020, "header mismatch")(rid))
            return
        with up.lock:
            supported = list(up.stateless_versions)
        if version not in supported:
            data = {"supported": supported, "requested": version}
            self._json(400, rpc_error(-32022, "Unsupported protocol version", data)(rid))
            return
        if method == "server/discover":
            self._result(rid, discover_result(supported))
        elif method == "tools/list":
            self._result(rid, {**self._tools_page(params), "resultType": "complete"})
        elif method == "tools/call":
            self._executed_call(rid, name, params, key)
        else:
            self._json(404, rpc_error(-32601, "Method not found")(rid))

    def _tools_page(self, params: dict[str, Any]) -> dict[str, Any]:
        """The page of ``tools/list`` that ``params.cursor`` names, with the next cursor when more follow."""
        up = self.upstream
        tools = up.tools()
        start = int(params.get("cursor") or 0)
        page: dict[str, Any] = {"tools": tools[start : start + up.page_size]}
        if start + up.page_size < len(tools):
            page["nextCursor"] = str(start + up.page_size)
        return page

    def _executed_call(self, rid: Any, name: Any, params: dict[str, Any], key: str | None) -> None:
        """A ``tools/call`` that runs: counted under its idempotency key, then answered."""
        with self.upstream.lock:
            self.upstream.executed[key or "-"] += 1
            scripted = self.upstream.call_answers.get(name) if isinstance(name, str) else None
        if scripted is not None:
            self._scripted(scripted, rid)
            return
        self._call(rid, name, params.get("arguments") or {})

    def _call(self, rid: Any, name: Any, arguments: dict[str, Any]) -> None:
        ok = {
            "content": [{"type": "text", "text": json.dumps(arguments)}],
            "structuredContent": {"echo": arguments},
            "isError": False,
        }
        if name == "echo":
            self._result(rid, ok)
        elif name == "param_echo":
            params = {k: v for k, v in self.headers.items() if k.lower().startswith("mcp-param-")}
            self._result(rid, {**ok, "structuredContent": {"echo": arguments, "headers": params}})
        elif name == "input_required":
            elicit = {"method": "elicitation/create", "params": {"message": "Which account?", "requestedSchema": {}}}
            self._result(rid, {"resultType": "input_required", "inputRequests": {"account": elicit}})
        elif name == "unsupported_version":
            data = {"supported": ["2099-01-01"], "requested": STATELESS_VERSION}
            self._json(400, rpc_error(-32022, "Unsupported protocol version", data)(rid))
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


# -- the raw-socket server -----------------------------------------------------------------------

RAW_TOOLS = [
    "echo",  # 200 JSON with Content-Length; the connection stays open
    "echo_then_close",  # the same answer, no "Connection: close", then the server closes the connection
    "slow",  # echo after RAW_SLOW_SECONDS
    "chunked",  # chunked transfer coding: chunk extensions, upper-case hex, trailers, written piecewise
    "sse_chunked",  # SSE over chunked coding: a notification, then our response and the last chunk together
    "close_delimited",  # no Content-Length, no Transfer-Encoding: the body ends when the server closes
    "http10",  # an HTTP/1.0 answer with Content-Length; the server keeps the connection open
    "connection_close",  # HTTP/1.1 with "Connection: close"; the server keeps the connection open
    "interim",  # 100 Continue and 103 Early Hints before the 200
    "trailing_garbage",  # a complete answer followed by bytes nobody asked for
    "bad_chunk",  # a chunk size line that is not hexadecimal
    "redirect",  # 307 to another URL (which the client must not follow)
]
RAW_SLOW_SECONDS = 1.0


def _raw_answer(status: bytes, body: bytes, *, version: bytes = b"HTTP/1.1", extra: bytes = b"") -> bytes:
    return (
        version
        + b" "
        + status
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n"
        + extra
        + b"\r\n"
        + body
    )


@dataclass
class RawUpstream:
    """An HTTP/1.1 upstream on raw sockets, for the wire cases ``FaultUpstream`` cannot produce.

    Speaks just enough MCP for a stateless handshake (no session id), ``ping`` and
    ``tools/call``, whose answer is written byte for byte as the tool name says
    (``RAW_TOOLS``). Counts every ``tools/call`` received per idempotency key
    (``received``, from the request head) and every TCP connection accepted
    (``connections``). ``answers`` adds tools whose answer is the given bytes, with
    ``{body}`` replaced by the JSON-RPC success response and ``{len}`` by its
    length. With ``tls`` (a server context) it speaks HTTPS and records the SNI
    names it was offered (``sni``). With ``large_body`` set, a request body
    longer than ``large_body`` bytes is read only that far, then the connection is
    reset (``large_body_mode="reset"``) or left unread until the server stops
    (``"stall"``), so the client's write fails part-way.
    """

    tls: ssl.SSLContext | None = None
    answers: dict[str, bytes] = field(default_factory=dict)
    large_body: int | None = None
    large_body_mode: str = "reset"
    lock: threading.Lock = field(default_factory=threading.Lock)
    received: Counter[str] = field(default_factory=Counter)
    connections: int = 0
    sni: list[str | None] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _open: set[socket.socket] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self._listener is not None
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/mcp"

    def __enter__(self) -> RawUpstream:
        if self.tls is not None:
            self.tls.sni_callback = lambda _sock, name, _ctx: self.sni.append(name)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # A small, fixed receive buffer (inherited by accepted sockets) so that a client writing a
        # large body to a connection nobody reads blocks after a few buffers, not after megabytes.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.settimeout(0.05)
        self._listener = listener
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._threads[0].join(5)  # the accept loop: no connection threads start after this
        with self.lock:
            open_sockets = list(self._open)
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads[1:]:
            thread.join(5)
        assert self._listener is not None
        self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self.stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.connections += 1
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(None)
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
        except OSError:
            sock.close()
            return
        with self.lock:
            self._open.add(sock)
        reader = sock.makefile("rb")
        try:
            while not self.stopping.is_set() and self._one_request(sock, reader):
                pass
        except (OSError, ValueError):
            pass  # the client went away, or the server is stopping
        finally:
            with self.lock:
                self._open.discard(sock)
            reader.close()
            sock.close()

    def _one_request(self, sock: socket.socket, reader: Any) -> bool:
        """Read and answer one request; False when the connection is to be closed."""
        request_line = reader.readline()
        if not request_line:
            return False
        headers: dict[str, str] = {}
        while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        key = headers.get("idempotency-key")
        if self.large_body is not None and length > self.large_body:
            with self.lock:
                self.received[key or "-"] += 1
            reader.read(self.large_body)
            if self.large_body_mode == "stall":
                self.stopping.wait(10)
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
            return False
        body = reader.read(length)
        if request_line.startswith(b"DELETE"):
            sock.sendall(_raw_answer(b"200 OK", b""))
            return True
        msg = json.loads(body)
        method, rid = msg.get("method"), msg.get("id")
        if method == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw-upstream", "version": "0"},
            }
            sock.sendall(_raw_answer(b"200 OK", json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode()))
            return True
        if method == "notifications/initialized":
            sock.sendall(_raw_answer(b"202 Accepted", b""))
            return True
        if method != "tools/call":
            sock.sendall(_raw_answer(b"200 OK", json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}}).encode()))
            return True
        with self.lock:
            self.received[key or "-"] += 1
        params = msg.get("params") or {}
        return self._call(sock, rid, params.get("name"), params.get("arguments") or {})

    def _call(self, sock: socket.socket, rid: Any, name: Any, arguments: dict[str, Any]) -> bool:
        ok = {
            "content": [{"type": "text", "text": json.dumps(arguments)}],
            "structuredContent": {"echo": arguments},
            "isError": False,
        }
        body = json.dumps({"jsonrpc": "2.0", "id": rid, "result": ok}).encode()
        if name in self.answers:
            sock.sendall(self.answers[name].replace(b"{len}", str(len(body)).encode()).replace(b"{body}", body))
            return True
        if name in ("echo", "echo_then_close", "slow"):
            if name == "slow":
                time.sleep(RAW_SLOW_SECONDS)
            sock.sendall(_raw_answer(b"200 OK", body))
            return name != "echo_then_close"
        if name == "chunked":
            sock.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                b"Trailer: X-Checksum\r\n\r\n"
            )
            a, b, c = body[:10], body[10:25], body[25:]
            for frame in (
                f"{len(a):x};name=value\r\n".encode() + a + b"\r\n",
                f"{len(b):X} ; flag\r\n".encode() + b + b"\r\n",
                f'{len(c):x};q="quoted;text"\r\n'.encode() + c + b"\r\n",
                b"0;last\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n",
            ):
                time.sleep(0.005)
                sock.sendall(frame)
            return True
        if name == "sse_chunked":
            progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            first = b"event: message\r\ndata: " + json.dumps(progress).encode() + b"\r\n\r\n"
            last = b"event: message\r\ndata: " + body + b"\r\n\r\n"
            sock.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + f"{len(first):x}\r\n".encode()
                + first
                + b"\r\n"
            )
            time.sleep(0.005)
            sock.sendall(f"{len(last):x}\r\n".encode() + last + b"\r\n0\r\n\r\n")
            return True
        if name == "close_delimited":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + body[:20])
            time.sleep(0.005)
            sock.sendall(body[20:])
            return False
        if name == "http10":
            sock.sendall(_raw_answer(b"200 OK", body, version=b"HTTP/1.0"))
            return True
        if name == "connection_close":
            sock.sendall(_raw_answer(b"200 OK", body, extra=b"Connection: close\r\n"))
            return True
        if name == "interim":
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n")
            sock.sendall(_raw_answer(b"200 OK", body))
            return True
        if name == "trailing_garbage":
            sock.sendall(_raw_answer(b"200 OK", body) + b"HTTP/1.1 200 OK\r\n")
            return True
        if name == "redirect":
            sock.sendall(_raw_answer(b"307 Temporary Redirect", b"", extra=b"Location: /elsewhere\r\n"))
            return True
        if name == "bad_chunk":
            sock.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
            )
            return False
        sock.sendall(
            _raw_answer(
                b"200 OK",
                json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "no tool"}}).encode(),
            )
        )
        return True


# -- SDK servers for several upstreams -------------------------------------------------------------


class StaticTokenVerifier:
    """The SDK's ``TokenVerifier`` for a set of bearer tokens: the server answers 401 to any other."""

    def __init__(self, tokens: set[str]) -> None:
        self.tokens = tokens

    async def verify_token(self, token: str) -> Any:
        from mcp.server.auth.provider import AccessToken

        if token not in self.tokens:
            return None
        return AccessToken(token=token, client_id="tollgate", scopes=[], expires_at=None)


@dataclass
class SdkUpstream:
    """A running SDK server: its URL, the calls each tool ran (by tool name), the headers each request carried."""

    url: str
    calls: Counter[str]
    requests: list[SeenRequest]
    release: threading.Event


@contextlib.contextmanager
def running_sdk_upstream(
    name: str,
    *,
    tokens: set[str] | None = None,
    hang: str | None = None,
    verifier: Any = None,
    sse: bool = False,
) -> Iterator[SdkUpstream]:
    """An MCP SDK server with tools ``charge``, ``append`` and ``quick`` (and ``hang`` when named: it waits
    until ``release`` is set); with ``tokens``, the SDK's bearer-token check (401 without one of them); with
    ``verifier`` (an SDK ``TokenVerifier``, such as ``IssuedTokenVerifier``), that check instead. With ``sse``
    it speaks the legacy HTTP+SSE transport (the SDK's ``sse_app``): ``url`` is its SSE endpoint, ``/sse``."""
    import anyio
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer
    from pydantic import AnyHttpUrl

    calls: Counter[str] = Counter()
    release = threading.Event()
    seen: list[SeenRequest] = []
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    auth: dict[str, Any] = {}
    if tokens is not None or verifier is not None:
        auth = {
            "token_verifier": verifier if verifier is not None else StaticTokenVerifier(tokens or set()),
            "auth": AuthSettings(
                issuer_url=AnyHttpUrl(base),
                resource_server_url=AnyHttpUrl(f"{base}/mcp"),
                required_scopes=[],
                validate_token_resource=False,
            ),
        }
    server: MCPServer = MCPServer(name, version="1.0.0", **auth)

    @server.tool(name="charge", description="Charge an amount.")
    def charge(amount: int) -> ChargeResult:
        calls["charge"] += 1
        return ChargeResult(charged=amount, server=name)

    @server.tool(name="append", description="Append (a name another server may expose too).")
    def append(text: str) -> ChargeResult:
        calls["append"] += 1
        return ChargeResult(charged=len(text), server=name)

    @server.tool(name="quick", description="Answer at once.")
    def quick() -> ChargeResult:
        calls["quick"] += 1
        return ChargeResult(charged=0, server=name)

    if hang is not None:

        @server.tool(name=hang, description="Wait until the test releases it.")
        async def waiting() -> ChargeResult:
            calls[hang] += 1
            await anyio.to_thread.run_sync(release.wait)
            return ChargeResult(charged=0, server=name)

    if sse:
        app = server.sse_app(host="127.0.0.1")
    else:
        app = server.streamable_http_app(streamable_http_path="/mcp", json_response=True, host="127.0.0.1")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    uv = uvicorn.Server(uvicorn.Config(_recording(app, seen), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the SDK server did not start")
        time.sleep(0.02)
    try:
        yield SdkUpstream(url=f"{base}/sse" if sse else f"{base}/mcp", calls=calls, requests=seen, release=release)
    finally:
        release.set()
        uv.should_exit = True
        thread.join(10)
        sock.close()


# -- an OAuth 2.0 token endpoint (authlib's server side) and the tokens it issued ------------------


@dataclass
class IssuedToken:
    """A token the endpoint issued: to which client, for which scope and resource, until when (``time.time()``)."""

    client_id: str
    scope: str
    resource: str | None
    expires_at: float
    revoked: bool = False


@dataclass
class TokenEndpoint:
    """A running token endpoint: its URL, its clients (id -> secret), what it issued and each request's form.

    ``lifetime`` is the ``expires_in`` it grants; ``gate``, when cleared, holds every answer until set.
    ``authorization`` records each request's ``Authorization`` header.
    """

    url: str
    clients: dict[str, str]
    tokens: dict[str, IssuedToken]
    forms: list[dict[str, str]]
    authorization: list[str | None]
    gate: threading.Event
    lifetime: int = 3600

    def issued_to(self, client_id: str) -> list[str]:
        return [value for value, issued in self.tokens.items() if issued.client_id == client_id]

    def revoke_all(self) -> None:
        for issued in self.tokens.values():
            issued.revoked = True


class IssuedTokenVerifier:
    """The SDK's ``TokenVerifier`` accepting only tokens ``endpoint`` issued, neither revoked nor expired."""

    def __init__(self, endpoint: TokenEndpoint, *, resource: str | None = None) -> None:
        self.endpoint = endpoint
        self.resource = resource

    async def verify_token(self, token: str) -> Any:
        from mcp.server.auth.provider import AccessToken

        issued = self.endpoint.tokens.get(token)
        if issued is None or issued.revoked or issued.expires_at <= time.time():
            return None
        if self.resource is not None and issued.resource != self.resource:
            return None  # RFC 8707: a token for another resource is not for this server
        return AccessToken(
            token=token, client_id=issued.client_id, scopes=issued.scope.split(), expires_at=int(issued.expires_at)
        )


@contextlib.contextmanager
def running_token_endpoint(clients: dict[str, str], *, lifetime: int = 3600) -> Iterator[TokenEndpoint]:
    """An OAuth 2.0 token endpoint (authlib's ``AuthorizationServer`` with ``ClientCredentialsGrant``,
    ``client_secret_basic`` only) served by uvicorn on 127.0.0.1 at ``<base>/token``; stopped on exit."""
    import secrets
    from urllib.parse import parse_qsl

    import anyio
    from authlib.oauth2.rfc6749 import AuthorizationServer, ClientMixin, OAuth2Request
    from authlib.oauth2.rfc6749.grants import ClientCredentialsGrant
    from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
    from authlib.oauth2.rfc6750 import BearerTokenGenerator
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    tokens: dict[str, IssuedToken] = {}
    forms: list[dict[str, str]] = []
    authorization: list[str | None] = []
    gate = threading.Event()
    gate.set()

    class Client(ClientMixin):
        def __init__(self, client_id: str, secret: str) -> None:
            self.client_id, self.secret = client_id, secret

        def get_client_id(self) -> str:
            return self.client_id

        def get_default_redirect_uri(self) -> None:
            return None

        def get_allowed_scope(self, scope: str | None) -> str:
            return scope or ""

        def check_redirect_uri(self, redirect_uri: str) -> bool:
            return False

        def check_client_secret(self, client_secret: str) -> bool:
            return secrets.compare_digest(client_secret, self.secret)

        def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
            return method == "client_secret_basic"

        def check_response_type(self, response_type: str) -> bool:
            return False

        def check_grant_type(self, grant_type: str) -> bool:
            return grant_type == "client_credentials"

    class FormRequest(OAuth2Request):
        def __init__(self, uri: str, headers: Any, form: dict[str, str]) -> None:
            super().__init__("POST", uri, headers=headers)
            self._form = form
            self.payload = BasicOAuth2Payload(form)

        @property
        def form(self) -> dict[str, str]:
            return self._form

    class Server(AuthorizationServer):
        def query_client(self, client_id: str) -> Client | None:
            secret = endpoint.clients.get(client_id)
            return Client(client_id, secret) if secret is not None else None

        def save_token(self, token: dict[str, Any], request: Any) -> None:
            tokens[token["access_token"]] = IssuedToken(
                client_id=request.client.get_client_id(),
                scope=token.get("scope", ""),
                resource=request.form.get("resource"),
                expires_at=time.time() + token["expires_in"],
            )

        def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
            pass

        def create_oauth2_request(self, request: Any) -> Any:
            return request

        def handle_response(self, status: int, body: Any, headers: Any) -> tuple[int, Any, Any]:
            return status, body, headers

    server = Server()
    server.register_grant(ClientCredentialsGrant)
    server.register_token_generator(
        "default",
        BearerTokenGenerator(
            access_token_generator=lambda **_: secrets.token_urlsafe(24),
            expires_generator=lambda client, grant_type: endpoint.lifetime,
        ),
    )

    async def token(request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode()))
        forms.append(form)
        authorization.append(request.headers.get("authorization"))
        await anyio.to_thread.run_sync(gate.wait)
        status, body, headers = server.create_token_response(FormRequest(str(request.url), request.headers, form))
        return Response(json.dumps(body), status_code=status, headers=dict(headers), media_type="application/json")

    app = Starlette(routes=[Route("/token", token, methods=["POST"])])
    with running_asgi(app) as base:
        endpoint: TokenEndpoint = TokenEndpoint(
            url=f"{base}/token",
            clients=dict(clients),
            tokens=tokens,
            forms=forms,
            authorization=authorization,
            gate=gate,
            lifetime=lifetime,
        )
        try:
            yield endpoint
        finally:
            gate.set()
