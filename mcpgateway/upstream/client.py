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
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, Self

import jsonschema  # type: ignore[import-untyped]  # no stubs in the environment; its package imports the submodules

from mcpgateway.upstream.http import (
    RequestNotSent,
    TransportError,
    _check_header,
    _check_value,
    _describe,
    _IncompleteReply,
    _InvalidReply,
    _Origin,
    _Pool,
    _Response,
    _tokens,
)
from mcpgateway.upstream.protocol import (
    ACCEPT,
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_META_KEY,
    METHOD_HEADER,
    NAME_HEADER,
    PARAM_HEADER_PREFIX,
    PROTOCOL_VERSION_HEADER,
    PROTOCOL_VERSION_META_KEY,
    SERVER_INFO_META_KEY,
    SESSION_HEADER,
    STATELESS_PROTOCOL_VERSIONS,
    SUPPORTED_PROTOCOL_VERSIONS,
    UNSUPPORTED_PROTOCOL_VERSION,
    USER_AGENT,
    _encode_header_value,
    _invalid_call_result,
    _load_message,
    _match_response,
    _new_request_id,
    _not_complete,
    _param_header_lines,
    _storable,
    _supported_versions,
    _valid_discover_result,
)
from mcpgateway.upstream.sse import _bounded_chunks, _ignore, _sse_events, _SSEEvent
from mcpgateway.upstream.validators import _output_validator

logger = logging.getLogger(__name__)

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

    @classmethod
    def of(
        cls, result: dict[str, Any], protocol_version: str, *, session_id: str | None = None, server_info: Any = None
    ) -> UpstreamSession:
        """What an ``initialize`` (or ``server/discover``) ``result`` describes, at ``protocol_version``.

        ``server_info``: where the result carries it other than in ``serverInfo`` (``server/discover``'s ``_meta``).
        """
        instructions = result.get("instructions")
        return cls(
            session_id=session_id,
            protocol_version=protocol_version,
            server_info=_dict_or_empty(server_info if server_info is not None else result.get("serverInfo")),
            capabilities=_dict_or_empty(result.get("capabilities")),
            instructions=instructions if isinstance(instructions, str) else None,
        )


