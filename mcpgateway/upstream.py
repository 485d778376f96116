"""Client for the configured upstream MCP server over Streamable HTTP.

The gateway dispatches ``tools/call`` with this client in phase 2 of the governed
action (docs/architecture.md, "The governed call"). It speaks HTTP/1.1 itself, over the standard
library's sockets, rather than through the MCP SDK or a general HTTP client: the
gateway must tell apart "the request never left this host" (refund) from "the
request may have reached the upstream" (keep the charge, reconcile), and the
classification is only as exact as the knowledge of where the first byte was
written. The SDK hides that boundary behind its own streams, and its client
resends a ``tools/call`` on its own in some cases (``HEADER_MISMATCH`` on
2026-07-28); a general client costs several times the CPU of the exchange (see
``bench/upstream_client.py``).

Protocol: both eras of MCP over Streamable HTTP, negotiated on first use the way
the official SDK client's ``mode="auto"`` negotiates them:

- The stateless revision (``STATELESS_PROTOCOL_VERSIONS``, 2026-07-28): no
  session and no handshake; every request carries the envelope in
  ``params._meta`` (``io.modelcontextprotocol/protocolVersion``, ``.../clientInfo``,
  ``.../clientCapabilities``) and the headers ``MCP-Protocol-Version``,
  ``Mcp-Method`` and, for ``tools/call``, ``Mcp-Name`` (and ``Mcp-Param-*`` for
  arguments the tool's inputSchema marks with ``x-mcp-header``, when the caller
  passes that schema). The revision has no ``ping``: ``ping()`` sends
  ``server/discover``.
- The handshake revisions (``SUPPORTED_PROTOCOL_VERSIONS``: ``initialize``,
  ``notifications/initialized``, ``Mcp-Session-Id``, ``MCP-Protocol-Version``).

Negotiation (``era="auto"``, the default) happens on first use, under the
client's lock, and holds until the upstream changes its mind. ``server/discover``
is sent at the newest stateless version. A valid discover result that lists a
stateless version this client speaks selects the stateless era. Anything else
that is not positive evidence of a stateless-era server falls back to the
handshake: a JSON-RPC error, a 3xx or 4xx answer (400, 404, 405...), a 2xx
answer that is not a JSON-RPC response for the probe, or whose result is not a
valid discover result or lists only handshake versions. Two outcomes are no era
verdict and fail the negotiation (``UpstreamError``; the next request tries
again): no complete answer (connection refused, reset, timeout) and a 5xx
without a JSON-RPC error (an outage or an intermediary; the SDK falls back
there, which can leave a stateless-capable upstream in the handshake era).
``-32022`` (unsupported protocol version) whose ``data.supported`` names a
stateless version this client speaks causes one more probe at that version, and
so does such a ``-32022`` answering the fallback ``initialize``; one whose
``data.supported`` names no handshake version either is an incompatibility
(``UpstreamError``). The negotiated state is forgotten, so that the next request
negotiates again, when any request is answered ``-32022``, when a request of the
stateless era gets what a handshake-only server answers one (a 400, 404 or 405
without a JSON-RPC response for its id), and when a handshake session expires
(404 to its id). ``era="handshake"`` skips the probe and always runs the handshake.

Guarantees:

- A ``tools/call`` is never sent twice by this client, not even when a pooled
  keep-alive connection turns out to be dead: a failure once a request byte may
  have been written is reported, never retried. What keeps that rare: an idle
  connection is checked before reuse (readable means the peer closed it or sent
  garbage: it is discarded) and is not reused once idle for ``keepalive_expiry``
  (below common server idle timeouts, which would close it under a request).
  Only ``initialize``, ``server/discover``, ``tools/list`` and ``ping`` are
  re-sent: ``tools/list`` and ``ping`` once after the upstream answered 404 to a
  request carrying a session id (the session expired) or refused the
  negotiated era (see above), the negotiation's own requests as it says.
- ``call_tool`` never raises for an upstream failure; it returns a ``CallResult``
  whose ``kind`` says whether the tool can have run (see ``CallResult``).
  ``not_sent`` is reported only when no byte of the request was written: the URL
  was unusable, the request could not be encoded, name resolution, the TCP
  connect or the TLS handshake failed or timed out, no pooled connection came
  free within the pool timeout, the client had been closed, or the negotiation
  that must precede the call failed.
- One ``UpstreamClient`` may be shared by many threads: the connection pool is
  thread-safe (a connection carries one exchange at a time) and negotiation
  (probe, handshake) happens under a lock, once per forgotten era or expired
  session however many threads notice it.

The wire (``_Pool``, ``_Response``): HTTP/1.1 over ``http://`` and ``https://``
(certificates verified against the system trust store and certifi's, with SNI),
persistent connections bounded by ``max_connections``, bodies framed by
Content-Length, chunked transfer coding (extensions and trailers read and
ignored) or the end of the connection, ``Connection: close`` and HTTP/1.0
answers honoured. No proxy settings from the environment, no redirects followed,
no content codings (``Accept-Encoding: identity``).
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import hashlib
import json
import logging
import os
import re
import select
import socket
import ssl
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import quote, unquote, urlsplit

import jsonschema  # type: ignore[import-untyped]  # no stubs in the environment; its package imports the submodules

from config.jsonbounds import JSONBodyError, loads_bounded, unstorable

logger = logging.getLogger(__name__)

IDEMPOTENCY_META_KEY: Final = "io.tollgate/idempotency-key"
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
SESSION_HEADER: Final = "Mcp-Session-Id"
PROTOCOL_VERSION_HEADER: Final = "MCP-Protocol-Version"
METHOD_HEADER: Final = "Mcp-Method"
NAME_HEADER: Final = "Mcp-Name"
PARAM_HEADER_PREFIX: Final = "Mcp-Param-"
ACCEPT: Final = "application/json, text/event-stream"
USER_AGENT: Final = "tollgate-upstream/1"

PROTOCOL_VERSION_META_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO_META_KEY: Final = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPABILITIES_META_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_META_KEY: Final = "io.modelcontextprotocol/serverInfo"
"""Where a stateless-era result (``server/discover``'s too) names the server."""
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022
"""JSON-RPC error code of the stateless revision: the request's protocol version is not served; ``data.supported``."""

SUPPORTED_PROTOCOL_VERSIONS: Final[tuple[str, ...]] = ("2025-11-25", "2025-06-18", "2025-03-26")
"""Handshake revisions this client speaks, newest first; the first is offered in ``initialize``."""
STATELESS_PROTOCOL_VERSIONS: Final[tuple[str, ...]] = ("2026-07-28",)
"""Stateless (per-request envelope) revisions this client speaks, oldest to newest; the last is probed first."""

Era = Literal["auto", "handshake"]

DEFAULT_MAX_RESPONSE_BYTES: Final = 10 * 1024 * 1024
DEFAULT_KEEPALIVE_EXPIRY: Final = 1.5
"""Seconds an idle connection may wait in the pool; below the shortest common server idle timeout (2 s)."""
_MAX_LIST_PAGES: Final = 100

CallKind = Literal["not_sent", "http_error", "jsonrpc_error", "tool_error", "success", "invalid_response", "uncertain"]

KINDS_TOOL_NOT_RUN: Final[frozenset[str]] = frozenset({"not_sent", "http_error", "jsonrpc_error"})
"""Kinds after which the tool did not run: the charge is refunded."""


@dataclass(frozen=True)
class CallResult:
    """The outcome of one ``tools/call``, classified for the receipt.

    ``kind``:

    - ``not_sent``: no byte of the ``tools/call`` request was written: connection
      refused, DNS failure, TLS handshake or certificate failure, connect or pool
      timeout, a request that could not be built (arguments that are not JSON, an
      idempotency key that cannot be a header value), a closed client, or the
      protocol could not be negotiated (the ``server/discover`` probe or the
      handshake failed: ``reason`` starts with ``initialize failed:``; the
      ``tools/call`` itself was never written). Also ``reason ==
      "session_expired"``: the upstream answered 404 to our session id. The MCP
      transport spec says a server MUST answer 404 to a request carrying a
      session id it does not know, so it rejected the request before
      dispatching it; the tool did not run. The client has negotiated again
      and has NOT resent the call.
    - ``http_error``: the upstream (or an intermediary) answered 3xx or 4xx
      without a JSON-RPC response for our id. By HTTP semantics the request was
      refused, not processed; the tool did not run.
    - ``jsonrpc_error``: a valid JSON-RPC error object for our id (with a 2xx,
      3xx or 4xx status). The tool did not run. ``error`` holds code, message, data.
      ``-32022`` (the upstream no longer serves the negotiated protocol version)
      is one too; the client then forgets the era and negotiates again at the
      next request, but does not resend this call.
    - ``tool_error``: a valid result with ``isError: true``. The tool ran and failed.
    - ``success``: a valid result, ``structuredContent`` conforming to the
      tool's outputSchema when one was given.
    - ``invalid_response``: a complete 2xx answer that is not a valid JSON-RPC
      response for our id (garbage, wrong id, neither or both of result and
      error, malformed SSE, empty 202, oversized body), a result whose
      ``structuredContent`` breaks the outputSchema, or, in the stateless era, a
      result whose ``resultType`` is not ``"complete"`` (absent counts as
      complete): ``"input_required"`` asks the client for more input (an
      elicitation, a sampling) before the call completes, which the gateway
      cannot relay to its own caller, and any other type is one this client does
      not know. The tool may have run (in part, for ``input_required``).
    - ``uncertain``: the request may have been delivered but no complete answer
      came back: read timeout, write error or timeout, connection reset or
      closed mid-response (also a pooled keep-alive connection the upstream
      closed just as the request left), a 5xx status (from an intermediary or
      the upstream), an SSE stream that ended without our response, or the
      total timeout. The tool may or may not have run; nothing is resent.
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
    """What was negotiated with the upstream: a handshake session, or the stateless era.

    Handshake era: ``protocol_version`` is the one ``initialize`` agreed on and
    ``session_id`` the upstream's ``Mcp-Session-Id`` (``None`` for an upstream
    without sessions). Stateless era (``stateless`` is true): ``protocol_version``
    is the stateless revision every request carries and ``session_id`` is
    ``None``. ``server_info``, ``capabilities`` and ``instructions`` come from the
    ``initialize`` or ``server/discover`` result.
    """

    session_id: str | None
    protocol_version: str
    server_info: dict[str, Any] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)
    instructions: str | None = None

    @property
    def stateless(self) -> bool:
        """True in the stateless era (no session, the envelope on every request)."""
        return self.protocol_version in STATELESS_PROTOCOL_VERSIONS


class UpstreamError(Exception):
    """A non-``tools/call`` request (negotiation, tools/list, ping) failed; safe to retry later."""

    def __init__(self, reason: str, *, status_code: int | None = None, error: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status_code = status_code
        self.error = error


class _InvalidReply(Exception):
    """The upstream answered completely, but not with a valid JSON-RPC response for our id."""


class _IncompleteReply(Exception):
    """The answer stopped (stream end, total timeout) before our response arrived."""


class _NotStateless(Exception):
    """The ``server/discover`` probe was answered with no evidence of a stateless-era server; ``error`` if any."""

    def __init__(self, error: dict[str, Any] | None) -> None:
        super().__init__("no stateless-era answer")
        self.error = error


@dataclass(frozen=True)
class _Answer:
    """A complete HTTP answer to one request: ``message`` is the JSON-RPC response for its id, if one came."""

    status: int
    headers: dict[str, str]
    message: dict[str, Any] | None
    problem: str | None  # why ``message`` is None

    @property
    def error(self) -> dict[str, Any] | None:
        return self.message.get("error") if self.message is not None else None


@dataclass(frozen=True)
class _Negotiated:
    """The negotiated era as requests use it: the session, the header lines and the ``_meta`` envelope.

    ``lines`` holds the header lines every request carries (``MCP-Protocol-Version``,
    and ``Mcp-Session-Id`` in a handshake session), checked once; ``envelope`` the
    ``_meta`` entries every stateless-era request carries (empty in the handshake era).
    """

    session: UpstreamSession
    lines: str
    envelope: dict[str, Any]

    @property
    def stateless(self) -> bool:
        return bool(self.envelope)

    def head(self, method: str, name: str | None = None) -> str:
        """The era's header lines for one request of ``method`` (``name``: the tool of a ``tools/call``)."""
        if not self.envelope:
            return self.lines
        lines = f"{self.lines}{METHOD_HEADER}: {method}\r\n"
        if name is not None:
            lines += f"{NAME_HEADER}: {_encode_header_value(name)}\r\n"
        return lines

    def params(self, params: dict[str, Any] | None) -> dict[str, Any] | None:
        """``params`` with the envelope added to its ``_meta`` in the stateless era (the envelope wins)."""
        if not self.envelope:
            return params
        params = dict(params or {})
        meta = params.get("_meta")
        params["_meta"] = {**meta, **self.envelope} if isinstance(meta, dict) else dict(self.envelope)
        return params


