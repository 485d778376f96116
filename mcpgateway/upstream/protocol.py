"""MCP over Streamable HTTP as the upstream client speaks it: names, versions, message matching.

The era negotiation itself runs in ``mcpgateway.upstream.client``; the helpers here judge what
one message says (a response for our id, a discover result, a ``-32022``) and build the
stateless revision's ``Mcp-Name`` and ``Mcp-Param-*`` header values.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Mapping
from typing import Any, Final

from common.jsonbounds import JSONBodyError, loads_bounded, unstorable
from mcpgateway.upstream.http import _HEADER_NAME, _InvalidReply

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


def _new_request_id() -> str:
    return f"tg-{uuid.uuid4().hex}"


def _same_id(a: Any, b: Any) -> bool:
    """JSON-RPC ids match only with the same JSON type (``1`` is not ``"1"``, ``true`` is not ``1``)."""
    return type(a) is type(b) and a == b


def _load_message(raw: bytes | str, what: str) -> Any:
    """A JSON message within ``common.jsonbounds``' nesting and number bounds, else ``_InvalidReply``:
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