class UpstreamError(Exception):
    """A non-``tools/call`` request (negotiation, tools/list, ping) failed; safe to retry later."""

    def __init__(self, reason: str, *, status_code: int | None = None, error: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status_code = status_code
        self.error = error


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


class _ClientBase:
    """What the clients of both upstream transports share: the configuration, the connection pool, the lifecycle.

    ``UpstreamClient`` (Streamable HTTP) and ``LegacySseClient`` (HTTP+SSE) speak the same HTTP/1.1
    wire (``mcpgateway.upstream.http``) and offer the gateway the same operations with the same
    outcome classes. A subclass names the headers its requests set themselves (``_own_headers``,
    and the prefixes ``_own_prefixes``: the same names in ``headers`` are dropped) and its default
    ``max_connections``, and implements ``_call`` (one ``tools/call``, whose checks ``call_tool`` made).
    """

    _own_headers: frozenset[str]
    _own_prefixes: tuple[str, ...] = ()
    _default_max_connections: int

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
        max_connections: int | None = None,
        keepalive_expiry: float = DEFAULT_KEEPALIVE_EXPIRY,
        headers: Mapping[str, str] | None = None,
        client_info: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Configure the client; nothing is sent (and no connection opened) until the first request.

        ``connect_timeout`` bounds the TCP connect and the TLS handshake;
        ``read_timeout`` bounds each wait for response bytes; ``write_timeout``
        (default ``read_timeout``) bounds writing one request; ``pool_timeout``
        (default ``connect_timeout``) bounds the wait for a free connection when
        ``max_connections`` (default: the subclass's) are busy; ``total_timeout``
        (optional) bounds a whole response from the moment the request is sent,
        which matters for SSE streams that keep a connection alive with comments.
        An idle connection is not reused after ``keepalive_expiry`` seconds, so
        that a server's idle timeout does not close it under a request.
        ``ssl_context`` replaces the default verifying context for ``https://``.
        ``headers`` are sent with every request (the subclass's own headers,
        Content-Type, Accept and the framing headers are the client's own).
        Redirects are not followed and proxy settings from the environment are
        ignored, so "sent" always means "sent to ``url``". A URL that is not
        ``http://`` or ``https://`` with a host makes every request fail as not
        sent (``UnsupportedProtocol``).

        Raises ``ValueError`` for a header that cannot be sent (not ASCII, or a
        control character) and for ``max_connections`` below 1.
        """
        self.url = url
        self._total_timeout = total_timeout
        self._max_response_bytes = max_response_bytes
        self._client_info = dict(client_info or {"name": "tollgate", "version": "1"})
        self._origin = _Origin.parse(url)
        self._pool = _Pool(
            self._origin,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout if write_timeout is not None else read_timeout,
            pool_timeout=pool_timeout if pool_timeout is not None else connect_timeout,
            max_connections=max_connections if max_connections is not None else self._default_max_connections,
            keepalive_expiry=keepalive_expiry,
            ssl_context=ssl_context,
        )
        defaults = {"Host": self._origin.host_header, "User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if self._origin.authorization:
            defaults["Authorization"] = self._origin.authorization
        fixed: dict[str, tuple[str, str]] = {}
        for name, value in [*defaults.items(), *(headers or {}).items()]:
            key = name.lower()
            if key not in self._own_headers and not key.startswith(self._own_prefixes):
                fixed[key] = (name, value)
        self._request_close = "close" in _tokens(fixed.get("connection", ("", ""))[1])
        # The header lines every request carries, built and checked once.
        self._common = "".join(f"{_check_header(name, value)}\r\n" for name, value in fixed.values())
        self._authorization = ""  # the ``Authorization`` line of a token that rotates (``authorize``)
        _clients.add(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool: requests made after it fail as not sent.

        Connections still carrying an exchange are closed when it ends.
        """
        self._pool.close()

    def authorize(self, value: str) -> None:
        """Send ``Authorization: value`` with every request from now on, negotiation included.

        For a credential whose value changes while the client lives (an OAuth access token): the
        client, its connections and its negotiated session stay. Raises ``ValueError`` for a value
        that cannot be sent. Not combined with an ``Authorization`` in ``headers`` (the caller's).
        """
        self._authorization = f"{_check_header('Authorization', value)}\r\n"

    def _after_fork(self) -> None:
        """In a forked child: the parent's sockets are not this process's to use (nor to close)."""
        self._pool.after_fork()

    def _deadline(self, started: float | None = None) -> float | None:
        """When a response must be complete (``total_timeout`` after ``started``), or ``None``."""
        if self._total_timeout is None:
            return None
        return (started if started is not None else time.monotonic()) + self._total_timeout

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
        headers: Mapping[str, str] | None = None,
    ) -> CallResult:
        """Send one ``tools/call`` and classify the outcome; never resends, never raises for upstream failures.

        ``headers``: more header lines for this request only (the dispatch's W3C ``traceparent``).

        ``send_by`` (a ``time.monotonic()`` instant): when the session's negotiation, or waiting for
        another thread's, ends after it, the call is not sent (``not_sent``), so that a caller whose
        claim is swept after a fixed time never sends a call the sweep has already given up on.

        The idempotency key travels as header ``Idempotency-Key`` and as
        ``params._meta["io.tollgate/idempotency-key"]`` (it overrides the same key
        in ``extra_meta``; in the stateless era the envelope's keys override
        ``extra_meta`` too). With ``output_schema``, a non-error result must carry
        ``structuredContent`` that validates against it, else the kind is
        ``invalid_response``. ``input_schema`` (the tool's inputSchema) is read
        only in the stateless era of Streamable HTTP, for the arguments it marks
        with ``x-mcp-header``: they are mirrored in ``Mcp-Param-*`` headers, which
        a stateless-era server requires for such a tool. Raises ``ValueError``
        (before anything is sent) for an empty idempotency key or an invalid
        ``output_schema`` (``output_schema_problem`` tells which beforehand).
        """
        if not idempotency_key:
            raise ValueError("idempotency_key is required")
        validator = _output_validator(output_schema)
        rid: str | int = request_id if request_id is not None else _new_request_id()
        return self._call(
            _ToolCall(name, arguments, idempotency_key, rid, extra_meta, validator, input_schema, send_by, headers)
        )

    def _call(self, call: _ToolCall) -> CallResult:
        """Send ``call`` in the transport's way and classify its outcome, as ``call_tool`` guarantees."""
        raise NotImplementedError


@dataclass(frozen=True)
class _ToolCall:
    """One ``tools/call`` as the caller asked for it, checked (``_ClientBase.call_tool``)."""

    name: str
    arguments: Mapping[str, Any]
    idempotency_key: str
    rid: str | int
    extra_meta: Mapping[str, Any] | None
    validator: jsonschema.protocols.Validator | None  # of the tool's outputSchema
    input_schema: Mapping[str, Any] | None
    send_by: float | None
    headers: Mapping[str, str] | None

    def payload(self, envelope: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON-RPC request: the idempotency key overrides ``extra_meta``'s, ``envelope``'s entries both."""
        meta = {**(self.extra_meta or {}), IDEMPOTENCY_META_KEY: self.idempotency_key, **envelope}
        return {
            "jsonrpc": "2.0",
            "id": self.rid,
            "method": "tools/call",
            "params": {"name": self.name, "arguments": dict(self.arguments), "_meta": meta},
        }

    def lines(self, head: str = "", params: str = "") -> str:
        """Its header lines: ``head`` (the era's), ``Idempotency-Key``, ``params`` (``Mcp-Param-*``), then ``headers``.

        Raises ``ValueError`` for a value that cannot be sent.
        """
        lines = f"{head}{IDEMPOTENCY_HEADER}: {_check_value(self.idempotency_key)}\r\n{params}"
        if self.headers:
            lines += "".join(f"{_check_header(key, value)}\r\n" for key, value in self.headers.items())
        return lines


class _Outcome:
    """Builds the ``CallResult``s of a ``tools/call`` sent at ``started``: its id, its time, the hash of its answer.

    ``hasher`` takes the answer's bytes as they are read; ``status`` is the answer's HTTP status once known.
    """

    __slots__ = ("hasher", "rid", "started", "status")

    def __init__(self, rid: str | int, started: float, status: int | None = None) -> None:
        self.rid, self.started, self.status = rid, started, status
        self.hasher = hashlib.sha256()

    def __call__(self, kind: CallKind, reason: str, **extra: Any) -> CallResult:
        return CallResult(
            kind=kind,
            reason=reason,
            request_id=self.rid,
            status_code=self.status,
            elapsed=time.monotonic() - self.started,
            response_sha256=self.hasher.hexdigest(),
            **extra,
        )


class UpstreamClient(_ClientBase):
    """Synchronous, thread-safe client for one upstream MCP server (Streamable HTTP, both protocol eras)."""

    _own_headers = _OWN_HEADERS
    _own_prefixes = (_PARAM_HEADER_PREFIX_LOWER,)
    _default_max_connections = 20

    def __init__(self, url: str, *, era: Era = "auto", **options: Any) -> None:
        """Configure the client (``options``: ``_ClientBase``'s timeouts, pool and headers); nothing is sent yet.

        ``era="auto"`` negotiates the protocol era on first use (module
        docstring); ``era="handshake"`` never probes and always runs the
        handshake, as clients before the stateless revision do.

        Raises ``ValueError`` for an unknown ``era``, and as ``_ClientBase`` does.
        """
        if era not in ("auto", "handshake"):
            raise ValueError(f"era must be 'auto' or 'handshake', not {era!r}")
        self._era = era
        self._lock = threading.Lock()
        self._state: _Negotiated | None = None
        super().__init__(url, **options)
        # Everything of a request but its per-request lines, built and checked once.
        target = self._origin.target
        self._post_head = (
            f"POST {target} HTTP/1.1\r\n{self._common}Content-Type: application/json\r\nAccept: {ACCEPT}\r\n"
        )
        self._delete_head = f"DELETE {target} HTTP/1.1\r\n{self._common}"

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """End a handshake session (best-effort ``DELETE``) and close the connection pool.

        Requests made after ``close`` fail as not sent; connections still carrying
        an exchange are closed when it ends. The stateless era has nothing to end.
        """
        state, self._state = self._state, None
        if state is not None and state.session.session_id is not None:
            try:
                head = f"{self._delete_head}{self._authorization}{state.lines}\r\n".encode("ascii")
                response = self._pool.request(head, b"", self._deadline(), close=self._request_close)
                try:
                    for _ in _bounded_chunks(response.iter_chunks(), self._max_response_bytes, _ignore):
                        pass
                finally:
                    response.close()
            except (TransportError, _IncompleteReply, _InvalidReply, ValueError):
                logger.debug("upstream session DELETE failed", exc_info=True)
        super().close()

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
        super()._after_fork()

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
        return _all_tools(self._safe_request)

    def _call(self, call: _ToolCall) -> CallResult:
        """``call_tool`` once its arguments are checked: negotiate if needed, send, classify (``CallResult``)."""
        rid = call.rid
        try:
            state = self._negotiated()
        except UpstreamError as exc:
            return _not_negotiated(exc, rid)
        try:
            params = ""
            if state.envelope and call.input_schema is not None:
                params = _param_header_lines(call.input_schema, call.arguments)
            lines = call.lines(state.head("tools/call", call.name), params)
            head, body = self._build(call.payload(state.envelope), lines)
        except Exception as exc:
            # Arguments that are not JSON, a header value that cannot be sent.
            return CallResult(kind="not_sent", reason=f"request not built: {_describe(exc)}", request_id=rid)

        started = time.monotonic()
        if (late := _past_send_by(started, call.send_by, rid)) is not None:
            return late
        try:
            response = self._pool.request(head, body, self._deadline(started), close=self._request_close)
        except Exception as exc:
            kind, reason = _send_failed(exc)
            return CallResult(kind=kind, reason=reason, request_id=rid, elapsed=time.monotonic() - started)
        try:
            return self._classify(response, rid, state, call.validator, started)
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
        result = _Outcome(rid, started, status)
        message: dict[str, Any] | None = None
        problem: str | None = None
        interrupted = False
        try:
            message = self._read_reply(response, rid, result.hasher.update)
        except _InvalidReply as exc:
            problem = str(exc)
        except _IncompleteReply as exc:
            problem, interrupted = str(exc), True
        except Exception as exc:
            problem, interrupted = f"response interrupted: {_describe(exc)}", True
        # The answer is in; the connection goes back before anything else (the re-negotiation
        # below needs one, and the pool may hold only this one).
        response.close()

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
        return _classify_result(payload, validator, result)

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
        session = UpstreamSession.of(result, version, server_info=meta.get(SERVER_INFO_META_KEY))
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
        session = UpstreamSession.of(result, str(version), session_id=answer.headers.get(SESSION_HEADER.lower()))
        notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        try:
            lines = _session_lines(session)  # a session id that cannot be sent back fails here
            head, body = self._build(notification, lines)
            response = self._pool.request(head, body, self._deadline(), close=self._request_close)
        except (TransportError, _IncompleteReply, ValueError, UnicodeError) as exc:
            raise UpstreamError(f"notifications/initialized: {_describe(exc)}") from exc
        _accepted(response, "notifications/initialized", self._max_response_bytes)
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

    def _build(self, payload: dict[str, Any], lines: str) -> tuple[bytes, bytes]:
        """The POST head and body for one JSON-RPC message; raises (nothing sent) if it cannot be encoded.

        ``lines`` holds the request's own header lines, already checked (each ending in CRLF).
        """
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        head = f"{self._post_head}{self._authorization}{lines}Content-Length: {len(body)}\r\n\r\n"
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
                for _, message in _replies(_sse_events(chunks)):
                    return _storable(_match_response(message, rid))
            except UnicodeDecodeError as exc:
                raise _InvalidReply("SSE stream is not UTF-8") from exc
            raise _IncompleteReply("SSE stream ended without a response")
        body = b"".join(chunks)
        if not body:
            raise _InvalidReply(f"empty body (HTTP {response.status})")
        return _storable(_match_response(_load_message(body, "body"), rid))


_clients: weakref.WeakSet[_ClientBase] = weakref.WeakSet()


def _forget_inherited_connections() -> None:
    for client in list(_clients):
        client._after_fork()


if hasattr(os, "register_at_fork"):
    # A client (of either transport) created before a fork (gunicorn --preload) must not share its
    # sockets with the children: two processes reading one connection would take each other's responses.
    os.register_at_fork(after_in_child=_forget_inherited_connections)


def _all_tools(request: Callable[[str, dict[str, Any] | None], dict[str, Any]]) -> list[dict[str, Any]]:
    """Every page of ``tools/list`` through ``request(method, params)``, following ``nextCursor``.

    Raises ``UpstreamError`` for a page that is not a list of tools, a cursor that repeats, or too many pages.
    """
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(_MAX_LIST_PAGES):
        result = request("tools/list", {"cursor": cursor} if cursor is not None else None)
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


def _not_negotiated(exc: UpstreamError, rid: str | int) -> CallResult:
    """The ``not_sent`` result of a call whose session could not be negotiated (nor opened)."""
    return CallResult(
        kind="not_sent", reason=f"initialize failed: {exc.reason}", request_id=rid, status_code=exc.status_code
    )


def _send_failed(exc: Exception) -> tuple[CallKind, str]:
    """The kind and reason of a ``tools/call`` whose request raised ``exc`` before its answer's head was read.

    ``not_sent`` only when no byte was written (``RequestNotSent``); otherwise write errors and
    timeouts, resets and timeouts before a complete response head, and anything unexpected: some
    bytes may have reached the upstream (``uncertain``).
    """
    if isinstance(exc, RequestNotSent):
        return "not_sent", _describe(exc)
    if isinstance(exc, _IncompleteReply):
        return "uncertain", str(exc)
    return "uncertain", _describe(exc)


def _accepted(response: _Response, method: str, max_response_bytes: int) -> None:
    """Read the answer to a message that must be accepted to its end, and close it; ``UpstreamError`` unless 2xx."""
    try:
        for _ in _bounded_chunks(response.iter_chunks(), max_response_bytes, _ignore):
            pass
    except (TransportError, _IncompleteReply, _InvalidReply) as exc:
        raise UpstreamError(f"{method}: {_describe(exc)}") from exc
    finally:
        response.close()
    if not 200 <= response.status < 300:
        raise UpstreamError(f"{method}: HTTP {response.status}", status_code=response.status)


def _replies(events: Iterable[_SSEEvent]) -> Iterator[tuple[_SSEEvent, Any]]:
    """The SSE events that may answer a request, each with its JSON-RPC message.

    Events of another type or without data, and the server's own requests and notifications, are
    skipped. Raises ``_InvalidReply`` for a ``message`` event that is not JSON.
    """
    for event in events:
        if event.event != "message" or not event.data:
            continue
        message = _load_message(event.data, "SSE event data")
        if isinstance(message, dict) and "method" in message:
            continue
        yield event, message


def _rpc_error(method: str, error: dict[str, Any], status: int | None = None) -> UpstreamError:
    """The ``UpstreamError`` of a non-``tools/call`` request answered with a JSON-RPC error."""
    return UpstreamError(
        f"{method}: JSON-RPC error {error.get('code')}: {error.get('message')}", status_code=status, error=error
    )


def _past_send_by(started: float, send_by: float | None, rid: str | int) -> CallResult | None:
    """The ``not_sent`` result of a call whose session was ready after its send deadline, else None."""
    if send_by is None or started <= send_by:
        return None
    return CallResult(
        kind="not_sent",
        reason=f"not sent: the session was ready {started - send_by:.1f} s after the call's send deadline",
        request_id=rid,
    )


def _classify_result(
    payload: dict[str, Any],
    validator: jsonschema.protocols.Validator | None,
    result: Callable[..., CallResult],
) -> CallResult:
    """The outcome of a ``tools/call`` result for our id: ``success``, ``tool_error`` or ``invalid_response``.

    ``result(kind, reason, result=...)`` builds the ``CallResult`` (with the caller's id, status and timing).
    """
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


def _dict_or_empty(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _result_of(answer: _Answer, method: str) -> dict[str, Any]:
    """The result of a non-``tools/call`` request's answer; ``UpstreamError`` for anything else."""
    status = answer.status
    if answer.message is None:
        raise UpstreamError(
            f"{method}: {answer.problem}" if 200 <= status < 300 else f"{method}: HTTP {status}", status_code=status
        )
    error = answer.error
    if error is not None:
        raise _rpc_error(method, error, status)
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


def _session_lines(session: UpstreamSession) -> str:
    lines = f"{PROTOCOL_VERSION_HEADER}: {_check_value(session.protocol_version)}\r\n"
    if session.session_id is not None:
        lines += f"{SESSION_HEADER}: {_check_value(session.session_id)}\r\n"
    return lines