_TOTAL_TIMEOUT_REASON: Final = "total timeout passed before the response arrived"


class UpstreamClient:
    """Synchronous, thread-safe client for one upstream MCP server (Streamable HTTP, both protocol eras)."""

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
        keepalive_expiry: float = DEFAULT_KEEPALIVE_EXPIRY,
        headers: Mapping[str, str] | None = None,
        client_info: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        era: Era = "auto",
    ) -> None:
        """Configure the client; nothing is sent (and no connection opened) until the first request.

        ``connect_timeout`` bounds the TCP connect and the TLS handshake;
        ``read_timeout`` bounds each wait for response bytes; ``write_timeout``
        (default ``read_timeout``) bounds writing one request; ``pool_timeout``
        (default ``connect_timeout``) bounds the wait for a free connection when
        ``max_connections`` are busy; ``total_timeout`` (optional) bounds a whole
        response from the moment the request is sent, which matters for SSE
        streams that keep a connection alive with comments. An idle connection is
        not reused after ``keepalive_expiry`` seconds, so that a server's idle
        timeout does not close it under a request. ``ssl_context`` replaces the
        default verifying context for ``https://``. ``headers`` are sent with
        every request (the MCP headers, Content-Type, Accept and the framing
        headers are the client's own). Redirects are not followed and proxy
        settings from the environment are ignored, so "sent" always means "sent
        to ``url``". A URL that is not ``http://`` or ``https://`` with a host
        makes every request fail as not sent (``UnsupportedProtocol``).
        ``era="auto"`` negotiates the protocol era on first use (module
        docstring); ``era="handshake"`` never probes and always runs the
        handshake, as clients before the stateless revision do.

        Raises ``ValueError`` for a header that cannot be sent (not ASCII, or a
        control character), for ``max_connections`` below 1 and for an unknown ``era``.
        """
        if era not in ("auto", "handshake"):
            raise ValueError(f"era must be 'auto' or 'handshake', not {era!r}")
        self.url = url
        self._era = era
        self._total_timeout = total_timeout
        self._max_response_bytes = max_response_bytes
        self._client_info = dict(client_info or {"name": "tollgate", "version": "1"})
        origin = _Origin.parse(url)
        self._pool = _Pool(
            origin,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout if write_timeout is not None else read_timeout,
            pool_timeout=pool_timeout if pool_timeout is not None else connect_timeout,
            max_connections=max_connections,
            keepalive_expiry=keepalive_expiry,
            ssl_context=ssl_context,
        )
        defaults = {"Host": origin.host_header, "User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if origin.authorization:
            defaults["Authorization"] = origin.authorization
        fixed: dict[str, tuple[str, str]] = {}
        for name, value in [*defaults.items(), *(headers or {}).items()]:
            key = name.lower()
            if key not in _OWN_HEADERS and not key.startswith(_PARAM_HEADER_PREFIX_LOWER):
                fixed[key] = (name, value)
        self._request_close = "close" in _tokens(fixed.get("connection", ("", ""))[1])
        common = "".join(f"{_check_header(name, value)}\r\n" for name, value in fixed.values())
        # Everything of a request but its per-request lines, built and checked once.
        self._post_head = (
            f"POST {origin.target} HTTP/1.1\r\n{common}Content-Type: application/json\r\nAccept: {ACCEPT}\r\n"
        )
        self._delete_head = f"DELETE {origin.target} HTTP/1.1\r\n{common}"
        self._lock = threading.Lock()
        self._state: _Negotiated | None = None
        _clients.add(self)

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> UpstreamClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """End a handshake session (best-effort ``DELETE``) and close the connection pool.

        Requests made after ``close`` fail as not sent; connections still carrying
        an exchange are closed when it ends. The stateless era has nothing to end.
        """
        state, self._state = self._state, None
        if state is not None and state.session.session_id is not None:
            try:
                head = f"{self._delete_head}{state.lines}\r\n".encode("ascii")
                response = self._pool.request(head, b"", self._deadline(), close=self._request_close)
                try:
                    for _ in _bounded_chunks(response.iter_chunks(), self._max_response_bytes, _ignore):
                        pass
                finally:
                    response.close()
            except (TransportError, _IncompleteReply, _InvalidReply, ValueError):
                logger.debug("upstream session DELETE failed", exc_info=True)
        self._pool.close()

    @property
    def session(self) -> UpstreamSession | None:
        """What was negotiated (see ``UpstreamSession``), or ``None`` before the first request or once forgotten."""
        state = self._state
        return state.session if state is not None else None

    def _after_fork(self) -> None:
        """In a forked child: the parent's sockets, locks and negotiated state are not this process's to use.

        The child negotiates again: a handshake session shared across processes would
        end for all of them at the first one's ``close()`` (its ``DELETE``).
        """
        self._lock = threading.Lock()
        self._state = None
        self._pool.after_fork()

    # -- public requests -------------------------------------------------------------------------

    def initialize(self) -> UpstreamSession:
        """Return what was negotiated, negotiating first if nothing is (the probe, then the handshake if needed).

        Raises ``UpstreamError`` when the upstream cannot be reached, answers the
        negotiation with an error, or speaks no protocol version this client does.
        """
        return self._negotiated().session

    def ping(self) -> None:
        """Check that the upstream answers: ``ping``, or ``server/discover`` in the stateless era (it has no ``ping``).

        Returns when the upstream answered with a result, else raises ``UpstreamError``.
        """
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
        input_schema: Mapping[str, Any] | None = None,
        send_by: float | None = None,
    ) -> CallResult:
        """Send one ``tools/call`` and classify the outcome; never resends, never raises for upstream failures.

        ``send_by`` (a ``time.monotonic()`` instant): when the session's negotiation, or waiting for
        another thread's, ends after it, the call is not sent (``not_sent``), so that a caller whose
        claim is swept after a fixed time never sends a call the sweep has already given up on.

        The idempotency key travels as header ``Idempotency-Key`` and as
        ``params._meta["io.tollgate/idempotency-key"]`` (it overrides the same key
        in ``extra_meta``; in the stateless era the envelope's keys override
        ``extra_meta`` too). With ``output_schema``, a non-error result must carry
        ``structuredContent`` that validates against it, else the kind is
        ``invalid_response``. ``input_schema`` (the tool's inputSchema) is read
        only in the stateless era, for the arguments it marks with
        ``x-mcp-header``: they are mirrored in ``Mcp-Param-*`` headers, which a
        stateless-era server requires for such a tool. Raises ``ValueError``
        (before anything is sent) for an empty idempotency key or an invalid
        ``output_schema`` (``output_schema_problem`` tells which beforehand).
        """
        if not idempotency_key:
            raise ValueError("idempotency_key is required")
        validator = _output_validator(output_schema)
        rid: str | int = request_id if request_id is not None else _new_request_id()
        try:
            state = self._negotiated()
        except UpstreamError as exc:
            return CallResult(kind="not_sent", reason=f"initialize failed: {exc.reason}", request_id=rid)

        meta = dict(extra_meta or {})
        meta[IDEMPOTENCY_META_KEY] = idempotency_key
        if state.envelope:
            meta.update(state.envelope)
        payload = {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {"name": name, "arguments": dict(arguments), "_meta": meta},
        }
        try:
            lines = f"{state.head('tools/call', name)}{IDEMPOTENCY_HEADER}: {_check_value(idempotency_key)}\r\n"
            if state.envelope and input_schema is not None:
                lines += _param_header_lines(input_schema, arguments)
            head, body = self._build(payload, lines)
        except Exception as exc:
            # Arguments that are not JSON, a header value that cannot be sent.
            return CallResult(kind="not_sent", reason=f"request not built: {_describe(exc)}", request_id=rid)

        started = time.monotonic()
        if send_by is not None and started > send_by:
            return CallResult(
                kind="not_sent",
                reason=f"not sent: the session was ready {started - send_by:.1f} s after the call's send deadline",
                request_id=rid,
            )
        try:
            response = self._pool.request(head, body, self._deadline(started), close=self._request_close)
        except RequestNotSent as exc:
            return CallResult(
                kind="not_sent", reason=_describe(exc), request_id=rid, elapsed=time.monotonic() - started
            )
        except _IncompleteReply as exc:
            return CallResult(kind="uncertain", reason=str(exc), request_id=rid, elapsed=time.monotonic() - started)
        except Exception as exc:
            # Write errors and timeouts, resets and timeouts before a complete response head, and
            # anything unexpected: some bytes may have reached the upstream.
            return CallResult(
                kind="uncertain", reason=_describe(exc), request_id=rid, elapsed=time.monotonic() - started
            )
        try:
            return self._classify(response, rid, state, validator, started)
        finally:
            response.close()

    # -- classification --------------------------------------------------------------------------

    def _classify(
        self,
        response: _Response,
        rid: str | int,
        state: _Negotiated,
        validator: jsonschema.protocols.Validator | None,
        started: float,
    ) -> CallResult:
        """Read the answer to a ``tools/call`` and map it to a ``CallResult`` (see its docstring)."""
        status = response.status
        hasher = hashlib.sha256()
        message: dict[str, Any] | None = None
        problem: str | None = None
        interrupted = False
        try:
            message = self._read_reply(response, rid, hasher.update)
        except _InvalidReply as exc:
            problem = str(exc)
        except _IncompleteReply as exc:
            problem, interrupted = str(exc), True
        except Exception as exc:
            problem, interrupted = f"response interrupted: {_describe(exc)}", True
        # The answer is in; the connection goes back before anything else (the re-negotiation
        # below needs one, and the pool may hold only this one).
        response.close()

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
        if not interrupted and _refuses_era(state, status, message, error):
            # The call is classified below like any other answer; only the next request negotiates.
            self._forget(state, "refused the negotiated protocol version")
        if status >= 500:
            return result("uncertain", f"HTTP {status}" + (f": {problem}" if problem else ""), error=error)
        if status == 404 and state.session.session_id is not None and error is None:
            self._forget(state, "session expired")
            try:
                self._negotiated()
            except UpstreamError as exc:
                logger.warning("upstream negotiation after session expiry failed: %s", exc.reason)
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
        if state.envelope and (bad := _not_complete(payload)) is not None:
            return result("invalid_response", bad, result=payload)
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
                # is_valid first: a conforming result (the usual case) needs no error objects.
                violation = (
                    None
                    if validator.is_valid(structured)
                    else jsonschema.exceptions.best_match(validator.iter_errors(structured))
                )
            except Exception as exc:
                # An unresolvable $ref and the like: the result cannot be shown to conform.
                return result("invalid_response", f"outputSchema not evaluable: {_describe(exc)}", result=payload)
            if violation is not None:
                path = "/".join(str(part) for part in violation.absolute_path)
                reason = f"structuredContent violates outputSchema at '{path}': {violation.message}"
                return result("invalid_response", reason[:500], result=payload)
        return result("success", "ok", result=payload)

    # -- negotiation -----------------------------------------------------------------------------

    def _negotiated(self) -> _Negotiated:
        """The negotiated era; under the lock, negotiate first if there is none (one negotiation at a time)."""
        state = self._state
        if state is not None:
            return state
        with self._lock:
            if self._state is None:
                self._state = self._negotiate()
            return self._state

    def _forget(self, stale: _Negotiated, why: str) -> None:
        """Forget ``stale`` (the next request negotiates again) unless another thread already replaced it."""
        with self._lock:
            if self._state is stale:
                logger.info("upstream %s; negotiating again at the next request", why)
                self._state = None

    def _negotiate(self) -> _Negotiated:
        """Probe ``server/discover``, then adopt the stateless era or fall back to the handshake.

        The rules are those of the official SDK client's ``mode="auto"`` (module
        docstring). Caller holds ``self._lock``. Raises ``UpstreamError`` when no
        era could be negotiated.
        """
        if self._era == "handshake":
            return self._initialize()
        version = STATELESS_PROTOCOL_VERSIONS[-1]
        for attempt in (0, 1):
            try:
                result = self._discover(version)
            except _NotStateless as refusal:
                supported = _supported_versions(refusal.error)
                if supported is not None:
                    mutual = [v for v in STATELESS_PROTOCOL_VERSIONS if v in supported]
                    if mutual and attempt == 0:
                        version = mutual[-1]
                        continue
                    if not any(v in SUPPORTED_PROTOCOL_VERSIONS for v in supported):
                        raise UpstreamError(
                            "server/discover: the upstream speaks no protocol version this client does "
                            f"(it supports {', '.join(supported[:8])})",
                            error=refusal.error,
                        ) from None
                logger.debug("upstream server/discover answered without a stateless era; running the handshake")
                try:
                    return self._initialize()
                except UpstreamError as exc:
                    # -32022 to the handshake names stateless versions: the upstream is of that era
                    # after all (a probe that timed out here may have settled it); one more probe.
                    mutual = [v for v in STATELESS_PROTOCOL_VERSIONS if v in (_supported_versions(exc.error) or ())]
                    if attempt == 1 or not mutual:
                        raise
                    version = mutual[-1]
                    continue
            if _valid_discover_result(result):
                mutual = [v for v in STATELESS_PROTOCOL_VERSIONS if v in result["supportedVersions"]]
                if mutual:
                    return self._adopt(result, mutual[-1])
            logger.debug("upstream server/discover result is invalid or lists no stateless version; handshake")
            return self._initialize()
        raise AssertionError("unreachable")  # pragma: no cover - each attempt returns, raises or continues once

    def _envelope(self, version: str) -> dict[str, Any]:
        """The ``_meta`` entries every stateless-era request carries (this client declares no capabilities)."""
        return {
            PROTOCOL_VERSION_META_KEY: version,
            CLIENT_INFO_META_KEY: self._client_info,
            CLIENT_CAPABILITIES_META_KEY: {},
        }

    def _discover(self, version: str) -> dict[str, Any]:
        """Send ``server/discover`` at ``version``; return its result.

        Raises ``_NotStateless`` for an answer that is an era verdict (module
        docstring) and ``UpstreamError`` for one that is not (no complete answer,
        a 5xx without a JSON-RPC error).
        """
        payload = {
            "jsonrpc": "2.0",
            "id": _new_request_id(),
            "method": "server/discover",
            "params": {"_meta": self._envelope(version)},
        }
        lines = f"{PROTOCOL_VERSION_HEADER}: {version}\r\n{METHOD_HEADER}: server/discover\r\n"
        answer = self._send(payload, lines, "server/discover")
        if answer.error is not None:
            raise _NotStateless(answer.error)
        if answer.status >= 500:
            raise UpstreamError(f"server/discover: HTTP {answer.status}", status_code=answer.status)
        if answer.message is None or not 200 <= answer.status < 300:
            raise _NotStateless(None)
        result: dict[str, Any] = answer.message["result"]
        return result

    def _adopt(self, result: dict[str, Any], version: str) -> _Negotiated:
        """The stateless era at ``version``, described by the ``server/discover`` ``result``."""
        meta = _dict_or_empty(result.get("_meta"))
        session = UpstreamSession(
            session_id=None,
            protocol_version=version,
            server_info=_dict_or_empty(meta.get(SERVER_INFO_META_KEY)),
            capabilities=_dict_or_empty(result.get("capabilities")),
            instructions=result.get("instructions") if isinstance(result.get("instructions"), str) else None,
        )
        return _Negotiated(
            session=session, lines=f"{PROTOCOL_VERSION_HEADER}: {version}\r\n", envelope=self._envelope(version)
        )

    def _initialize(self) -> _Negotiated:
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
        answer = self._send(payload, "", "initialize")
        result = _result_of(answer, "initialize")
        version = result.get("protocolVersion")
        if version not in SUPPORTED_PROTOCOL_VERSIONS:
            raise UpstreamError(f"initialize: upstream chose unsupported protocol version {version!r}")
        session = UpstreamSession(
            session_id=answer.headers.get(SESSION_HEADER.lower()),
            protocol_version=str(version),
            server_info=_dict_or_empty(result.get("serverInfo")),
            capabilities=_dict_or_empty(result.get("capabilities")),
            instructions=result.get("instructions") if isinstance(result.get("instructions"), str) else None,
        )
        notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        try:
            lines = _session_lines(session)  # a session id that cannot be sent back fails here
            head, body = self._build(notification, lines)
            response = self._pool.request(head, body, self._deadline(), close=self._request_close)
        except (TransportError, _IncompleteReply, ValueError, UnicodeError) as exc:
            raise UpstreamError(f"notifications/initialized: {_describe(exc)}") from exc
        try:
            for _ in _bounded_chunks(response.iter_chunks(), self._max_response_bytes, _ignore):
                pass
        except (TransportError, _IncompleteReply, _InvalidReply) as exc:
            raise UpstreamError(f"notifications/initialized: {_describe(exc)}") from exc
        finally:
            response.close()
        if not 200 <= response.status < 300:
            raise UpstreamError(f"notifications/initialized: HTTP {response.status}", status_code=response.status)
        return _Negotiated(session=session, lines=lines, envelope={})

    # -- safe requests ---------------------------------------------------------------------------

    def _safe_request(self, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """Send a request that may be resent; negotiate again and resend once if the session or era was refused.

        ``ping`` goes out as ``server/discover`` in the stateless era. Raises ``UpstreamError``.
        """
        for attempt in (1, 2):
            state = self._negotiated()
            wire = "server/discover" if method == "ping" and state.envelope else method
            payload: dict[str, Any] = {"jsonrpc": "2.0", "id": _new_request_id(), "method": wire}
            sent_params = state.params(params)
            if sent_params is not None:
                payload["params"] = sent_params
            answer = self._send(payload, state.head(wire), wire)
            expired = answer.status == 404 and answer.error is None and state.session.session_id is not None
            if expired or _refuses_era(state, answer.status, answer.message, answer.error):
                self._forget(state, "session expired" if expired else "refused the negotiated protocol version")
                if attempt == 1:
                    continue
            result = _result_of(answer, wire)
            if state.envelope and (bad := _not_complete(result)) is not None:
                raise UpstreamError(f"{wire}: {bad}", status_code=answer.status)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, payload: dict[str, Any], lines: str, method: str) -> _Answer:
        """Send a request and read its complete answer; raises ``UpstreamError`` when none came.

        No complete answer: nothing could be sent, the exchange failed, or a 2xx
        answer ended (or ran out of time) before our response.
        """
        try:
            head, body = self._build(payload, lines)
            response = self._pool.request(head, body, self._deadline(), close=self._request_close)
        except (TransportError, _IncompleteReply, ValueError, UnicodeError) as exc:
            raise UpstreamError(f"{method}: {_describe(exc)}") from exc
        try:
            status = response.status
            message: dict[str, Any] | None = None
            problem: str | None = None
            try:
                message = self._read_reply(response, payload["id"], _ignore)
            except _InvalidReply as exc:
                problem = str(exc)
            except _IncompleteReply as exc:
                if 200 <= status < 300:
                    raise UpstreamError(f"{method}: {exc}", status_code=status) from exc
                problem = str(exc)
            except TransportError as exc:
                raise UpstreamError(f"{method}: {_describe(exc)}", status_code=status) from exc
            return _Answer(status=status, headers=response.headers, message=message, problem=problem)
        finally:
            response.close()

    # -- requests and replies --------------------------------------------------------------------

    def _deadline(self, started: float | None = None) -> float | None:
        """When a response must be complete (``total_timeout`` after ``started``), or ``None``."""
        if self._total_timeout is None:
            return None
        return (started if started is not None else time.monotonic()) + self._total_timeout

    def _build(self, payload: dict[str, Any], lines: str) -> tuple[bytes, bytes]:
        """The POST head and body for one JSON-RPC message; raises (nothing sent) if it cannot be encoded.

        ``lines`` holds the request's own header lines, already checked (each ending in CRLF).
        """
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        head = f"{self._post_head}{lines}Content-Length: {len(body)}\r\n\r\n"
        return head.encode("ascii"), body

    def _read_reply(self, response: _Response, rid: str | int, on_chunk: Callable[[bytes], None]) -> dict[str, Any]:
        """Read the JSON-RPC response for ``rid`` from a JSON body or an SSE stream.

        SSE notifications and server-to-client requests are skipped; reading stops
        at our response. Raises ``_InvalidReply`` for a body that is not a valid
        response for ``rid``, ``_IncompleteReply`` when the stream ends or the total
        timeout passes first; ``TransportError`` for a failed read.
        """
        chunks = _bounded_chunks(response.iter_chunks(), self._max_response_bytes, on_chunk)
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "text/event-stream":
            try:
                for event in _sse_events(chunks):
                    if event.event != "message" or not event.data:
                        continue
                    message = _load_message(event.data, "SSE event data")
                    if isinstance(message, dict) and "method" in message:
                        continue
                    return _storable(_match_response(message, rid))
            except UnicodeDecodeError as exc:
                raise _InvalidReply("SSE stream is not UTF-8") from exc
            raise _IncompleteReply("SSE stream ended without a response")
        body = b"".join(chunks)
        if not body:
            raise _InvalidReply(f"empty body (HTTP {response.status})")
        return _storable(_match_response(_load_message(body, "body"), rid))


