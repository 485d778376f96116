"""MCP transports (docs/architecture.md, "MCP transports"), all on the same governed path.

* ``POST /mcp``: Streamable HTTP with JSON responses, for both protocol eras
  the official SDK speaks: the handshake revisions (initialize,
  notifications/initialized, ``Mcp-Session-Id``, ``MCP-Protocol-Version``;
  sessions live in PostgreSQL so any instance can serve them) and the
  stateless 2026-07-28 revision (``server/discover``, per-request ``_meta``,
  ``Mcp-Method``/``Mcp-Name`` headers, no sessions). GET answers 405; DELETE
  ends a handshake session. Needs a key. Mounted when
  ``ENABLE_MCP_STREAMABLE_HTTP`` is on.
* ``POST /mcp/public``: stateless, read-only (tools/list, discovery, ping), no key.
* ``POST /mcp/messages``: deprecated plain JSON-RPC (tools/list, tools/call), no lifecycle.

Every MCP endpoint checks ``Origin`` against ``ALLOWED_ORIGINS`` (403 otherwise).
A tools/call carries ``permit_id``, ``idempotency_key`` and optional
``quote_id`` in ``params._meta``, or the headers ``X-Permit-Id``,
``Idempotency-Key`` and ``X-Quote-Id``.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from access.authentication import resolve_credential
from access.ratelimit import DeferredRefused
from access.selectors import Principal
from billing.models import ToolPrice
from common import tracing
from common.errors import (
    ApplicationError,
    InvalidAPIKey,
    NotAuthenticated,
    PermissionDeniedError,
    RequestValidationError,
    json_error,
)
from common.idempotency import validate_idempotency_key
from common.jsonbody import JSONBodyError, check_storable, loads_bounded, storable_text
from mcpgateway import services
from mcpgateway.models import Action, McpSession, Tool
from mcpgateway.services.sweeper import session_cutoff
from mcpgateway.upstream.protocol import UNSUPPORTED_PROTOCOL_VERSION
from permits.models import Permit

logger = logging.getLogger("tollgate.mcp")

HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
STATELESS_VERSION = "2026-07-28"
META_PROTOCOL = "io.modelcontextprotocol/protocolVersion"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
INSTRUCTIONS = (
    "Tollgate governs consequential tool calls. Every tools/call needs a permit and an idempotency key "
    "(params._meta.permit_id and params._meta.idempotency_key). A replay of the same key returns the stored "
    "answer and is never charged twice; the same key with other arguments is refused. Results carry the "
    "receipt id in _meta['io.tollgate/receipt-id']; fetch its evidence at /v1/evidence/{receipt_id}."
)
# Deprecation of the legacy endpoints (RFC 9745): the positioning effective date, 2026-08-28.
DEPRECATION = "@" + str(int(datetime(2026, 8, 28, tzinfo=UTC).timestamp()))

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
FORBIDDEN = -32001
IN_PROGRESS = -32009  # the same idempotency key is still being answered (HTTP 409)

PERMIT_ID_MAX_LENGTH = Permit._meta.get_field("permit_id").max_length or 0
QUOTE_ID_MAX_LENGTH = Action._meta.get_field("quote_id").max_length or 0


def server_info() -> dict[str, str]:
    return {"name": "tollgate", "title": "Tollgate gateway", "version": settings.SERVICE_VERSION}


class RpcError(Exception):
    """A JSON-RPC error answer."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None, *, http_status: int = 200) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status


@dataclass
class Exchange:
    """One POSTed message being answered: who asks, on which transport, and the reply's headers."""

    request: HttpRequest
    transport: str
    endpoint: str
    principal: Principal | None
    stateless: bool
    protocol_version: str
    headers: dict[str, str] = field(default_factory=dict)


# --- Shared pieces --------------------------------------------------------------------


