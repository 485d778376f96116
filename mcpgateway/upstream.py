"""Client for the configured upstream MCP server over Streamable HTTP.

The gateway dispatches ``tools/call`` with this client in phase 2 of the governed
action (DESIGN.md section 6). It is written on httpx directly rather than on the
MCP SDK because the gateway must tell apart "the request never left this host"
(refund) from "the request may have reached the upstream" (keep the charge,
reconcile): the SDK hides that boundary behind its own streams, and its client
resends a ``tools/call`` on its own in some cases (``HEADER_MISMATCH`` on 2026-07-28).

Protocol: the handshake revisions (``initialize``, ``notifications/initialized``,
``Mcp-Session-Id``, ``MCP-Protocol-Version``); see ``SUPPORTED_PROTOCOL_VERSIONS``.

Guarantees:

- A ``tools/call`` is never sent twice by this client. Only ``initialize``,
  ``tools/list`` and ``ping`` are re-sent, and only after the upstream answered
  404 to a request carrying a session id (the session expired).
- ``call_tool`` never raises for an upstream failure; it returns a ``CallResult``
  whose ``kind`` says whether the tool can have run (see ``CallResult``).
- One ``UpstreamClient`` may be shared by many threads: the httpx connection pool
  is thread-safe and session (re)initialization happens under a lock, once per
  expired session however many threads notice the expiry.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal

import httpx
import jsonschema  # type: ignore[import-untyped]  # no stubs in the environment; its package imports the submodules

logger = logging.getLogger(__name__)

IDEMPOTENCY_META_KEY: Final = "io.tollgate/idempotency-key"
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
SESSION_HEADER: Final = "Mcp-Session-Id"
PROTOCOL_VERSION_HEADER: Final = "MCP-Protocol-Version"
ACCEPT: Final = "application/json, text/event-stream"

SUPPORTED_PROTOCOL_VERSIONS: Final[tuple[str, ...]] = ("2025-11-25", "2025-06-18", "2025-03-26")
"""Handshake revisions this client speaks, newest first; the first is offered in ``initialize``."""

DEFAULT_MAX_RESPONSE_BYTES: Final = 10 * 1024 * 1024
_MAX_LIST_PAGES: Final = 100

CallKind = Literal["not_sent", "http_error", "jsonrpc_error", "tool_error", "success", "invalid_response", "uncertain"]

KINDS_TOOL_NOT_RUN: Final[frozenset[str]] = frozenset({"not_sent", "http_error", "jsonrpc_error"})
"""Kinds after which the tool did not run: the charge is refunded."""


@dataclass(frozen=True)
class CallResult:
    """The outcome of one ``tools/call``, classified for the receipt.

    ``kind``:

    - ``not_sent``: no byte of the ``tools/call`` request was written: connection
      refused, DNS failure, connect or pool timeout, or the session could not be
      (re)initialized. Also ``reason == "session_expired"``: the upstream answered
      404 to our session id. The MCP transport spec says a server MUST answer 404
      to a request carrying a session id it does not know, so it rejected the
      request before dispatching it; the tool did not run. The client has
      re-initialized and has NOT resent the call.
    - ``http_error``: the upstream (or an intermediary) answered 3xx or 4xx
      without a JSON-RPC response for our id. By HTTP semantics the request was
      refused, not processed; the tool did not run.
    - ``jsonrpc_error``: a valid JSON-RPC error object for our id (with a 2xx,
      3xx or 4xx status). The tool did not run. ``error`` holds code, message, data.
    - ``tool_error``: a valid result with ``isError: true``. The tool ran and failed.
    - ``success``: a valid result, ``structuredContent`` conforming to the
      tool's outputSchema when one was given.
    - ``invalid_response``: a complete 2xx answer that is not a valid JSON-RPC
      response for our id (garbage, wrong id, neither or both of result and
      error, malformed SSE, empty 202, oversized body), or a result whose
      ``structuredContent`` breaks the outputSchema. The tool may have run.
    - ``uncertain``: the request may have been delivered but no complete answer
      came back: read timeout, write error or timeout, connection reset or
      closed mid-response, a 5xx status (from an intermediary or the upstream),
      an SSE stream that ended without our response, or the total timeout.
      The tool may or may not have run; nothing is resent.
    """

    kind: CallKind
    reason: str
    request_id: str | int
    status_code: int | None = None
    elapsed: float = 0.0
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    response_sha256: str | None = None

    @property
    def tool_not_run(self) -> bool:
        """True when the upstream certainly did not run the tool (the charge is owed back)."""
        return self.kind in KINDS_TOOL_NOT_RUN


@dataclass(frozen=True)
class UpstreamSession:
    """An initialized handshake session; ``session_id`` is ``None`` for a stateless upstream."""

    session_id: str | None
    protocol_version: str
    server_info: dict[str, Any] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)
    instructions: str | None = None


class UpstreamError(Exception):
    """A non-``tools/call`` request (initialize, tools/list, ping) failed; safe to retry later."""

    def __init__(self, reason: str, *, status_code: int | None = None, error: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status_code = status_code
        self.error = error


class _InvalidReply(Exception):
    """The upstream answered completely, but not with a valid JSON-RPC response for our id."""


class _IncompleteReply(Exception):
    """The answer stopped (stream end, total timeout) before our response arrived."""


_NOT_SENT_ERRORS: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
"""httpx errors raised before any request byte is written (connection setup, pool wait, URL scheme)."""


class UpstreamClient:
    """Synchronous, thread-safe client for one upstream MCP server (Streamable HTTP, handshake era)."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        write_timeout: float | None = None,
        pool_timeout: float | None = None,
        total_timeout: float | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_connections: int = 20,
        headers: Mapping[str, str] | None = None,
        client_info: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """Configure the client; nothing is sent until the first request.

        ``read_timeout`` bounds each wait for response bytes; ``total_timeout``
        (optional) bounds a whole response, which matters for SSE streams that
        keep a connection alive with pings. ``write_timeout`` defaults to
        ``read_timeout`` and ``pool_timeout`` to ``connect_timeout``. Redirects
        are not followed and proxy settings from the environment are ignored,
        so "sent" always means "sent to ``url``".
        """
        self.url = url
        self._total_timeout = total_timeout
        self._max_response_bytes = max_response_bytes
        self._client_info = dict(client_info or {"name": "tollgate", "version": "1"})
        self._http = httpx.Client(
            timeout=httpx.Timeout(
                connect=connect_timeout,
                read=read_timeout,
                write=write_timeout if write_timeout is not None else read_timeout,
                pool=pool_timeout if pool_timeout is not None else connect_timeout,
            ),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            headers=dict(headers or {}),
            follow_redirects=False,
            trust_env=False,
            transport=transport,
        )
        self._lock = threading.Lock()
        self._session: UpstreamSession | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> UpstreamClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """End the session (best-effort ``DELETE``) and close the connection pool."""
        session, self._session = self._session, None
        if session is not None and session.session_id is not None:
            try:
                self._http.delete(self.url, headers=self._session_headers(session))
            except httpx.HTTPError:
                logger.debug("upstream session DELETE failed", exc_info=True)
        self._http.close()

    @property
    def session(self) -> UpstreamSession | None:
        """The current session, or ``None`` before the first request or after expiry."""
        return self._session

    # -- public requests -------------------------------------------------------------------------

    def initialize(self) -> UpstreamSession:
        """Return the current session, running the handshake first if there is none.

        Raises ``UpstreamError`` when the upstream cannot be reached or answers
        with an error or a protocol version this client does not speak.
        """
        return self._ensure_session()

    def ping(self) -> None:
        """Send ``ping``; returns when the upstream answered with a result, else raises ``UpstreamError``."""
        self._safe_request("ping", None)

    def list_tools(self) -> list[dict[str, Any]]:
        """All tools the upstream lists, following ``nextCursor``; raises ``UpstreamError`` on any failure."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(_MAX_LIST_PAGES):
            result = self._safe_request("tools/list", {"cursor": cursor} if cursor is not None else None)
            page = result.get("tools")
            if not isinstance(page, list) or not all(isinstance(tool, dict) for tool in page):
                raise UpstreamError("tools/list: result.tools is not a list of objects")
            tools.extend(page)
            next_cursor = result.get("nextCursor")
            if next_cursor is None:
                return tools
            if not isinstance(next_cursor, str) or next_cursor in seen:
                raise UpstreamError("tools/list: invalid or repeated nextCursor")
            seen.add(next_cursor)
            cursor = next_cursor
        raise UpstreamError(f"tools/list: more than {_MAX_LIST_PAGES} pages")

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str,
        request_id: str | int | None = None,
        extra_meta: Mapping[str, Any] | None = None,
        output_schema: Mapping[str, Any] | None = None,
    ) -> CallResult:
        """Send one ``tools/call`` and classify the outcome; never resends, never raises for upstream failures.

        The idempotency key travels as header ``Idempotency-Key`` and as
        ``params._meta["io.tollgate/idempotency-key"]`` (it overrides the same key
        in ``extra_meta``). With ``output_schema``, a non-error result must carry
        ``structuredContent`` that validates against it, else the kind is
        ``invalid_response``. Raises ``ValueError`` (before anything is sent) for
        an empty idempotency key or an invalid ``output_schema``.
        """
        if not idempotency_key:
            raise ValueError("idempotency_key is required")
        validator = _output_validator(output_schema)
        rid: str | int = request_id if request_id is not None else _new_request_id()
        meta = dict(extra_meta or {})
        meta[IDEMPOTENCY_META_KEY] = idempotency_key
        payload = {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {"name": name, "arguments": dict(arguments), "_meta": meta},
        }
        try:
            session = self._ensure_session()
        except UpstreamError as exc:
            return CallResult(kind="not_sent", reason=f"initialize failed: {exc.reason}", request_id=rid)

        try:
            request = self._build(payload, session, {IDEMPOTENCY_HEADER: idempotency_key})
        except Exception as exc:
            # Arguments that are not JSON, a header value that cannot be encoded, a bad URL.
            return CallResult(kind="not_sent", reason=f"request not built: {_describe(exc)}", request_id=rid)

        started = time.monotonic()
        try:
            response = self._http.send(request, stream=True)
        except _NOT_SENT_ERRORS as exc:
            return CallResult(
                kind="not_sent", reason=_describe(exc), request_id=rid, elapsed=time.monotonic() - started
            )
        except Exception as exc:
            # Write errors and timeouts, resets before the status line, and anything
            # unexpected: some bytes may have reached the upstream.
            return CallResult(
                kind="uncertain", reason=_describe(exc), request_id=rid, elapsed=time.monotonic() - started
            )
        try:
            return self._classify(response, rid, session, validator, started)
        finally:
            response.close()

    # -- classification --------------------------------------------------------------------------

    def _classify(
        self,
        response: httpx.Response,
        rid: str | int,
        session: UpstreamSession,
        validator: jsonschema.protocols.Validator | None,
        started: float,
    ) -> CallResult:
        """Read the answer to a ``tools/call`` and map it to a ``CallResult`` (see its docstring)."""
        status = response.status_code
        hasher = hashlib.sha256()
        message: dict[str, Any] | None = None
        problem: str | None = None
        interrupted = False
        try:
            message = self._read_reply(response, rid, hasher.update, started)
        except _InvalidReply as exc:
            problem = str(exc)
        except _IncompleteReply as exc:
            problem, interrupted = str(exc), True
        except Exception as exc:
            problem, interrupted = f"response interrupted: {_describe(exc)}", True

        def result(kind: CallKind, reason: str, **extra: Any) -> CallResult:
            return CallResult(
                kind=kind,
                reason=reason,
                request_id=rid,
                status_code=status,
                elapsed=time.monotonic() - started,
                response_sha256=hasher.hexdigest(),
                **extra,
            )

        error = message.get("error") if message is not None else None
        if status >= 500:
            return result("uncertain", f"HTTP {status}" + (f": {problem}" if problem else ""), error=error)
        if status == 404 and session.session_id is not None and error is None:
            self._invalidate(session)
            try:
                self._ensure_session()
            except UpstreamError as exc:
                logger.warning("upstream re-initialize after session expiry failed: %s", exc.reason)
            return result("not_sent", "session_expired")
        if status >= 300 or status < 200:
            if error is not None:
                return result("jsonrpc_error", f"JSON-RPC error {error.get('code')} (HTTP {status})", error=error)
            if message is not None:
                return result("invalid_response", f"HTTP {status} with a result", result=message.get("result"))
            return result("http_error", f"HTTP {status}")
        if message is None:
            assert problem is not None
            return result("uncertain" if interrupted else "invalid_response", problem)
        if error is not None:
            return result("jsonrpc_error", f"JSON-RPC error {error.get('code')}", error=error)
        payload: dict[str, Any] = message["result"]
        if (bad := _invalid_call_result(payload)) is not None:
            return result("invalid_response", bad, result=payload)
        if payload.get("isError") is True:
            return result("tool_error", "tool reported isError", result=payload)
        if validator is not None:
            structured = payload.get("structuredContent")
            if structured is None:
                return result(
                    "invalid_response", "structuredContent missing for a tool with an outputSchema", result=payload
                )
            try:
                violation = jsonschema.exceptions.best_match(validator.iter_errors(structured))
            except Exception as exc:
                # An unresolvable $ref and the like: the result cannot be shown to conform.
                return result("invalid_response", f"outputSchema not evaluable: {_describe(exc)}", result=payload)
            if violation is not None:
                path = "/".join(str(part) for part in violation.absolute_path)
                reason = f"structuredContent violates outputSchema at '{path}': {violation.message}"
                return result("invalid_response", reason[:500], result=payload)
        return result("success", "ok", result=payload)

    # -- session handling ------------------------------------------------------------------------

    def _ensure_session(self) -> UpstreamSession:
        """The current session; under the lock, initialize one if none exists (one handshake at a time)."""
        session = self._session
        if session is not None:
            return session
        with self._lock:
            if self._session is None:
                self._session = self._initialize()
            return self._session

    def _invalidate(self, stale: UpstreamSession) -> None:
        """Forget ``stale`` unless another thread already replaced it."""
        with self._lock:
            if self._session is stale:
                logger.info("upstream session expired; re-initializing")
                self._session = None

    def _initialize(self) -> UpstreamSession:
        """Run the handshake: ``initialize``, check the version, then ``notifications/initialized``.

        Caller holds ``self._lock``. Raises ``UpstreamError`` on any failure.
        """
        rid = _new_request_id()
        payload = {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "initialize",
            "params": {
                "protocolVersion": SUPPORTED_PROTOCOL_VERSIONS[0],
                "capabilities": {},
                "clientInfo": self._client_info,
            },
        }
        result, response_headers = self._exchange(payload, None, "initialize")
        version = result.get("protocolVersion")
        if version not in SUPPORTED_PROTOCOL_VERSIONS:
            raise UpstreamError(f"initialize: upstream chose unsupported protocol version {version!r}")
        session_id = response_headers.get(SESSION_HEADER)
        session = UpstreamSession(
            session_id=session_id,
            protocol_version=str(version),
            server_info=_dict_or_empty(result.get("serverInfo")),
            capabilities=_dict_or_empty(result.get("capabilities")),
            instructions=result.get("instructions") if isinstance(result.get("instructions"), str) else None,
        )
        notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        try:
            response = self._send(notification, session, {})
            response.read()
            response.close()
        except httpx.HTTPError as exc:
            raise UpstreamError(f"notifications/initialized: {_describe(exc)}") from exc
        if not 200 <= response.status_code < 300:
            raise UpstreamError(
                f"notifications/initialized: HTTP {response.status_code}", status_code=response.status_code
            )
        return session

    def _safe_request(self, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """Send a request that may be resent; re-initialize and resend once if the session expired."""
        for attempt in (1, 2):
            session = self._ensure_session()
            payload: dict[str, Any] = {"jsonrpc": "2.0", "id": _new_request_id(), "method": method}
            if params is not None:
                payload["params"] = params
            try:
                result, _ = self._exchange(payload, session, method)
            except UpstreamError as exc:
                if exc.status_code == 404 and exc.error is None and session.session_id is not None and attempt == 1:
                    self._invalidate(session)
                    continue
                raise
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(
        self, payload: dict[str, Any], session: UpstreamSession | None, method: str
    ) -> tuple[dict[str, Any], httpx.Headers]:
        """Send a request and return (result, response headers); raises ``UpstreamError`` on anything else."""
        started = time.monotonic()
        try:
            response = self._send(payload, session, {})
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{method}: {_describe(exc)}") from exc
        try:
            status = response.status_code
            try:
                message = self._read_reply(response, payload["id"], hashlib.sha256().update, started)
            except (_InvalidReply, _IncompleteReply) as exc:
                if 200 <= status < 300:
                    raise UpstreamError(f"{method}: {exc}", status_code=status) from exc
                raise UpstreamError(f"{method}: HTTP {status}", status_code=status) from exc
            except httpx.HTTPError as exc:
                raise UpstreamError(f"{method}: {_describe(exc)}", status_code=status) from exc
            error = message.get("error")
            if error is not None:
                raise UpstreamError(
                    f"{method}: JSON-RPC error {error.get('code')}: {error.get('message')}",
                    status_code=status,
                    error=error,
                )
            if not 200 <= status < 300:
                raise UpstreamError(f"{method}: HTTP {status}", status_code=status)
            return message["result"], response.headers
        finally:
            response.close()

    # -- wire ------------------------------------------------------------------------------------

    def _session_headers(self, session: UpstreamSession | None) -> dict[str, str]:
        if session is None:
            return {}
        headers = {PROTOCOL_VERSION_HEADER: session.protocol_version}
        if session.session_id is not None:
            headers[SESSION_HEADER] = session.session_id
        return headers

    def _build(self, payload: dict[str, Any], session: UpstreamSession | None, extra: dict[str, str]) -> httpx.Request:
        """The POST for one JSON-RPC message; raises (nothing sent) if it cannot be encoded."""
        headers = {"Content-Type": "application/json", "Accept": ACCEPT, **self._session_headers(session), **extra}
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        return self._http.build_request("POST", self.url, content=body, headers=headers)

    def _send(self, payload: dict[str, Any], session: UpstreamSession | None, extra: dict[str, str]) -> httpx.Response:
        """POST one JSON-RPC message and return the streaming response (headers read, body not yet)."""
        return self._http.send(self._build(payload, session, extra), stream=True)

    def _read_reply(
        self, response: httpx.Response, rid: str | int, on_chunk: Callable[[bytes], None], started: float
    ) -> dict[str, Any]:
        """Read the JSON-RPC response for ``rid`` from a JSON body or an SSE stream.

        SSE notifications and server-to-client requests are skipped; reading stops
        at our response. Raises ``_InvalidReply`` for a body that is not a valid
        response for ``rid``, ``_IncompleteReply`` when the stream ends or the total
        timeout passes first; httpx errors propagate.
        """
        deadline = started + self._total_timeout if self._total_timeout is not None else None
        chunks = _bounded_chunks(response, deadline, self._max_response_bytes, on_chunk)
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "text/event-stream":
            try:
                for event in _sse_events(chunks):
                    if event.event != "message" or not event.data:
                        continue
                    try:
                        message = json.loads(event.data)
                    except ValueError as exc:
                        raise _InvalidReply("SSE event data is not JSON") from exc
                    if isinstance(message, dict) and "method" in message:
                        continue
                    return _match_response(message, rid)
            except UnicodeDecodeError as exc:
                raise _InvalidReply("SSE stream is not UTF-8") from exc
            raise _IncompleteReply("SSE stream ended without a response")
        body = b"".join(chunks)
        if not body:
            raise _InvalidReply(f"empty body (HTTP {response.status_code})")
        try:
            message = json.loads(body)
        except ValueError as exc:
            raise _InvalidReply("body is not JSON") from exc
        return _match_response(message, rid)


# -- helpers -------------------------------------------------------------------------------------


def _new_request_id() -> str:
    return f"tg-{uuid.uuid4().hex}"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _dict_or_empty(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _same_id(a: Any, b: Any) -> bool:
    """JSON-RPC ids match only with the same JSON type (``1`` is not ``"1"``, ``true`` is not ``1``)."""
    return type(a) is type(b) and a == b


def _match_response(message: Any, rid: str | int) -> dict[str, Any]:
    """``message`` if it is a JSON-RPC 2.0 response for ``rid`` with exactly one well-formed result or error."""
    if not isinstance(message, dict):
        raise _InvalidReply("not a JSON-RPC object")
    if message.get("jsonrpc") != "2.0":
        raise _InvalidReply("jsonrpc member is not '2.0'")
    if "id" not in message or not _same_id(message["id"], rid):
        # A JSON-RPC error with id null answers a message the peer could not read;
        # it still tells us nothing about our request, so it is not a response to it.
        raise _InvalidReply(f"response id {message.get('id')!r} does not match request id {rid!r}")
    has_result, has_error = "result" in message, "error" in message
    if has_result == has_error:
        raise _InvalidReply("response must carry exactly one of result and error")
    if has_result and not isinstance(message["result"], dict):
        raise _InvalidReply("result is not an object")
    if has_error:
        error = message["error"]
        if not isinstance(error, dict) or not isinstance(error.get("code"), int) or isinstance(error["code"], bool):
            raise _InvalidReply("error is not an object with an integer code")
        if not isinstance(error.get("message"), str):
            raise _InvalidReply("error.message is not a string")
    return message


def _invalid_call_result(result: dict[str, Any]) -> str | None:
    """Why ``result`` is not a well-formed CallToolResult, or ``None`` when it is."""
    if not isinstance(result.get("content"), list):
        return "result.content is not a list"
    if "isError" in result and not isinstance(result["isError"], bool):
        return "result.isError is not a boolean"
    if result.get("structuredContent") is not None and not isinstance(result["structuredContent"], dict):
        return "result.structuredContent is not an object"
    return None


_validator_cache: dict[str, jsonschema.protocols.Validator] = {}
_validator_lock = threading.Lock()


def _output_validator(schema: Mapping[str, Any] | None) -> jsonschema.protocols.Validator | None:
    """A validator for ``schema`` (draft from ``$schema``, else 2020-12); ``ValueError`` if the schema is invalid.

    Checking and compiling a schema costs milliseconds; validators are cached by the schema's
    canonical JSON (a tool's outputSchema changes only when the registry is synced).
    """
    if schema is None:
        return None
    fingerprint = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    cached = _validator_cache.get(fingerprint)
    if cached is not None:
        return cached
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise ValueError(f"invalid output_schema: {exc.message}") from exc
    validator = cls(schema)
    with _validator_lock:
        if len(_validator_cache) > 1024:
            _validator_cache.clear()
        _validator_cache[fingerprint] = validator
    return validator


def _bounded_chunks(
    response: httpx.Response, deadline: float | None, max_bytes: int, on_chunk: Callable[[bytes], None]
) -> Iterator[bytes]:
    """The response body in chunks, each passed to ``on_chunk`` first.

    Raises ``_InvalidReply`` past ``max_bytes``, and ``_IncompleteReply`` when the
    deadline has passed before a wait for more bytes. The consumer stops pulling
    once it has its answer (an SSE event), so an answer that has arrived is never
    discarded; a JSON body counts as arrived when its end has been read.
    """
    total = 0
    chunks = response.iter_bytes()
    while True:
        if deadline is not None and time.monotonic() > deadline:
            raise _IncompleteReply("total timeout passed before the response arrived")
        chunk = next(chunks, None)
        if chunk is None:
            return
        on_chunk(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise _InvalidReply(f"response larger than {max_bytes} bytes")
        yield chunk


@dataclass(frozen=True)
class _SSEEvent:
    event: str
    data: str


_LINE_END = re.compile(r"\r\n|\r|\n")


def _sse_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Split a UTF-8 byte stream into SSE lines (CRLF, CR or LF), across chunk boundaries."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""
    for chunk in chunks:
        pending += decoder.decode(chunk)
        start = 0
        for match in _LINE_END.finditer(pending):
            if match.group() == "\r" and match.end() == len(pending):
                break  # maybe the first half of a CRLF split across chunks
            yield pending[start : match.start()]
            start = match.end()
        pending = pending[start:]
    pending += decoder.decode(b"", final=True)
    start = 0
    for match in _LINE_END.finditer(pending):
        yield pending[start : match.start()]
        start = match.end()
    if start < len(pending):
        yield pending[start:]


def _sse_events(chunks: Iterator[bytes]) -> Iterator[_SSEEvent]:
    """Dispatch SSE events (WHATWG rules for ``event`` and ``data``; ``id``/``retry``/comments ignored)."""
    event_type = ""
    data: list[str] = []
    for line in _sse_lines(chunks):
        if not line:
            if data:
                yield _SSEEvent(event=event_type or "message", data="\n".join(data))
            event_type, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event_type = value