_clients: weakref.WeakSet[UpstreamClient] = weakref.WeakSet()


def _forget_inherited_connections() -> None:
    for client in list(_clients):
        client._after_fork()


if hasattr(os, "register_at_fork"):
    # A client created before a fork (gunicorn --preload) must not share its sockets with the
    # children: two processes reading one connection would take each other's responses.
    os.register_at_fork(after_in_child=_forget_inherited_connections)


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


def _load_message(raw: bytes | str, what: str) -> Any:
    """A JSON message within ``config.jsonbounds``' nesting and number bounds, else ``_InvalidReply``:
    what could not be stored, hashed or signed unchanged is no answer the gateway can keep."""
    try:
        return loads_bounded(raw)
    except JSONBodyError as exc:
        raise _InvalidReply(f"{what} is outside the JSON this gateway keeps: {exc}") from exc
    except ValueError as exc:
        raise _InvalidReply(f"{what} is not JSON") from exc


def _storable(message: dict[str, Any]) -> dict[str, Any]:
    """``message``, unless a string in it (a key or a value) holds NUL or a lone surrogate (``_InvalidReply``)."""
    found = unstorable(message)
    if found is not None:
        where, problem, _ = found
        path = "/".join(str(part) for part in where)[:200]
        raise _InvalidReply(f"answer holds text that cannot be stored at '{path}': {problem}")
    return message


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
    if result.get("_meta") is not None and not isinstance(result["_meta"], dict):
        return "result._meta is not an object"
    return None