def origin_allowed(request: HttpRequest) -> bool:
    """Requests without Origin (non-browser clients) pass; a browser Origin must be allowed."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return origin.rstrip("/") in {o.rstrip("/") for o in settings.ALLOWED_ORIGINS}


def _principal(request: HttpRequest, *, required: bool) -> Principal | None:
    key, error = resolve_credential(request)
    if error is not None:
        raise error
    if key is None:
        if required:
            raise NotAuthenticated()
        return None
    return Principal(key)


def tool_definitions(tools: list[Tool]) -> list[dict[str, Any]]:
    """MCP tool definitions with price, category and service id in ``_meta`` (one price query for all)."""
    prices = dict(ToolPrice.objects.filter(tool__in=[t.service_id for t in tools]).values_list("tool", "credits"))
    out = []
    for tool in tools:
        price: Decimal | None = prices.get(tool.service_id)
        definition: dict[str, Any] = {"name": tool.service_id, "description": tool.description}
        if tool.title:
            definition["title"] = tool.title
        definition["inputSchema"] = tool.input_schema or {"type": "object"}
        if tool.output_schema:
            definition["outputSchema"] = tool.output_schema
        if tool.annotations:
            definition["annotations"] = tool.annotations
        definition["_meta"] = {
            "io.tollgate/service-id": tool.service_id,
            "io.tollgate/category": tool.category,
            "io.tollgate/price-credits": None if price is None else f"{price.quantize(Decimal('0.00000001')):f}",
            "io.tollgate/callable": price is not None,
            "io.tollgate/source": tool.source,
            "io.tollgate/output-schema": bool(tool.output_schema),
        }
        out.append(definition)
    return out


def valid_id(rid: Any) -> bool:
    """JSON-RPC ids are strings, numbers or null."""
    return rid is None or (isinstance(rid, (str, int, float)) and not isinstance(rid, bool))


def _rpc_result(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _rpc_error(rid: Any, err: RpcError) -> dict[str, Any]:
    error: dict[str, Any] = {"code": err.code, "message": err.message}
    if err.data is not None:
        error["data"] = err.data
    return {"jsonrpc": "2.0", "id": rid, "error": error}


def _stateless_status(code: int) -> int:
    """2026-07-28: the HTTP status follows the JSON-RPC error code."""
    if code in (PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS, HEADER_MISMATCH, -32021, UNSUPPORTED_PROTOCOL_VERSION):
        return 400
    if code == METHOD_NOT_FOUND:
        return 404
    return 200


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> HttpResponse:
    """A JSON-RPC answer as UTF-8 JSON. Text the request carried back (an id, a method name) may hold a lone
    surrogate, which UTF-8 cannot encode: such an answer is written with ASCII escapes instead."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    try:
        content = text.encode()
    except UnicodeEncodeError:
        content = json.dumps(body, separators=(",", ":")).encode()
    response = HttpResponse(content, status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _http_error(request: HttpRequest, err: ApplicationError, headers: dict[str, str] | None = None) -> HttpResponse:
    response = json_error(request, err)
    if err.http_status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="tollgate"'
    for name, value in (headers or {}).items():
        response[name] = value
    return response


# --- Method handlers ---------------------------------------------------------------------


def _tools_list(ex: Exchange, params: dict[str, Any]) -> dict[str, Any]:
    if ex.principal is None and settings.TOOL_CATALOG_REQUIRES_KEY:
        raise RpcError(FORBIDDEN, "The tool catalog needs an API key on this deployment.", {"error": "key_required"})
    result: dict[str, Any] = {"tools": tool_definitions(services.tools_catalog())}
    if ex.stateless:  # 2026-07-28 list results are cacheable results
        result.update(ttlMs=0, cacheScope="private" if ex.principal is not None else "public")
    return result


def _call_meta(ex: Exchange, params: dict[str, Any]) -> tuple[str, str, str]:
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    assert isinstance(meta, dict)
    headers = ex.request.headers
    permit_id = meta.get("permit_id") or headers.get("X-Permit-Id") or ""
    key = meta.get("idempotency_key") or headers.get("Idempotency-Key") or ""
    quote_id = meta.get("quote_id") or headers.get("X-Quote-Id") or ""
    if not isinstance(permit_id, str) or not permit_id:
        raise RpcError(
            INVALID_PARAMS, "A tools/call needs a permit: params._meta.permit_id.", {"error": "missing_permit_id"}
        )
    if not isinstance(key, str) or not key:
        raise RpcError(
            INVALID_PARAMS,
            "A tools/call needs an idempotency key: params._meta.idempotency_key.",
            {"error": "missing_idempotency_key"},
        )
    try:
        validate_idempotency_key(key, required=True)
    except RequestValidationError as err:
        raise RpcError(INVALID_PARAMS, err.errors[0]["msg"], {"error": "invalid_idempotency_key"}) from err
    if not isinstance(quote_id, str):
        raise RpcError(INVALID_PARAMS, "quote_id must be a string.", {"error": "invalid_quote_id"})
    # The limits the REST invoke's serializer applies (ToolCallRequest): what the columns can hold.
    _check_id("permit_id", permit_id, PERMIT_ID_MAX_LENGTH)
    _check_id("quote_id", quote_id, QUOTE_ID_MAX_LENGTH)
    return permit_id, key, quote_id


def _check_id(name: str, value: str, max_length: int) -> None:
    """``invalid_<name>`` unless ``value`` fits its column: at most ``max_length`` characters, no NUL or surrogate."""
    if len(value) > max_length:
        raise RpcError(INVALID_PARAMS, f"{name} has at most {max_length} characters.", {"error": f"invalid_{name}"})
    try:
        check_storable(value, ["params", "_meta", name])
    except RequestValidationError as err:
        raise RpcError(INVALID_PARAMS, f"{name}: {err.errors[0]['msg']}", {"error": f"invalid_{name}"}) from err


def _tools_call(ex: Exchange, params: dict[str, Any]) -> dict[str, Any]:
    if ex.principal is None:
        raise RpcError(FORBIDDEN, "tools/call needs an API key: use POST /mcp.", {"error": "key_required"})
    name = params.get("name")
    arguments = params.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise RpcError(INVALID_PARAMS, "params.name (the tool) is required.", {"error": "missing_tool_name"})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise RpcError(INVALID_PARAMS, "params.arguments must be an object.", {"error": "invalid_arguments"})
    if ex.stateless and ex.request.headers.get("Mcp-Name", name) != name:
        raise RpcError(HEADER_MISMATCH, "Mcp-Name does not match params.name.", {"error": "header_mismatch"})
    permit_id, key, quote_id = _call_meta(ex, params)
    try:
        answer = services.governed_call(
            services.CallRequest(
                principal=ex.principal,
                tool=name,
                arguments=arguments,
                idempotency_key=key,
                permit_id=permit_id,
                quote_id=quote_id,
                transport=ex.transport,
                endpoint=ex.endpoint,
                # The key's rate-limit charge, when the middleware deferred it to the claim (access.ratelimit).
                deferred=getattr(ex.request, "_tollgate_rate", None),
                trace_context=tracing.incoming_context(ex.request.headers),
            )
        )
    except RequestValidationError as err:
        first = err.errors[0]
        raise RpcError(INVALID_PARAMS, first["msg"], {"error": first["type"], "loc": first["loc"]}) from err
    except ApplicationError as err:
        # 409: the key is still being answered; 422: the call cannot be processed (tool_schema_unusable).
        code = IN_PROGRESS if err.http_status == 409 else INVALID_PARAMS if err.http_status == 422 else FORBIDDEN
        ex.headers.update(err.headers)  # Retry-After for a key still in progress
        raise RpcError(code, err.detail_message, err.as_detail()) from err
    response = answer.response
    if answer.replayed:
        ex.headers["Idempotent-Replayed"] = "true"
    tollgate_meta = {
        "io.tollgate/receipt-id": response["receipt_id"],
        "io.tollgate/action-id": response["action_id"],
        "io.tollgate/outcome": response["outcome"],
        "io.tollgate/credits-charged": response["credits_charged"],
        "io.tollgate/replayed": answer.replayed,
    }
    result = answer.result  # the upstream's, less any io.tollgate/ key it put in _meta
    if result is not None:
        upstream_meta = result.get("_meta")  # an object (the client refuses any other); older stored answers aside
        result["_meta"] = {**(upstream_meta if isinstance(upstream_meta, dict) else {}), **tollgate_meta}
        return result
    error = response["error"]
    raise RpcError(error["code"], error["message"], {**error["data"], "replayed": answer.replayed})


def _ping(ex: Exchange, params: dict[str, Any]) -> dict[str, Any]:
    return {}


def _discover(ex: Exchange, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "supportedVersions": [STATELESS_VERSION],
        "capabilities": {"tools": {"listChanged": False}},
        "instructions": INSTRUCTIONS,
        "ttlMs": 0,
        "cacheScope": "private" if ex.principal is not None else "public",
    }


Handler = Callable[[Exchange, dict[str, Any]], dict[str, Any]]
HANDSHAKE_METHODS: dict[str, Handler] = {"ping": _ping, "tools/list": _tools_list, "tools/call": _tools_call}
STATELESS_METHODS: dict[str, Handler] = {
    "server/discover": _discover,
    "tools/list": _tools_list,
    "tools/call": _tools_call,
}


def _answer(ex: Exchange, message: Any, methods: dict[str, Handler]) -> tuple[int, dict[str, Any] | None]:
    """Dispatch one JSON-RPC message. Returns (HTTP status, body or None for a notification)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        err = RpcError(INVALID_REQUEST, "Not a JSON-RPC 2.0 request.")
        rid = message.get("id") if isinstance(message, dict) else None
        return (_stateless_status(err.code) if ex.stateless else 400), _rpc_error(rid if valid_id(rid) else None, err)
    method, rid = message["method"], message.get("id")
    if not valid_id(rid):
        err = RpcError(INVALID_REQUEST, "A JSON-RPC id must be a string, a number or null.")
        return (_stateless_status(err.code) if ex.stateless else 400), _rpc_error(None, err)
    params = message.get("params")
    if params is None:  # omitted (or null): no parameters; any other non-object is refused below
        params = {}
    if "id" not in message:  # a notification: accepted, nothing to answer
        return 202, None
    try:
        if not isinstance(params, dict):
            raise RpcError(INVALID_REQUEST, "params must be an object.", http_status=400)
        if ex.stateless:
            _check_stateless_headers(ex, method, params)
        handler = methods.get(method)
        if handler is None:
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        result = handler(ex, params)
    except RpcError as err:
        return (_stateless_status(err.code) if ex.stateless else err.http_status), _rpc_error(rid, err)
    except ApplicationError as err:
        return 200, _rpc_error(rid, RpcError(FORBIDDEN, err.detail_message, err.as_detail()))
    if ex.stateless:
        result = {**result, "resultType": "complete"}
        result.setdefault("_meta", {})
        result["_meta"] = {**result["_meta"], META_SERVER_INFO: server_info()}
    return 200, _rpc_result(rid, result)


def _check_stateless_headers(ex: Exchange, method: str, params: dict[str, Any]) -> None:
    header_method = ex.request.headers.get("Mcp-Method")
    if header_method is not None and header_method != method:
        raise RpcError(HEADER_MISMATCH, "Mcp-Method does not match the body's method.", {"error": "header_mismatch"})
    meta = params.get("_meta")
    if isinstance(meta, dict) and META_PROTOCOL in meta and meta[META_PROTOCOL] != STATELESS_VERSION:
        raise RpcError(
            HEADER_MISMATCH, "_meta protocol version does not match the header.", {"error": "header_mismatch"}
        )


def _read_message(request: HttpRequest) -> Any:
    try:
        return loads_bounded(request.body or b"null")
    except JSONBodyError as err:
        # JSON, but outside the bounds every body is held to (common/jsonbody.py): not a parse error.
        raise RpcError(INVALID_REQUEST, str(err), {"error": err.type}, http_status=422) from err
    except (ValueError, UnicodeDecodeError) as err:
        raise RpcError(PARSE_ERROR, "Parse error: the body is not JSON.", http_status=400) from err


# --- POST /mcp ----------------------------------------------------------------------------


CLIENT_INFO_FIELDS = ("name", "title", "version")
CLIENT_INFO_MAX_LENGTH = 200


def _client_info(params: dict[str, Any]) -> dict[str, str]:
    """What a session keeps of ``clientInfo``: its name, title and version as short text. A session lives
    on in PostgreSQL, so it never holds an arbitrary object (up to the body's size, per initialize) or
    text PostgreSQL cannot store (NUL, a lone surrogate: left out)."""
    info = params.get("clientInfo")
    if not isinstance(info, dict):
        return {}
    kept: dict[str, str] = {}
    for name in CLIENT_INFO_FIELDS:
        value = info.get(name)
        if isinstance(value, str) and storable_text(value) is not None:
            kept[name] = value[:CLIENT_INFO_MAX_LENGTH]
    return kept


def _handshake_initialize(ex: Exchange, params: dict[str, Any]) -> dict[str, Any]:
    """``initialize`` on ``POST /mcp``: opens a session, whose id goes back in ``Mcp-Session-Id``."""
    assert ex.principal is not None
    session, result = _new_session(ex.principal, params)
    ex.headers["Mcp-Session-Id"] = session.session_id
    return result


def _new_session(principal: Principal, params: dict[str, Any]) -> tuple[McpSession, dict[str, Any]]:
    requested = params.get("protocolVersion")
    version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
    session = McpSession.objects.create(
        session_id=secrets.token_hex(16),
        api_key_id=principal.key_id,
        protocol_version=version,
        client_info=_client_info(params),
    )
    _end_sessions_over_the_cap(principal.key_id)
    result = {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": server_info(),
        "instructions": INSTRUCTIONS,
    }
    return session, result


# Ends the key's live sessions past the newest MCP_SESSIONS_PER_KEY (the new one among them).
_END_OVER_CAP_SQL = (
    "UPDATE mcpgateway_session SET ended_at = now() WHERE session_id IN ("
    "SELECT session_id FROM mcpgateway_session WHERE api_key_id = %s AND ended_at IS NULL "
    "ORDER BY created_at DESC OFFSET %s)"
)


def _end_sessions_over_the_cap(key_id: str) -> None:
    """Keep a key's live sessions to ``MCP_SESSIONS_PER_KEY``: each ``initialize`` made a row that lived a
    day, so a key could keep 172,800 of them alive at the default rate limit. The oldest are ended; the
    sweeper deletes them."""
    with connection.cursor() as cursor:
        cursor.execute(_END_OVER_CAP_SQL, [key_id, settings.MCP_SESSIONS_PER_KEY])


def _session_for(request: HttpRequest, principal: Principal) -> McpSession:
    session_id = request.headers.get("Mcp-Session-Id", "")
    session = McpSession.objects.filter(
        session_id=session_id, ended_at__isnull=True, created_at__gt=session_cutoff()
    ).first()
    if session is None or session.api_key_id != principal.key_id:
        raise RpcError(INVALID_REQUEST, "Session not found.", http_status=404)
    header_version = request.headers.get("MCP-Protocol-Version")
    if header_version is not None and header_version != session.protocol_version:
        raise RpcError(INVALID_REQUEST, "MCP-Protocol-Version does not match the session.", http_status=400)
    return session


def _unsupported_version(request: HttpRequest, message: Any) -> HttpResponse | None:
    """400 (``-32022``, naming the versions served) for a message other than ``initialize`` whose
    ``MCP-Protocol-Version`` header names a version this gateway does not serve: the transport's rule
    ("MUST respond with 400 Bad Request"); before, such a request was served as if it named none."""
    version = request.headers.get("MCP-Protocol-Version")
    if version is None or version == STATELESS_VERSION or version in HANDSHAKE_VERSIONS:
        return None
    if isinstance(message, dict) and message.get("method") == "initialize":
        return None  # initialize negotiates in its body
    rid = message.get("id") if isinstance(message, dict) else None
    err = RpcError(
        UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported MCP-Protocol-Version.",
        {"supported": [STATELESS_VERSION, *HANDSHAKE_VERSIONS], "requested": version[:100]},
    )
    return _json(_rpc_error(rid if valid_id(rid) else None, err), 400)


def _single_message(request: HttpRequest) -> Any:
    """The body's one JSON-RPC message, or the response refusing it: a body that is not JSON or is out
    of bounds, a batch (not supported), or an ``MCP-Protocol-Version`` not served (``_unsupported_version``)."""
    try:
        message = _read_message(request)
    except RpcError as err:
        return _json(_rpc_error(None, err), err.http_status)
    if isinstance(message, list):
        return _json(_rpc_error(None, RpcError(INVALID_REQUEST, "Batches are not supported.")), 400)
    refused = _unsupported_version(request, message)
    return message if refused is None else refused


@csrf_exempt
def mcp_streamable(request: HttpRequest) -> HttpResponse:
    """POST /mcp (and GET: 405, DELETE: end the session)."""
    if not origin_allowed(request):
        return _http_error(request, OriginNotAllowed())
    if request.method == "GET":
        return _http_error(request, MethodNotAllowed(), {"Allow": "POST, DELETE"})
    if request.method not in ("POST", "DELETE"):
        return _http_error(request, MethodNotAllowed(), {"Allow": "POST, DELETE"})
    try:
        principal = _principal(request, required=True)
    except (NotAuthenticated, InvalidAPIKey) as err:
        return _http_error(request, err)
    assert principal is not None
    if request.method == "DELETE":
        session_id = request.headers.get("Mcp-Session-Id", "")
        ended = McpSession.objects.filter(
            session_id=session_id, api_key_id=principal.key_id, ended_at__isnull=True
        ).update(ended_at=timezone.now())
        return HttpResponse(status=204 if ended else 404)

    stateless = request.headers.get("MCP-Protocol-Version") == STATELESS_VERSION
    message = _single_message(request)
    if isinstance(message, HttpResponse):
        return message
    ex = Exchange(request, "mcp", "/mcp", principal, stateless, STATELESS_VERSION if stateless else "")

    if stateless:
        try:
            status, body = _answer(ex, message, STATELESS_METHODS)
        except DeferredRefused:  # nothing written: the rate limiter answers (429, or 401 for a revoked key)
            return HttpResponse(status=429)
        return _json(body, status, ex.headers) if body is not None else HttpResponse(status=202)

    if isinstance(message, dict) and message.get("method") == "initialize":
        if "id" not in message:
            return _json(_rpc_error(None, RpcError(INVALID_REQUEST, "initialize is a request.")), 400)
        status, body = _answer(ex, message, {"initialize": _handshake_initialize})  # checked as every message
        return _json(body, status, ex.headers)
    headers: dict[str, str] = {}
    if request.headers.get("Mcp-Session-Id"):
        # A session, when presented, must be live and this key's; without one the request is served
        # statelessly (the gateway keeps no per-session state that a request depends on).
        try:
            session = _session_for(request, principal)
        except RpcError as err:
            rid = message.get("id") if isinstance(message, dict) else None
            return _json(_rpc_error(rid if valid_id(rid) else None, err), err.http_status)
        headers["Mcp-Session-Id"] = session.session_id
        if (
            isinstance(message, dict)
            and message.get("method") == "notifications/initialized"
            and not session.initialized
        ):
            McpSession.objects.filter(pk=session.pk).update(initialized=True)
    status, body = _answer(ex, message, HANDSHAKE_METHODS)
    headers.update(ex.headers)
    return _json(body, status, headers) if body is not None else HttpResponse(status=202, headers=headers)


class OriginNotAllowed(PermissionDeniedError):
    code = "origin_not_allowed"
    message = "This Origin is not in ALLOWED_ORIGINS."


class MethodNotAllowed(ApplicationError):
    code = "method_not_allowed"
    http_status = 405
    message = "Use POST for MCP messages (DELETE ends a session)."


# --- POST /mcp/public ------------------------------------------------------------------------


def _public_initialize(ex: Exchange, params: dict[str, Any]) -> dict[str, Any]:
    requested = params.get("protocolVersion")
    version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": server_info(),
        "instructions": "Read-only public endpoint: tools/list and discovery. Tool calls go to POST /mcp with a key.",
    }


def _public_tools_call(ex: Exchange, params: dict[str, Any]) -> dict[str, Any]:
    raise RpcError(FORBIDDEN, "tools/call needs an API key: use POST /mcp.", {"error": "key_required"})


PUBLIC_METHODS: dict[str, Handler] = {
    "tools/call": _public_tools_call,
    "initialize": _public_initialize,
    "ping": _ping,
    "server/discover": _discover,
    "tools/list": _tools_list,
}


@csrf_exempt
def mcp_public(request: HttpRequest) -> HttpResponse:
    """POST /mcp/public: stateless, read-only, no key (a presented key is still checked)."""
    if not origin_allowed(request):
        return _http_error(request, OriginNotAllowed())
    if request.method != "POST":
        return _http_error(request, MethodNotAllowed("Use POST."), {"Allow": "POST"})
    try:
        principal = _principal(request, required=False)
    except InvalidAPIKey as err:
        return _http_error(request, err)
    stateless = request.headers.get("MCP-Protocol-Version") == STATELESS_VERSION
    message = _single_message(request)
    if isinstance(message, HttpResponse):
        return message
    ex = Exchange(request, "mcp_public", "/mcp/public", principal, stateless, "")
    methods = dict(PUBLIC_METHODS)
    if stateless:
        methods.pop("initialize")
        methods.pop("ping")
    status, body = _answer(ex, message, methods)
    return _json(body, status) if body is not None else HttpResponse(status=202)


# --- POST /mcp/messages (deprecated) ----------------------------------------------------------


@csrf_exempt
def mcp_messages(request: HttpRequest) -> HttpResponse:
    """POST /mcp/messages: deprecated plain JSON-RPC; same governed path; no initialize lifecycle."""
    deprecation = {"Deprecation": DEPRECATION, "Link": '</mcp>; rel="successor-version"'}
    if not origin_allowed(request):
        return _http_error(request, OriginNotAllowed(), deprecation)
    if request.method != "POST":
        return _http_error(request, MethodNotAllowed("Use POST."), {"Allow": "POST", **deprecation})
    try:
        principal = _principal(request, required=True)
    except (NotAuthenticated, InvalidAPIKey) as err:
        return _http_error(request, err, deprecation)
    try:
        message = _read_message(request)
    except RpcError as err:
        return _json(_rpc_error(None, err), err.http_status, deprecation)
    ex = Exchange(request, "mcp_messages", "/mcp/messages", principal, False, "")
    status, body = _answer(ex, message, HANDSHAKE_METHODS)
    headers = {**deprecation, **ex.headers}
    return _json(body, status, headers) if body is not None else HttpResponse(status=202, headers=headers)
