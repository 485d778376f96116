"""A governed call as the transports hand it in and get it back.

``CallRequest`` (with the key's rate-limit charge when it was deferred to the claim), ``CallAnswer``,
the request document and its hash, and the HTTP status and JSON-RPC error code of each outcome.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from access.ratelimit import DeferredCharge
from access.selectors import Principal
from common.canonical import canonical_bytes_fast, sha256_hex
from common.jsonbody import check_storable
from receipts.models import Outcome

TOLLGATE_META_PREFIX = "io.tollgate/"
"""The ``_meta`` namespace of the gateway's own statements (receipt id, outcome, charge...)."""

# Outcome -> (HTTP status on the REST invoke, JSON-RPC error code on MCP; None: a result is returned).
OUTCOME_STATUS: dict[str, tuple[int, int | None]] = {
    Outcome.SUCCESS: (200, None),
    Outcome.TOOL_ERROR: (200, None),
    Outcome.DENIED: (403, -32001),
    Outcome.INSUFFICIENT_FUNDS: (402, -32002),
    Outcome.FAILED_REFUNDED: (502, -32003),
    Outcome.FAILED_UNREFUNDED: (502, -32003),
    Outcome.RESPONSE_REJECTED: (502, -32004),
    Outcome.DELIVERY_UNCERTAIN: (504, -32005),
}


@dataclass(frozen=True)
class CallRequest:
    """A validated tools/call from any transport.

    Raises ``RequestValidationError`` when the tool or the arguments hold a string that cannot be stored.
    """

    principal: Principal
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    permit_id: str
    quote_id: str
    transport: str
    endpoint: str
    # The key's rate-limit charge, deferred to the claim (access.ratelimit): the principal's key then
    # comes from the process's cache, and the request must be charged before it writes anything else.
    deferred: DeferredCharge | None = None
    # The agent's W3C trace context (its ``traceparent``) to continue; None while tracing is off.
    trace_context: dict[str, str] | None = None

    def __post_init__(self) -> None:
        # The tool and the arguments are stored (text, jsonb) and hashed (RFC 8785), so a string holding NUL or a
        # lone surrogate is refused here, on every transport, before anything is read or written (422).
        check_storable(self.tool, ["body", "name"])
        check_storable(self.arguments, ["body", "arguments"])


@dataclass(frozen=True)
class CallAnswer:
    """What the transports render: the stored answer of the action and whether it is a replay."""

    action_id: str
    response: dict[str, Any]
    replayed: bool

    @property
    def http_status(self) -> int:
        return int(self.response["http_status"])

    @property
    def result(self) -> dict[str, Any] | None:
        """The tool's result as the upstream gave it, less the ``_meta`` keys in the gateway's namespace
        (``io.tollgate/``): only the gateway speaks there, so an upstream cannot pass off a receipt id,
        an outcome or a charge of its own. A ``_meta`` left empty is dropped."""
        result = self.response["result"]
        if result is None:
            return None
        meta = result.get("_meta")
        if not isinstance(meta, dict) or not any(key.startswith(TOLLGATE_META_PREFIX) for key in meta):
            return dict(result)
        shown = {key: value for key, value in result.items() if key != "_meta"}
        kept = {key: value for key, value in meta.items() if not key.startswith(TOLLGATE_META_PREFIX)}
        if kept:
            shown["_meta"] = kept
        return shown


def request_document(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"tool": tool, "arguments": arguments}


def request_hash_of(tool: str, arguments: dict[str, Any]) -> str:
    return sha256_hex(canonical_bytes_fast(request_document(tool, arguments)))


def _uncharged(req: CallRequest) -> bool:
    """True while the request's rate-limit charge waits for the claim (its key is the cached one)."""
    return req.deferred is not None and not req.deferred.settled


def _charged(req: CallRequest) -> CallRequest:
    """``req`` charged as the rate limiter charges a request at its start, with its key read afresh.

    Raises ``DeferredRefused`` (the middleware answers 429, or 401 for a key revoked meanwhile).
    """
    assert req.deferred is not None
    key = req.deferred.fresh_key()
    return dataclasses.replace(req, principal=Principal(key), deferred=None)