def _result_of(answer: _Answer, method: str) -> dict[str, Any]:
    """The result of a non-``tools/call`` request's answer; ``UpstreamError`` for anything else."""
    status = answer.status
    if answer.message is None:
        raise UpstreamError(
            f"{method}: {answer.problem}" if 200 <= status < 300 else f"{method}: HTTP {status}", status_code=status
        )
    error = answer.error
    if error is not None:
        raise UpstreamError(
            f"{method}: JSON-RPC error {error.get('code')}: {error.get('message')}", status_code=status, error=error
        )
    if not 200 <= status < 300:
        raise UpstreamError(f"{method}: HTTP {status}", status_code=status)
    result: dict[str, Any] = answer.message["result"]
    return result


def _refuses_era(state: _Negotiated, status: int, message: dict[str, Any] | None, error: Any) -> bool:
    """Whether a complete answer says the upstream no longer serves the negotiated era.

    In any era, ``-32022`` for our id. In the stateless era also a 400, 404 or 405
    without a JSON-RPC response for our id: what a handshake-only server answers a
    request without a session id or with a protocol version it does not know (the
    official SDK's handshake transport answers 400 with an error for id null). A
    stateless-era server answers its own refusals with an error for our id.
    """
    if error is not None:
        return isinstance(error, dict) and error.get("code") == UNSUPPORTED_PROTOCOL_VERSION
    return bool(state.envelope) and message is None and status in (400, 404, 405)


