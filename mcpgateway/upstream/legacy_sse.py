"""Client for an upstream MCP server over the legacy HTTP+SSE transport (MCP 2024-11-05).

The transport: the client GETs the server's SSE endpoint and keeps the stream open; the first event,
``endpoint``, names the URL to POST JSON-RPC messages to; each POST is accepted (202) and its answer
arrives later as a ``message`` event on the stream. A session lives as long as its stream.

``LegacySseClient`` offers what ``UpstreamClient`` offers the gateway (``initialize``, ``ping``,
``list_tools``, ``call_tool`` -> ``CallResult``, ``authorize``, ``close``) with the same outcome
classes, over the same HTTP/1.1 wire (``mcpgateway.upstream.http``), so "not sent" still means that
no byte of the ``tools/call`` POST was written. Each operation opens its own session (stream,
``initialize``, ``notifications/initialized``, the request, then the stream is closed): no stream
outlives an operation, so an idle stream is never cut under a call by a read timeout or an
intermediary, and concurrent calls share nothing but the connection pool (docs/decisions.md,
"Upstream servers").

Outcomes of ``call_tool``:

- ``not_sent``: the stream, the ``endpoint`` event or the handshake failed (``reason`` starts with
  ``initialize failed:``; ``status_code`` is the stream's HTTP status when it answered one, so a
  401 or 403 there is the upstream refusing the gateway's credentials), the endpoint is on another
  origin than the SSE URL (refused: the credentials go to that origin only), the request could not
  be built, the send deadline had passed, or nothing of the POST was written.
- ``http_error`` / ``jsonrpc_error``: the POST was answered 3xx or 4xx (the message was refused), or
  the answer on the stream is a JSON-RPC error for our id. The tool did not run.
- ``uncertain``: the POST may have reached the server but no answer came: the POST's write failed,
  it was answered 5xx, or the stream ended, broke or ran out of time before our answer. Nothing is
  resent.
- ``success``, ``tool_error``, ``invalid_response``: as ``UpstreamClient`` classifies a 2xx answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

from mcpgateway.upstream.client import (
    CallResult,
    UpstreamError,
    UpstreamSession,
    _accepted,
    _all_tools,
    _classify_result,
    _ClientBase,
    _not_negotiated,
    _Outcome,
    _past_send_by,
    _replies,
    _rpc_error,
    _send_failed,
    _ToolCall,
)
from mcpgateway.upstream.http import (
    TransportError,
    _describe,
    _IncompleteReply,
    _InvalidReply,
    _Origin,
    _Response,
)
from mcpgateway.upstream.protocol import (
    SUPPORTED_PROTOCOL_VERSIONS,
    _load_message,
    _match_response,
    _new_request_id,
    _same_id,
    _storable,
)
from mcpgateway.upstream.sse import _bounded_chunks, _ignore, _sse_events, _SSEEvent

LEGACY_PROTOCOL_VERSION: Final = "2024-11-05"
"""The revision of the HTTP+SSE transport, offered in ``initialize``."""
ACCEPTED_VERSIONS: Final = (LEGACY_PROTOCOL_VERSION, *SUPPORTED_PROTOCOL_VERSIONS)
_OWN_HEADERS: Final = frozenset({"accept", "content-length", "content-type", "idempotency-key", "transfer-encoding"})


class _StreamFailed(Exception):
    """The stream ended, broke or ran out of time before the answer awaited (after the POST was accepted)."""


class _Session:
    """One open stream: the POST target its ``endpoint`` event named, and the events still to read."""

    def __init__(self, client: LegacySseClient, deadline: float | None) -> None:
        self._client = client
        self._stream: _Response | None = None
        self._events: Iterator[_SSEEvent] | None = None
        self.post_target = ""
        self.deadline = deadline
        self.negotiated: UpstreamSession | None = None

    def open(self) -> None:
        """GET the stream and read its ``endpoint`` event; ``UpstreamError`` (no call sent) if either fails."""
        client = self._client
        head = (
            f"GET {client._origin.target} HTTP/1.1\r\n{client._common}{client._authorization}"
            "Accept: text/event-stream\r\n\r\n"
        )
        try:
            self._stream = client._pool.request(head.encode("ascii"), b"", self.deadline, close=True)
        except (TransportError, _IncompleteReply, ValueError, UnicodeError) as exc:
            raise UpstreamError(f"SSE stream: {_describe(exc)}") from exc
        status = self._stream.status
        content_type = self._stream.headers.get("content-type", "").split(";")[0].strip().lower()
        if status != 200 or content_type != "text/event-stream":
            raise UpstreamError(f"SSE stream: HTTP {status} ({content_type or 'no content type'})", status_code=status)
        chunks = _bounded_chunks(self._stream.iter_chunks(), client._max_response_bytes, _ignore)
        self._events = _sse_events(chunks)
        try:
            event = self._next_event()
        except _StreamFailed as exc:
            raise UpstreamError(f"SSE stream: no endpoint event ({exc})", status_code=status) from None
        if event.event != "endpoint":
            raise UpstreamError(f"SSE stream: the first event is {event.event[:40]!r}, not 'endpoint'")
        url = urljoin(client.url, event.data.strip())
        origin = _Origin.parse(url)
        if (origin.tls, origin.host, origin.port) != (client._origin.tls, client._origin.host, client._origin.port):
            # The credentials and the calls go to the server's own origin only.
            raise UpstreamError("SSE stream: the endpoint event names another origin")
        if urlsplit(url).fragment or origin.error is not None:
            raise UpstreamError("SSE stream: the endpoint event names an unusable URL")
        self.post_target = origin.target

    def _next_event(self) -> _SSEEvent:
        assert self._events is not None
        try:
            return next(self._events)
        except StopIteration:
            raise _StreamFailed("the stream ended") from None
        except _IncompleteReply as exc:
            raise _StreamFailed(str(exc)) from None
        except (TransportError, _InvalidReply, UnicodeDecodeError) as exc:
            raise _StreamFailed(_describe(exc)) from None

    def post(self, payload: dict[str, Any], lines: str = "") -> _Response:
        """POST one message to the endpoint; returns the response (its head read); raises the wire's errors."""
        client = self._client
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        head = (
            f"POST {self.post_target} HTTP/1.1\r\n{client._common}{client._authorization}"
            f"Content-Type: application/json\r\n{lines}Content-Length: {len(body)}\r\n\r\n"
        )
        return client._pool.request(head.encode("ascii"), body, self.deadline, close=False)

    def _all_events(self) -> Iterator[_SSEEvent]:
        """The stream's events; it ends only by raising ``_StreamFailed``."""
        while True:
            yield self._next_event()

    def answer(self, rid: str | int, on_data: Any = None) -> dict[str, Any]:
        """The message event that answers ``rid`` (skipping the server's own requests and notifications).

        Raises ``_StreamFailed`` when the stream ends, breaks or runs out of time first, ``_InvalidReply``
        for a message that is not JSON or a response of another shape for our id.
        """
        for event, message in _replies(self._all_events()):
            if isinstance(message, dict) and "id" in message and not _same_id(message.get("id"), rid):
                continue  # an answer to another message of this session (none is outstanding)
            if on_data is not None:
                on_data(event.data.encode())
            return _storable(_match_response(message, rid))
        raise AssertionError("unreachable")  # pragma: no cover - the events end only by raising

    def request(self, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """One request that may be resent (not ``tools/call``): its result, else ``UpstreamError``."""
        rid = _new_request_id()
        payload: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            payload["params"] = params
        self._accepted(payload, method)
        try:
            message = self.answer(rid)
        except (_StreamFailed, _InvalidReply) as exc:
            raise UpstreamError(f"{method}: {exc}") from exc
        error = message.get("error")
        if error is not None:
            raise _rpc_error(method, error)
        result: dict[str, Any] = message["result"]
        return result

    def _accepted(self, payload: dict[str, Any], method: str) -> None:
        """POST a message that must be accepted (2xx) with its body read; ``UpstreamError`` otherwise."""
        try:
            response = self.post(payload)
        except (TransportError, _IncompleteReply, ValueError, UnicodeError) as exc:
            raise UpstreamError(f"{method}: {_describe(exc)}") from exc
        _accepted(response, method, self._client._max_response_bytes)

    def handshake(self) -> UpstreamSession:
        """``initialize`` and ``notifications/initialized``; ``UpstreamError`` on any failure."""
        params = {
            "protocolVersion": LEGACY_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": self._client._client_info,
        }
        result = self.request("initialize", params)
        version = result.get("protocolVersion")
        if version not in ACCEPTED_VERSIONS:
            raise UpstreamError(f"initialize: upstream chose unsupported protocol version {version!r}")
        self._accepted({"jsonrpc": "2.0", "method": "notifications/initialized"}, "notifications/initialized")
        self.negotiated = UpstreamSession.of(result, str(version))
        return self.negotiated

    def answer_by(self, deadline: float | None) -> None:
        """Bound the wait for the stream's next answers by ``deadline`` (a call's: from its POST)."""
        self.deadline = deadline
        if self._stream is not None:
            self._stream._deadline = deadline

    def close(self) -> None:
        """Close the stream (the server ends the session); its connection is not reused."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None


class LegacySseClient(_ClientBase):
    """Synchronous, thread-safe client for one upstream MCP server over HTTP+SSE (one session per operation).

    Configured as ``UpstreamClient`` is (``_ClientBase``): ``read_timeout`` bounds each wait for bytes
    (of the stream too), ``total_timeout`` an operation's stream from its start and a call's answer
    from its POST. Each operation holds two connections (the stream and a POST), so
    ``max_connections`` (default 40) bounds concurrent operations at half of it.
    """

    _own_headers = _OWN_HEADERS
    _default_max_connections = 40

    def __init__(self, url: str, **options: Any) -> None:
        """Configure the client (``options``: ``_ClientBase``'s); nothing is sent until the first operation."""
        self._session: UpstreamSession | None = None
        super().__init__(url, **options)

    @property
    def session(self) -> UpstreamSession | None:
        """What the last handshake negotiated, or ``None`` before the first."""
        return self._session

    def _open(self) -> _Session:
        """A new session, its handshake done; ``UpstreamError`` (the session closed) when it fails."""
        session = _Session(self, self._deadline())
        try:
            session.open()
            self._session = session.handshake()
        except BaseException:
            session.close()
            raise
        return session

    def _safe(self, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        session = self._open()
        try:
            return session.request(method, params)
        finally:
            session.close()

    def initialize(self) -> UpstreamSession:
        """Open a session and run the handshake (then close it): what it negotiated, else ``UpstreamError``."""
        self._open().close()
        assert self._session is not None
        return self._session

    def ping(self) -> None:
        """``ping`` in a session of its own; ``UpstreamError`` unless the upstream answered with a result."""
        self._safe("ping", None)

    def list_tools(self) -> list[dict[str, Any]]:
        """All tools the upstream lists, following ``nextCursor`` in one session; ``UpstreamError`` on any failure."""
        session = self._open()
        try:
            return _all_tools(session.request)
        finally:
            session.close()

    def _call(self, call: _ToolCall) -> CallResult:
        """``call_tool`` in a session of its own (module docstring); ``input_schema`` is not used: this
        revision has no ``Mcp-Param-*`` headers."""
        try:
            session = self._open()
        except UpstreamError as exc:
            return _not_negotiated(exc, call.rid)
        try:
            return self._post_call(session, call)
        finally:
            session.close()

    def _post_call(self, session: _Session, call: _ToolCall) -> CallResult:
        rid = call.rid
        payload = call.payload({})
        try:
            lines = call.lines()
            json.dumps(payload)
        except Exception as exc:
            return CallResult(kind="not_sent", reason=f"request not built: {_describe(exc)}", request_id=rid)
        started = time.monotonic()
        if (late := _past_send_by(started, call.send_by, rid)) is not None:
            return late
        session.answer_by(self._deadline(started))
        result = _Outcome(rid, started)
        try:
            response = session.post(payload, lines)
        except Exception as exc:
            return result(*_send_failed(exc))
        status = result.status = response.status
        try:
            body = b"".join(_bounded_chunks(response.iter_chunks(), self._max_response_bytes, _ignore))
        except Exception:
            body = b""
        finally:
            response.close()
        if status >= 500:
            return result("uncertain", f"HTTP {status}")
        if not 200 <= status < 300:
            error = _error_in(body, rid)
            if error is not None:
                return result("jsonrpc_error", f"JSON-RPC error {error.get('code')} (HTTP {status})", error=error)
            return result("http_error", f"HTTP {status}")
        try:
            message = session.answer(rid, result.hasher.update)
        except _StreamFailed as exc:
            return result("uncertain", f"no answer on the SSE stream: {exc}")
        except _InvalidReply as exc:
            return result("invalid_response", str(exc))
        error = message.get("error")
        if error is not None:
            return result("jsonrpc_error", f"JSON-RPC error {error.get('code')}", error=error)
        return _classify_result(message["result"], call.validator, result)


def _error_in(body: bytes, rid: str | int) -> dict[str, Any] | None:
    """The JSON-RPC error for ``rid`` in a refused POST's body, if it is one."""
    try:
        message = _match_response(_load_message(body, "body"), rid)
    except (_InvalidReply, ValueError):
        return None
    error = message.get("error")
    return error if isinstance(error, dict) else None