def _not_complete(result: dict[str, Any]) -> str | None:
    """Why a stateless-era result is not final (its ``resultType`` is not ``"complete"``), or ``None``."""
    result_type = result.get("resultType", "complete")
    if result_type == "complete":
        return None
    shown = repr(result_type) if isinstance(result_type, str) else f"of type {type(result_type).__name__}"
    return f"resultType {shown[:60]} is not 'complete': only a complete result can be relayed"


def _supported_versions(error: dict[str, Any] | None) -> list[str] | None:
    """``data.supported`` of a ``-32022`` error, or ``None`` (another error, or data the SDK would not parse)."""
    if error is None or error.get("code") != UNSUPPORTED_PROTOCOL_VERSION:
        return None
    data = error.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("requested"), str):
        return None
    supported = data.get("supported")
    if not isinstance(supported, list) or not all(isinstance(version, str) for version in supported):
        return None
    return supported


_CAPABILITY_OBJECTS: Final = (
    "experimental",
    "logging",
    "prompts",
    "resources",
    "tools",
    "completions",
    "extensions",
    "tasks",
)


def _valid_discover_result(result: dict[str, Any]) -> bool:
    """Whether ``result`` is a ``server/discover`` result as the official SDK parses one.

    ``supportedVersions`` a list of strings and ``capabilities`` an object (its
    known members objects when present) are required; ``instructions`` a string,
    ``resultType`` a string, ``ttlMs`` an integer (a negative one is floored, not
    refused), ``cacheScope`` public or private and ``_meta`` an object, when
    present. Unknown members are ignored.
    """
    versions = result.get("supportedVersions")
    if not isinstance(versions, list) or not all(isinstance(version, str) for version in versions):
        return False
    capabilities = result.get("capabilities")
    if not isinstance(capabilities, dict):
        return False
    if any(
        capabilities.get(name) is not None and not isinstance(capabilities[name], dict) for name in _CAPABILITY_OBJECTS
    ):
        return False
    if result.get("instructions") is not None and not isinstance(result["instructions"], str):
        return False
    if not isinstance(result.get("resultType", "complete"), str):
        return False
    ttl = result.get("ttlMs", 0)
    if isinstance(ttl, bool) or not (isinstance(ttl, int) or (isinstance(ttl, float) and ttl.is_integer())):
        return False
    if result.get("cacheScope", "private") not in ("public", "private"):
        return False
    return result.get("_meta") is None or isinstance(result["_meta"], dict)


_PLAIN_HEADER_VALUE: Final = re.compile(r"[\x20-\x7e]*")
_BASE64_SENTINEL: Final = re.compile(r"=\?base64\?.*\?=")


def _encode_header_value(value: str) -> str:
    """``value`` as the stateless revision carries it in ``Mcp-Name`` and ``Mcp-Param-*``.

    Printable ASCII without leading or trailing whitespace travels as is; anything
    else (and a value that looks like the sentinel) as ``=?base64?<UTF-8, base64>?=``.
    """
    if _PLAIN_HEADER_VALUE.fullmatch(value) and value == value.strip() and not _BASE64_SENTINEL.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


# JSON Schema 2020-12 keywords whose values are schema positions, by shape; only ``properties`` keeps
# a position reachable by a plain property path (the official SDK's walk, so that both ends agree).
_SUBSCHEMA_ONE: Final = frozenset(
    {
        "items",
        "contains",
        "unevaluatedItems",
        "additionalProperties",
        "propertyNames",
        "unevaluatedProperties",
        "not",
        "if",
        "then",
        "else",
        "contentSchema",
    }
)
_SUBSCHEMA_LIST: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SUBSCHEMA_MAP: Final = frozenset({"patternProperties", "dependentSchemas", "$defs", "definitions"})
_X_MCP_HEADER: Final = "x-mcp-header"


def _param_header_map(schema: Any) -> list[tuple[tuple[str, ...], str]]:
    """The (argument path, header token) pairs that ``x-mcp-header`` annotations declare in an inputSchema.

    Empty when there are none, and when any annotation is invalid (off a plain
    ``properties`` path, not a header token, on a property that is not a string,
    integer or boolean, or a token repeated case-insensitively): a conforming
    client then sends no ``Mcp-Param-*`` header and the server checks none.
    """
    found: list[tuple[tuple[str, ...], str]] = []
    seen: set[str] = set()
    stack: list[tuple[tuple[str, ...] | None, Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        if _X_MCP_HEADER in node:
            token = node[_X_MCP_HEADER]
            if (
                not path
                or not isinstance(token, str)
                or not _HEADER_NAME.fullmatch(token)
                or node.get("type") not in ("string", "integer", "boolean")
                or token.lower() in seen
            ):
                return []
            seen.add(token.lower())
            found.append((path, token))
        for keyword, value in node.items():
            if keyword == "properties" and isinstance(value, dict):
                stack.extend(((*path, name) if path is not None else None, sub) for name, sub in value.items())
            elif keyword in _SUBSCHEMA_ONE:
                stack.append((None, value))
            elif keyword in _SUBSCHEMA_LIST and isinstance(value, list):
                stack.extend((None, sub) for sub in value)
            elif keyword in _SUBSCHEMA_MAP and isinstance(value, dict):
                stack.extend((None, sub) for sub in value.values())
    return found


def _param_header_lines(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str:
    """``Mcp-Param-<token>`` header lines for the arguments ``schema`` marks with ``x-mcp-header``.

    An argument that is absent, null or not a string, number or boolean gets no
    header; booleans are ``true``/``false``, values that are not plain printable
    ASCII are base64-wrapped (``_encode_header_value``).
    """
    lines = ""
    for path, token in _param_header_map(schema):
        value: Any = arguments
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, bool):
            rendered = "true" if value else "false"
        elif isinstance(value, str | int | float):
            try:
                rendered = str(value)
            except ValueError:  # an integer beyond the interpreter's digit limit has no rendering
                continue
        else:
            continue
        lines += f"{PARAM_HEADER_PREFIX}{token}: {_encode_header_value(rendered)}\r\n"
    return lines


_validator_cache: dict[str, jsonschema.protocols.Validator | str] = {}
"""Compiled validators, and the reason (a string) for schemas that cannot be one, by canonical JSON."""
_validator_lock = threading.Lock()


def _output_validator(schema: Mapping[str, Any] | None) -> jsonschema.protocols.Validator | None:
    """A validator for ``schema`` (draft from ``$schema``, else 2020-12); ``ValueError`` if the schema is invalid.

    Checking and compiling a schema costs milliseconds; validators (and the reasons why a schema
    is none) are cached by the schema's canonical JSON (a tool's outputSchema changes only when the
    registry is synced).
    """
    if schema is None:
        return None
    fingerprint = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    cached = _validator_cache.get(fingerprint)
    if isinstance(cached, str):
        raise ValueError(cached)
    if cached is not None:
        return cached
    entry: jsonschema.protocols.Validator | str
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        entry = cls(schema)
    except jsonschema.exceptions.SchemaError as exc:
        entry = f"invalid output_schema: {exc.message}"[:300]
    except Exception as exc:  # not a schema at all (a number, a ``$schema`` that is not a string)
        entry = f"invalid output_schema: {_describe(exc)}"
    with _validator_lock:
        if len(_validator_cache) > 1024:
            _validator_cache.clear()
        _validator_cache[fingerprint] = entry
    if isinstance(entry, str):
        raise ValueError(entry)
    return entry


def output_schema_problem(schema: Any) -> str | None:
    """Why ``call_tool`` would refuse ``schema`` as its ``output_schema``; None if it would not.

    ``call_tool`` raises ``ValueError(f"invalid output_schema: {why}")``; this returns ``why``. None
    for no schema. Cheap after the first time for a given schema (cached as the validators are).
    """
    try:
        _output_validator(schema)
    except ValueError as exc:
        return str(exc).removeprefix("invalid output_schema: ")
    return None


def _ignore(chunk: bytes) -> None:
    """An ``on_chunk`` for bodies whose hash nobody keeps."""


def _bounded_chunks(chunks: Iterator[bytes], max_bytes: int, on_chunk: Callable[[bytes], None]) -> Iterator[bytes]:
    """The response body in chunks, each passed to ``on_chunk`` first; ``_InvalidReply`` past ``max_bytes``.

    The consumer stops pulling once it has its answer (an SSE event), so an answer
    that has arrived is never discarded; a JSON body counts as arrived when its end
    has been read. The total timeout is the wire's (``_Response``).
    """
    total = 0
    for chunk in chunks:
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


# -- the wire: HTTP/1.1 over a pool of kept-alive sockets ----------------------------------------
#
# The exception classes name the failure in ``CallResult.reason`` (``_describe``). Every one
# raised before the first request byte is handed to the socket is a ``RequestNotSent``; that
# is the whole of the "not sent" judgement, so nothing else may subclass it.


class TransportError(Exception):
    """The HTTP exchange failed before a complete response; the class name opens the reported reason."""


class RequestNotSent(TransportError):
    """Raised only before the first byte of the request reached the socket: the upstream saw nothing."""


class UnsupportedProtocol(RequestNotSent):
    """The URL is not ``http://`` or ``https://`` with a host and a valid port."""


class ConnectError(RequestNotSent):
    """Name resolution, the TCP connect or the TLS handshake (certificate verification included) failed."""


class ConnectTimeout(RequestNotSent):
    """The TCP connect or the TLS handshake took longer than the connect timeout."""


class PoolTimeout(RequestNotSent):
    """Every connection stayed busy for the whole pool timeout."""


class ClientClosed(RequestNotSent):
    """The client had been closed."""


class WriteError(TransportError):
    """Writing the request failed; part of it may have reached the upstream."""


class WriteTimeout(TransportError):
    """Writing the request took longer than the write timeout; part of it may have reached the upstream."""


class ReadError(TransportError):
    """Reading the response failed (connection reset, TLS error)."""


class ReadTimeout(TransportError):
    """No response byte arrived within the read timeout."""


class RemoteProtocolError(TransportError):
    """The upstream closed the connection before a complete response, or broke HTTP/1.1 framing."""


_HEAD_END: Final = re.compile(rb"\n\r?\n")
_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE: Final = re.compile(r"[\t\x20-\x7e]*")
_CHUNK_SIZE: Final = re.compile(rb"[0-9A-Fa-f]{1,16}")
_OWN_HEADERS: Final = frozenset(
    {
        "accept",
        "content-length",
        "content-type",
        "idempotency-key",
        "mcp-method",
        "mcp-name",
        "mcp-protocol-version",
        "mcp-session-id",
        "transfer-encoding",
    }
)
"""Headers each request sets itself; the same names (and ``Mcp-Param-*``) in the ``headers`` argument are dropped."""
_PARAM_HEADER_PREFIX_LOWER: Final = PARAM_HEADER_PREFIX.lower()
_MAX_HEAD_BYTES: Final = 64 * 1024
_MAX_LINE_BYTES: Final = 8 * 1024
_RECV_BYTES: Final = 64 * 1024
_DRAIN_GRACE: Final = 0.002
_DRAIN_BYTES: Final = 64 * 1024


def _check_value(value: str) -> str:
    """``value`` if it can be sent as a header value (printable ASCII and tabs), else ``ValueError``."""
    if not _HEADER_VALUE.fullmatch(value):
        raise ValueError("header value is not printable ASCII")
    return value


def _check_header(name: str, value: str) -> str:
    """The header line ``name: value`` (without CRLF), or ``ValueError`` if it cannot be sent."""
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError(f"invalid header name {name!r}")
    return f"{name}: {_check_value(value)}"


def _session_lines(session: UpstreamSession) -> str:
    lines = f"{PROTOCOL_VERSION_HEADER}: {_check_value(session.protocol_version)}\r\n"
    if session.session_id is not None:
        lines += f"{SESSION_HEADER}: {_check_value(session.session_id)}\r\n"
    return lines


def _tokens(value: str) -> set[str]:
    return {token.strip().lower() for token in value.split(",")}


@dataclass(frozen=True)
class _Origin:
    """Where requests go, parsed once from the URL; ``error`` is set for a URL no request can use."""

    tls: bool = False
    host: str = ""
    port: int = 0
    target: str = "/"
    host_header: str = ""
    authorization: str = ""
    error: str | None = None

    @classmethod
    def parse(cls, url: str) -> _Origin:
        try:
            parts = urlsplit(url)
            port = parts.port
            scheme = parts.scheme.lower()
            if scheme not in ("http", "https"):
                return cls(error=f"Request URL has an unsupported protocol '{scheme}://'")
            host = parts.hostname
            if not host:
                return cls(error="Request URL is missing a host")
            tls = scheme == "https"
            default_port = 443 if tls else 80
            port = port or default_port
            host_header = f"[{host}]" if ":" in host else host.encode("idna").decode("ascii")
            if port != default_port:
                host_header += f":{port}"
        except ValueError as exc:  # UnicodeError included (a host IDNA cannot encode)
            return cls(error=f"invalid URL: {exc}")
        target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
        if parts.query:
            target += "?" + quote(parts.query, safe="/?%:@!$&'()*+,;=-._~")
        authorization = ""
        if parts.username is not None:
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(credentials.encode()).decode("ascii")
        return cls(tls=tls, host=host, port=port, target=target, host_header=host_header, authorization=authorization)


_default_context: ssl.SSLContext | None = None
_default_context_lock = threading.Lock()


def _default_ssl_context() -> ssl.SSLContext:
    """The verifying client context: the system trust store plus certifi's bundle when installed.

    Built once per process (loading the bundles costs milliseconds); an ``SSLContext``
    may wrap sockets from several threads.
    """
    global _default_context
    with _default_context_lock:
        if _default_context is None:
            context = ssl.create_default_context()
            try:
                import certifi
            except ImportError:
                pass
            else:
                context.load_verify_locations(cafile=certifi.where())
            context.set_alpn_protocols(["http/1.1"])
            _default_context = context
        return _default_context


if hasattr(select, "poll"):

    def _readable(sock: socket.socket) -> bool:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))

else:  # pragma: no cover - platforms without poll(); select() is limited to low descriptors

    def _readable(sock: socket.socket) -> bool:
        return bool(select.select([sock], [], [], 0)[0])


class _Connection:
    """One socket to the upstream and the bytes read from it but not yet consumed."""

    __slots__ = ("buffer", "idle_since", "sock", "timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.idle_since = 0.0
        self.timeout = sock.gettimeout()

    def _set_timeout(self, timeout: float) -> None:
        if timeout != self.timeout:  # each settimeout() is a system call
            self.sock.settimeout(timeout)
            self.timeout = timeout

    def send(self, data: bytes, timeout: float) -> None:
        """Write all of ``data`` within ``timeout`` seconds (``sendall``'s timeout covers the whole write)."""
        try:
            self._set_timeout(timeout)
            self.sock.sendall(data)
        except TimeoutError as exc:
            raise WriteTimeout(str(exc) or "timed out") from exc
        except OSError as exc:
            raise WriteError(str(exc) or type(exc).__name__) from exc

    def recv(self, timeout: float) -> bytes:
        """The next bytes from the socket (``b""`` at the end of the stream), waiting at most ``timeout``."""
        try:
            self._set_timeout(timeout)
            return self.sock.recv(_RECV_BYTES)
        except TimeoutError as exc:
            raise ReadTimeout(str(exc) or "timed out") from exc
        except OSError as exc:
            raise ReadError(str(exc) or type(exc).__name__) from exc

    def reusable(self, now: float, expiry: float) -> bool:
        """Whether an idle connection can carry the next request.

        An idle socket that is readable has been closed by the peer (or holds bytes
        nobody asked for): a request written to it would be lost or misread, so it
        is not reused. Nor is one idle for longer than ``expiry``.
        """
        if self.buffer or now - self.idle_since > expiry:
            return False
        sock = self.sock
        try:
            if isinstance(sock, ssl.SSLSocket) and sock.pending():
                return False
            return not _readable(sock)
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class _Pool:
    """Kept-alive connections to one origin, shared by threads; at most ``max_connections`` open at once.

    A connection is held by one exchange at a time. Idle connections are reused
    newest first, after ``_Connection.reusable`` says yes.
    """

    def __init__(
        self,
        origin: _Origin,
        *,
        connect_timeout: float,
        read_timeout: float,
        write_timeout: float,
        pool_timeout: float,
        max_connections: int,
        keepalive_expiry: float,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.origin = origin
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self._connect_timeout = connect_timeout
        self._pool_timeout = pool_timeout
        self._max = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._ssl_context = ssl_context
        self._cond = threading.Condition(threading.Lock())
        self._idle: list[_Connection] = []
        self._open = 0  # idle, busy and being opened
        self._closed = False

    def request(self, head: bytes, body: bytes, deadline: float | None, *, close: bool) -> _Response:
        """Send one request on a pooled or new connection and read the response head.

        Raises ``RequestNotSent`` when nothing was written (unusable URL, closed
        client, pool wait, connect), another ``TransportError`` once a byte may
        have left, and ``_IncompleteReply`` when ``deadline`` passes before the head
        arrived. Never resends, on any connection. The caller must ``close()`` the
        response. ``close`` says the request asked the server to close the connection.
        """
        if self.origin.error is not None:
            raise UnsupportedProtocol(self.origin.error)
        response = _Response(self, self._acquire(), deadline, keep_alive=not close)
        try:
            response.send(head + body)  # one write: the head and a small body leave in one segment
            response.read_head()
        except BaseException:
            response.discard()
            raise
        return response

    def _acquire(self) -> _Connection:
        stale: list[_Connection] = []
        try:
            with self._cond:
                deadline: float | None = None
                while True:
                    if self._closed:
                        raise ClientClosed("the upstream client is closed")
                    now = time.monotonic()
                    while self._idle:
                        conn = self._idle.pop()
                        if conn.reusable(now, self._keepalive_expiry):
                            return conn
                        stale.append(conn)
                        self._open -= 1
                    if self._open < self._max:
                        self._open += 1
                        break
                    if deadline is None:
                        deadline = now + self._pool_timeout
                    if now >= deadline:
                        raise PoolTimeout(f"no connection came free within {self._pool_timeout} s")
                    self._cond.wait(deadline - now)
        finally:
            for conn in stale:
                conn.close()
        try:
            return self._connect()
        except BaseException:
            self._forget_one()
            raise

    def _connect(self) -> _Connection:
        origin = self.origin
        try:
            sock = socket.create_connection((origin.host, origin.port), timeout=self._connect_timeout)
        except TimeoutError as exc:
            raise ConnectTimeout(str(exc) or "timed out") from exc
        except (OSError, ValueError) as exc:  # socket.gaierror is an OSError
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if origin.tls:
                context = self._ssl_context or _default_ssl_context()
                sock = context.wrap_socket(sock, server_hostname=origin.host)  # handshake, under the connect timeout
        except TimeoutError as exc:
            sock.close()
            raise ConnectTimeout(str(exc) or "timed out") from exc
        except (OSError, ValueError) as exc:  # ssl.SSLError (certificate verification too) is an OSError
            sock.close()
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(sock)

    def release(self, conn: _Connection, reusable: bool) -> None:
        """Take back ``conn``: into the idle list when ``reusable`` (and the pool is open), else close it."""
        if reusable:
            conn.idle_since = time.monotonic()
            with self._cond:
                if not self._closed:
                    self._idle.append(conn)
                    self._cond.notify()
                    return
        conn.close()
        self._forget_one()

    def _forget_one(self) -> None:
        with self._cond:
            self._open -= 1
            self._cond.notify()

    def close(self) -> None:
        """Close the idle connections and refuse new requests; busy ones close when released."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()

    def after_fork(self) -> None:
        """In a forked child: drop the parent's connections (closing only this process's descriptors)."""
        self._cond = threading.Condition(threading.Lock())
        idle, self._idle = self._idle, []
        self._open = 0
        for conn in idle:
            conn.close()


class _Response:
    """One exchange on a connection: the parsed response head, then the body as chunks.

    ``headers`` maps lower-case names to values (repeated fields joined with ", ").
    The body is framed by chunked transfer coding, Content-Length or the end of the
    connection (RFC 9112 section 6.3). ``close()`` returns the connection to the pool
    only when the body was read to its end, nothing followed it, neither side asked
    to close and the answer was HTTP/1.1; otherwise the socket is closed.
    """

    status: int
    headers: dict[str, str]

    def __init__(self, pool: _Pool, conn: _Connection, deadline: float | None, *, keep_alive: bool) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._deadline = deadline
        self._grace: float | None = None
        self._keep_alive = keep_alive
        self._chunked = False
        self._length: int | None = None
        self._state = "head"  # head, ready, body, complete, broken
        self._body: Iterator[bytes] | None = None

    # -- reading ---------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        assert self._conn is not None
        self._conn.send(data, self._pool.write_timeout)

    def _recv(self) -> bytes:
        """One read, bounded by the read timeout, the total deadline (``_IncompleteReply``) and the drain grace."""
        assert self._conn is not None
        timeout, by_deadline = self._pool.read_timeout, False
        if self._deadline is not None or self._grace is not None:
            now = time.monotonic()
            if self._deadline is not None:
                left = self._deadline - now
                if left <= 0:
                    raise _IncompleteReply(_TOTAL_TIMEOUT_REASON)
                if left < timeout:
                    timeout, by_deadline = left, True
            if self._grace is not None:
                left = self._grace - now
                if left <= 0:
                    raise ReadTimeout("nothing more arrived")
                if left < timeout:
                    timeout, by_deadline = left, False
        try:
            return self._conn.recv(timeout)
        except ReadTimeout:
            if by_deadline:
                raise _IncompleteReply(_TOTAL_TIMEOUT_REASON) from None
            raise

    def read_head(self) -> None:
        """Read and parse the status line and header fields, skipping interim (1xx) responses."""
        assert self._conn is not None
        buf = self._conn.buffer
        while True:
            match = _HEAD_END.search(buf)
            while match is None:
                if len(buf) > _MAX_HEAD_BYTES:
                    raise RemoteProtocolError(f"response head larger than {_MAX_HEAD_BYTES} bytes")
                data = self._recv()
                if not data:
                    if buf:
                        raise RemoteProtocolError("Server disconnected in the middle of the response head.")
                    raise RemoteProtocolError("Server disconnected without sending a response.")
                searched = max(0, len(buf) - 2)
                buf += data
                match = _HEAD_END.search(buf, searched)
            lines = bytes(buf[: match.start()]).split(b"\n")
            del buf[: match.end()]
            status_line = lines[0].rstrip(b"\r")
            version, _, rest = status_line.partition(b" ")
            code = rest[:3]
            if (
                version not in (b"HTTP/1.1", b"HTTP/1.0")
                or len(code) != 3
                or not code.isdigit()
                or code < b"100"
                or rest[3:4] not in (b"", b" ")
            ):
                raise RemoteProtocolError(f"malformed status line {status_line[:100]!r}")
            status = int(code)
            if status >= 200:
                break
            if status == 101:
                raise RemoteProtocolError("unexpected 101 Switching Protocols")
        self.status = status
        self.headers = headers = _parse_fields(lines[1:])
        if version == b"HTTP/1.0" or ("connection" in headers and "close" in _tokens(headers["connection"])):
            self._keep_alive = False
        if status in (204, 304):
            self._length = 0
        elif "transfer-encoding" in headers:
            self._chunked = headers["transfer-encoding"].rsplit(",", 1)[-1].strip().lower() == "chunked"
            if not self._chunked or "content-length" in headers:
                self._keep_alive = False  # close-delimited, or framing a proxy could read otherwise
        elif "content-length" in headers:
            values = {value.strip() for value in headers["content-length"].split(",")}
            value = values.pop()
            if values or not (value.isascii() and value.isdigit()) or len(value) > 18:
                raise RemoteProtocolError(f"invalid Content-Length {headers['content-length'][:40]!r}")
            self._length = int(value)
        else:
            self._keep_alive = False  # the body ends when the server closes the connection
        self._state = "ready"

    def iter_chunks(self) -> Iterator[bytes]:
        """The body's bytes as they arrive (one iterator per response; stopping early is allowed)."""
        if self._body is None:
            self._body = self._read_body()
        return self._body

    def _read_body(self) -> Iterator[bytes]:
        self._state = "body"
        try:
            if self._chunked:
                yield from self._chunked_body()
            elif self._length is not None:
                yield from self._sized_body(self._length)
            else:
                yield from self._close_delimited_body()
        except BaseException:
            self._state = "broken"
            raise
        self._state = "complete"

    def _sized_body(self, length: int) -> Iterator[bytes]:
        assert self._conn is not None
        buf = self._conn.buffer
        remaining = length
        while remaining:
            if buf:
                if len(buf) <= remaining:
                    piece = bytes(buf)
                    buf.clear()
                else:
                    piece = bytes(buf[:remaining])
                    del buf[:remaining]
            else:
                piece = self._recv()
                if not piece:
                    raise RemoteProtocolError(
                        "peer closed connection without sending complete message body "
                        f"(received {length - remaining} of {length} bytes)"
                    )
                if len(piece) > remaining:
                    buf += piece[remaining:]  # more than was announced: kept, so the connection is not reused
                    piece = piece[:remaining]
            remaining -= len(piece)
            yield piece

    def _chunked_body(self) -> Iterator[bytes]:
        while True:
            line = self._line()
            size = line.split(b";", 1)[0].strip(b" \t")  # chunk extensions are ignored
            if not _CHUNK_SIZE.fullmatch(size):
                raise RemoteProtocolError(f"malformed chunk size line {line[:100]!r}")
            if size.strip(b"0") == b"":
                break
            yield from self._sized_body(int(size, 16))
            if self._line():
                raise RemoteProtocolError("chunk data not followed by CRLF")
        trailer_bytes = 0
        while line := self._line():  # trailer fields are read and ignored
            trailer_bytes += len(line)
            if trailer_bytes > _MAX_HEAD_BYTES:
                raise RemoteProtocolError(f"trailer fields larger than {_MAX_HEAD_BYTES} bytes")

    def _line(self) -> bytes:
        """One line of chunked framing (CRLF or LF), without its end."""
        assert self._conn is not None
        buf = self._conn.buffer
        searched = 0
        while (end := buf.find(b"\n", searched)) < 0:
            if len(buf) > _MAX_LINE_BYTES:
                raise RemoteProtocolError("chunked framing line too long")
            data = self._recv()
            if not data:
                raise RemoteProtocolError("peer closed connection without sending complete message body")
            searched = len(buf)
            buf += data
        line = bytes(buf[:end])
        del buf[: end + 1]
        return line[:-1] if line.endswith(b"\r") else line

    def _close_delimited_body(self) -> Iterator[bytes]:
        assert self._conn is not None
        buf = self._conn.buffer
        if buf:
            piece = bytes(buf)
            buf.clear()
            yield piece
        while data := self._recv():
            yield data

    # -- ending ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Give the connection back: to the pool if the exchange ended cleanly (see the class docstring)."""
        conn = self._conn
        if conn is None:
            return
        reusable = self._keep_alive and self._finish() and not conn.buffer
        self._conn = None
        self._pool.release(conn, reusable)

    def discard(self) -> None:
        """Close the connection whatever its state (the exchange failed)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn, False)

    def _finish(self) -> bool:
        """Whether the body has been read to its end, reading on briefly if the consumer stopped early.

        A consumer stops at our SSE event; the server usually ends the stream right
        after it, and reading that end (at most ``_DRAIN_BYTES`` within
        ``_DRAIN_GRACE`` seconds) keeps the connection for the next call.
        """
        if self._state in ("ready", "body"):
            self._grace = time.monotonic() + _DRAIN_GRACE
            drained = 0
            try:
                for piece in self.iter_chunks():
                    drained += len(piece)
                    if drained > _DRAIN_BYTES:
                        return False
            except Exception:
                return False
        return self._state == "complete"


def _parse_fields(lines: list[bytes]) -> dict[str, str]:
    """Header fields from the lines of a response head (CRLF or LF; obsolete line folding unfolded)."""
    headers: dict[str, str] = {}
    last: str | None = None
    for raw in lines:
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if line[:1] in (b" ", b"\t"):
            if last is None:
                raise RemoteProtocolError("response head starts with a continuation line")
            headers[last] = headers[last] + " " + line.strip(b" \t").decode("latin-1")
            continue
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise RemoteProtocolError(f"malformed header line {line[:100]!r}")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
        last = key
    return headers
