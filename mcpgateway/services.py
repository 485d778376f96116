"""The governed action (DESIGN.md section 6): the core of the gateway.

One logical action is one ``Action`` row, unique per (wallet, idempotency key)
across every transport. It moves through three phases:

Phase 1, one transaction: create the action (or find it: same request hash ->
replay the stored answer, or 409 while it runs; other hash -> 422
``idempotency_key_reused``, nothing written); authorize (permit + policies);
consume the quote, if any; reserve the price against the permit allowance;
debit the wallet; mark ``dispatch_claimed``; audit. A refusal (permit, policy,
spend controls, funds, quote) is recorded in the same transaction as a
``denied``/``insufficient_funds`` action with its receipt; nothing was charged.

Phase 2, no transaction: send ``tools/call`` upstream once, forwarding the
idempotency key (header and ``params._meta``). Never resent.

Phase 3, one transaction: record the outcome; refund where the tool certainly
did not run (or open a reconciliation item when the refund cannot be posted);
sign the receipt; append the audit event; link everything; store the answer.

A worker that dies after the claim leaves the action ``dispatch_claimed``;
``action_sweep`` later turns it into ``delivery_uncertain`` with its receipt.
The local dogfood tool runs inside phase 3's transaction, so it has no
dispatch uncertainty.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from audit.canonical import canonical_bytes_fast, sha256_hex
from audit.services import PreparedEvent, alert_raise, audit_append_prepared, audit_event_prepare, audit_record
from billing.exceptions import InsufficientFunds, SpendRefused, VelocityLimitExceeded
from billing.exceptions import money as _money
from billing.models import Wallet
from billing.ratelimit import DeferredCharge
from billing.selectors import Principal
from billing.services import (
    DEBIT_COLUMNS,
    DebitCall,
    DebitResult,
    debit_call,
    ledger_refund,
    wallet_check_may_spend,
    wallet_freeze_for_velocity,
)
from config import fastsql, metrics
from config.dbretry import run_retrying
from config.errors import ApplicationError, IdempotencyKeyInProgress, IdempotencyKeyReused, RequestValidationError
from config.faults import fault_point
from config.ids import new_id
from mcpgateway.models import Action, ActionState, Tool, ToolSource
from mcpgateway.upstream import CallResult, UpstreamClient
from permits import exceptions as permit_exc
from permits.models import Permit, PolicyBundle, Quote
from permits.services import (
    POLICIES_JSON_SQL,
    authorize,
    permit_release,
    permit_reserve_refusal,
    permit_verified_columns,
    policies_from_json,
    quote_check,
)
from receipts.models import Outcome
from receipts.services import receipt_prepare, refund_reconciliation_open

logger = logging.getLogger("tollgate.gateway")

DOGFOOD_TOOL = "partner.notes.write"
RETRY_AFTER_SECONDS = 2

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
JSONRPC_IN_PROGRESS = -32009
JSONRPC_INVALID_PARAMS = -32602


# --- Tool registry ---------------------------------------------------------------------


def tool_is_callable(tool: Tool) -> bool:
    if not tool.enabled:
        return False
    if tool.source == ToolSource.LOCAL:
        return bool(settings.ENABLE_DOGFOOD_TOOL) and tool.service_id == DOGFOOD_TOOL
    return True


def tools_catalog(*, category: str | None = None) -> list[Tool]:
    """Callable tools, by name; the local dogfood tool only while ``ENABLE_DOGFOOD_TOOL`` is on."""
    qs = Tool.objects.filter(enabled=True).order_by("service_id")
    if category:
        qs = qs.filter(category=category)
    return [t for t in qs if tool_is_callable(t)]


def tool_get(name: str) -> Tool | None:
    tool = Tool.objects.filter(service_id=name).first()
    return tool if tool is not None and tool_is_callable(tool) else None


@dataclass(frozen=True)
class _RegisteredTool:
    """A tool's row as of one version, with the validator of its inputSchema (None: none usable)."""

    version: str
    tool: Tool
    arguments_validator: Any


# Tools change rarely (a sync, a console edit) and are read on every call: each process keeps the rows
# it has read, by name, with the version they had (``gateway_tool_version``: any change to the row,
# however it is made, gives it a new one). The version is read in the call's lookup, or compared in its
# claim when the call is authorized from the cache, so a changed tool is read again at once.
_registered: dict[str, _RegisteredTool] = {}

_TOOL_AT_VERSION_SQL = (
    f"SELECT {fastsql.columns(Tool, 't')}, gateway_tool_version(t.service_id) "  # noqa: S608
    "FROM mcpgateway_tool t WHERE t.service_id = %s"
)


def _registered_tool(name: str, version: str) -> _RegisteredTool | None:
    """The tool ``name`` at ``version`` (as the lookup saw it), from the process's cache or read now."""
    cached = _registered.get(name)
    if cached is not None and cached.version == version:
        return cached
    row = fastsql.fetch_row(_TOOL_AT_VERSION_SQL, [name])
    if row is None:  # removed since the lookup
        _registered.pop(name, None)
        return None
    tool = fastsql.instance(Tool, row[:-1])
    schema = tool.input_schema or {"type": "object"}
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
    except Exception:  # an unusable schema from the upstream: let the upstream judge
        validator = None
    registered = _RegisteredTool(version=row[-1], tool=tool, arguments_validator=validator)
    _registered[name] = registered
    return registered


@dataclass(frozen=True)
class _Found:
    """What a governed call is decided on: read for it in one round trip (``_lookup``), or from the cache."""

    action: Action | None  # the action of (wallet, idempotency key), if any
    tool: _RegisteredTool | None  # the callable tool of that name
    price: Decimal | None  # its price (None: not set, not callable)
    permit: Permit | None  # the permit, when it is the wallet's
    quote: Quote | None  # the quote, when one is named and it is the wallet's
    policies: list[PolicyBundle]  # every enabled policy on the wallet's line, oldest first
    policies_version: str  # permits_policies_version of the wallet's line
    cached: bool = False  # from the process's cache: the claim compares what can have changed


@functools.cache
def _lookup_sql() -> str:
    # Column names come from the models' metadata, never from input.
    return (
        f"SELECT {fastsql.columns(Action, 'a')}, t.service_id, gateway_tool_version(t.service_id), "  # noqa: S608
        f"pr.credits, {fastsql.columns(Permit, 'p')}, {fastsql.columns(Quote, 'q')}, ({POLICIES_JSON_SQL}), "
        "permits_policies_version(%s) "
        "FROM (SELECT 1) AS one "
        "LEFT JOIN mcpgateway_action a ON a.wallet_id = %s AND a.idempotency_key = %s "
        "LEFT JOIN mcpgateway_tool t ON t.service_id = %s "
        "LEFT JOIN billing_tool_price pr ON pr.tool = t.service_id "
        "LEFT JOIN permits_permit p ON p.permit_id = %s AND p.wallet_id = %s "
        "LEFT JOIN permits_quote q ON q.quote_id = %s AND q.wallet_id = %s"
    )


def _lookup(req: CallRequest) -> _Found:
    """One round trip, in autocommit: the action of the key, the tool with its price, the permit, the quote
    and the policies. Nothing is locked: phase 1's claim re-checks under its locks whatever can change."""
    wallet = req.principal.key.wallet
    assert wallet is not None
    wallet_id, ancestry = wallet.wallet_id, wallet.ancestry
    key, name, permit_id, quote_id = req.idempotency_key, req.tool, req.permit_id, req.quote_id
    row = fastsql.fetch_row(
        _lookup_sql(), [ancestry, ancestry, wallet_id, key, name, permit_id, wallet_id, quote_id, wallet_id]
    )
    assert row is not None
    widths = [fastsql.width(Action), 2, 1, fastsql.width(Permit), fastsql.width(Quote)]
    parts, at = [], 0
    for n in widths:
        parts.append(row[at : at + n])
        at += n
    action_row, (tool_name, tool_version), price_row, permit_row, quote_row = parts
    tool = _registered_tool(tool_name, tool_version) if tool_name is not None else None
    return _Found(
        action=fastsql.instance(Action, action_row) if action_row[0] is not None else None,
        tool=tool if tool is not None and tool_is_callable(tool.tool) else None,
        price=price_row[0],
        permit=fastsql.instance(Permit, permit_row) if permit_row[0] is not None else None,
        quote=fastsql.instance(Quote, quote_row) if quote_row[0] is not None else None,
        policies=policies_from_json(row[at]),
        policies_version=row[at + 1],
    )


# What a call needs beyond its own action, cached per process once a call has been claimed on it: a tool's
# list price, a permit whose signed statement verified, the policies of a wallet's line with their version.
# A call that finds all of them here is decided without the lookup; its claim compares the tool's version,
# the price and the policies' version, and the reservation requires the permit row to still carry every
# signed column and the signature, so nothing cached can authorize what the rows no longer allow (``_Stale``:
# read afresh). Only what the claim re-checks is used from here: a refusal decided on cached rows is never
# recorded (the call is decided again on fresh ones), and balances, spend and the permit's allowance are
# only ever read under the claim's locks.
_prices: dict[str, Decimal] = {}
_permits: dict[str, Permit] = {}
_policies: dict[str, tuple[str, list[PolicyBundle]]] = {}
CACHE_LIMIT = 10_000  # entries per cache; a full cache starts again empty


class _Stale(Exception):
    """A call decided on cached rows must be decided again on fresh ones (nothing was written)."""


def _cached(req: CallRequest) -> _Found | None:
    """The call's rows from the process's cache, or None when any is missing (or it names a quote)."""
    wallet = req.principal.key.wallet
    if wallet is None or req.quote_id:
        return None
    tool, price = _registered.get(req.tool), _prices.get(req.tool)
    permit, policies = _permits.get(req.permit_id), _policies.get(wallet.wallet_id)
    if tool is None or price is None or permit is None or policies is None or not tool_is_callable(tool.tool):
        return None
    return _Found(
        action=None,
        tool=tool,
        price=price,
        permit=permit,
        quote=None,
        policies=policies[1],
        policies_version=policies[0],
        cached=True,
    )


def _remember(req: CallRequest, found: _Found) -> None:
    """Cache what a call read afresh and was claimed on."""
    wallet = req.principal.key.wallet
    if found.cached or wallet is None or found.price is None or found.permit is None:
        return
    for cache in (_prices, _permits, _policies):
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
    _prices[req.tool] = found.price
    _permits[req.permit_id] = found.permit
    _policies[wallet.wallet_id] = (found.policies_version, found.policies)


# gateway_claim (mcpgateway/sql/gateway_claim.sql): the action row, the quote's 3, whether to debit and the
# debit's 11, the reservation's 11, audit_append's 15, what a cached call compares 4, the deferred rate-limit
# charge's 4; it answers billing_debit's columns and the rate-limit window's count.
_CLAIM_SQL = f"SELECT {', '.join(DEBIT_COLUMNS)}, rate_count FROM gateway_claim({', '.join(['%s'] * 50)})"  # noqa: S608
CLAIM_REFUSED = "P0T01"  # the SQLSTATE gateway_claim raises a refusal with


def _claim(
    action: Action,
    quote: Quote | None,
    debit: DebitCall | None,
    permit: Permit,
    now: Any,
    event: PreparedEvent,
    found: _Found,
    deferred: DeferredCharge | None = None,
) -> DebitResult | None:
    """``gateway_claim``: insert the claimed action, consume the quote, debit, reserve and append the audit
    event, in one statement (its own transaction). Returns the debit's entries (None for a free call).

    Raises the refusal (the debit's, ``QuoteUnavailable``, or the permit's) with nothing written,
    ``_Stale`` when ``found`` came from the cache and no longer holds, and ``IntegrityError`` when a
    concurrent request holds the same idempotency key. With ``deferred``, the claim also checks the
    cached key and charges its rate-limit window (``_Stale`` when the key changed or the window is
    full: the request is then charged on the rate limiter's path, which answers the refusal).
    """
    price = action.price
    wallet = action.wallet
    ancestry = "{" + ",".join(wallet.ancestry) + "}"  # wallet ids are [A-Za-z0-9_]: a literal needs no quoting
    cached = [found.tool.version if found.tool else None, found.price, ancestry, found.policies_version]
    params = [
        json.dumps(fastsql.json_row(action)),
        quote.quote_id if quote else "",
        quote.quoted_credits if quote else None,
        quote.signature if quote else None,
        debit is not None,
        *(_debit_params(debit) if debit else [None] * 11),
        permit.permit_id,
        price,
        now,
        *permit_verified_columns(permit),
        *event.params(),
        *(cached if found.cached else [None] * 4),
        *(deferred.claim_params() if deferred is not None else [None] * 4),
    ]
    try:
        with fastsql.own_transaction():
            row = fastsql.fetch_row(_CLAIM_SQL, params)
        assert row is not None
        *debit_row, rate_count = row
        answer = dict(zip(DEBIT_COLUMNS, debit_row, strict=True))
    except DatabaseError as err:
        refused = _claim_refusal(err)
        if refused is None:
            raise
        if refused["code"] in ("stale", "rate_limited"):
            raise _Stale() from None
        if refused["code"] == "quote_unavailable":
            raise permit_exc.QuoteUnavailable(quote_id=action.quote_id) from None
        if refused["code"] == "permit_refused":
            raise permit_reserve_refusal(permit_id=permit.permit_id, amount=price or Decimal(0), now=now) from None
        assert debit is not None
        debit.result(refused)  # raises the debit's refusal
        raise AssertionError(f"gateway_claim refused with {refused['code']!r}") from err
    fastsql.inserted(action)
    if deferred is not None:
        deferred.claimed(int(rate_count))
    return debit.result(answer) if debit else None


def _debit_params(debit: DebitCall) -> list[Any]:
    """``billing_debit``'s first 11 arguments; the ids as an array literal (ids are ``[A-Za-z0-9_]``, so the
    literal needs no quoting), which PostgreSQL parses at once where psycopg adapts a list item by item."""
    params = debit.params()[:11]
    params[8] = "{" + ",".join(debit.ids) + "}"
    return params


def _claim_refusal(err: DatabaseError) -> dict[str, Any] | None:
    """The answer a refusal of ``gateway_claim`` carries (its columns), or None for any other error."""
    cause = err.__cause__
    if getattr(cause, "sqlstate", None) != CLAIM_REFUSED:
        return None
    detail = json.loads(cause.diag.message_detail or "{}", parse_float=Decimal)  # type: ignore[union-attr]
    answer = {name: detail.get(name) for name in DEBIT_COLUMNS}
    return {name: Decimal(value) if isinstance(value, int) else value for name, value in answer.items()}


@dataclass(frozen=True)
class SyncReport:
    created: list[str]
    updated: list[str]
    disabled: list[str]


@transaction.atomic(durable=True)
def tools_sync(*, remote_tools: list[dict[str, Any]], actor: str = "sync_tools") -> SyncReport:
    """Register the upstream's tools (name, description, schemas, annotations); disable vanished ones.

    Prices are untouched: a new tool has no price until an operator sets one.
    """
    now = timezone.now()
    seen: set[str] = set()
    created: list[str] = []
    updated: list[str] = []
    for spec in remote_tools:
        name = spec.get("name")
        if not isinstance(name, str) or not name or name == DOGFOOD_TOOL:
            continue
        seen.add(name)
        annotations = spec.get("annotations") or {}
        values = {
            "title": str(spec.get("title") or annotations.get("title") or "")[:200],
            "description": str(spec.get("description") or ""),
            "input_schema": spec.get("inputSchema") or {"type": "object"},
            "output_schema": spec.get("outputSchema"),
            "annotations": annotations,
            "source": ToolSource.UPSTREAM,
            "enabled": True,
            "synced_at": now,
        }
        category = (spec.get("_meta") or {}).get("io.tollgate/category")
        if isinstance(category, str):
            values["category"] = category
        _, was_created = Tool.objects.update_or_create(service_id=name, defaults=values)
        (created if was_created else updated).append(name)
    disabled = list(
        Tool.objects.filter(source=ToolSource.UPSTREAM, enabled=True)
        .exclude(service_id__in=seen)
        .values_list("service_id", flat=True)
    )
    Tool.objects.filter(service_id__in=disabled).update(enabled=False)
    audit_record(
        event="tools.synced",
        ok=True,
        detail={"created": created, "updated": updated, "disabled": disabled, "actor": actor},
    )
    return SyncReport(created, updated, disabled)


def dogfood_tool_register() -> Tool:
    """Register the local-only ``partner.notes.write`` tool (callable only while the flag is on)."""
    tool, _ = Tool.objects.update_or_create(
        service_id=DOGFOOD_TOOL,
        defaults={
            "title": "Partner notes (local dogfood tool)",
            "description": "Write a note into the gateway's own partner notebook. Local-only; not covered by "
            "dispatch-uncertainty semantics.",
            "input_schema": {
                "type": "object",
                "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 2000}},
                "required": ["text"],
                "additionalProperties": False,
            },
            "output_schema": {
                "type": "object",
                "properties": {"note_id": {"type": "string"}, "text": {"type": "string"}},
                "required": ["note_id", "text"],
            },
            "source": ToolSource.LOCAL,
            "category": "tooling",
            "enabled": True,
        },
    )
    return tool


# --- Upstream client (one per process) -------------------------------------------------

_client_lock = threading.Lock()
_client: UpstreamClient | None = None
_client_url: str | None = None


def upstream_client() -> UpstreamClient:
    """The process-wide upstream client for ``settings.UPSTREAM_MCP_URL`` (thread-safe)."""
    global _client, _client_url
    url = settings.UPSTREAM_MCP_URL
    if not url:
        raise RuntimeError("UPSTREAM_MCP_URL is not configured")
    with _client_lock:
        if _client is None or _client_url != url:
            if _client is not None:
                _client.close()
            _client = UpstreamClient(
                url,
                connect_timeout=settings.UPSTREAM_CONNECT_TIMEOUT,
                read_timeout=settings.UPSTREAM_READ_TIMEOUT,
                total_timeout=settings.UPSTREAM_READ_TIMEOUT * 2,
            )
            _client_url = url
        return _client


# --- The governed call -------------------------------------------------------------------


@dataclass(frozen=True)
class CallRequest:
    """A validated tools/call from any transport."""

    principal: Principal
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    permit_id: str
    quote_id: str
    transport: str
    endpoint: str
    # The key's rate-limit charge, deferred to the claim (billing.ratelimit): the principal's key then
    # comes from the process's cache, and the request must be charged before it writes anything else.
    deferred: DeferredCharge | None = None


@dataclass(frozen=True)
class CallAnswer:
    """What the transports render: the stored answer of the action and whether it is a replay."""

    action_id: str
    response: dict[str, Any]
    replayed: bool

    @property
    def http_status(self) -> int:
        return int(self.response["http_status"])


def request_document(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"tool": tool, "arguments": arguments}


def request_hash_of(tool: str, arguments: dict[str, Any]) -> str:
    return sha256_hex(canonical_bytes_fast(request_document(tool, arguments)))


def _validate_arguments(tool: _RegisteredTool, arguments: dict[str, Any]) -> None:
    """422 before anything is accepted or charged when the arguments break the tool's inputSchema."""
    validator = tool.arguments_validator
    if validator is None or validator.is_valid(arguments):
        return
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        loc = ["body", "arguments", *[str(p) for p in error.absolute_path]]
        raise RequestValidationError.single(loc, error.message[:300], "invalid_arguments")


def governed_call(req: CallRequest) -> CallAnswer:
    """Run one logical tools/call through permit -> meter -> dispatch -> receipt, at most once.

    Raises before acceptance (nothing written): ``RequestValidationError``
    (unknown or unpriced tool, arguments that break the inputSchema),
    ``IdempotencyKeyReused`` (422) and ``IdempotencyKeyInProgress`` (409).

    A call whose tool, price, permit and policies the process has cached is decided on those
    and claimed without reading them again (the claim compares what can have changed); any
    doubt, including a refusal, and it is decided again on rows read afresh (``_lookup``).
    """
    principal = req.principal
    if principal.is_operator or principal.wallet_id is None:
        from config.errors import WalletKeyRequired

        raise WalletKeyRequired("Tool calls need a wallet-scoped API key: the call is charged to its wallet.")
    digest = request_hash_of(req.tool, req.arguments)
    cached = _cached(req)
    if cached is not None:
        try:
            return _governed(req, cached, digest)
        except _Stale:
            pass
    if _uncharged(req):
        req = _charged(req)  # before the fresh path, which may record a denial
    return _governed(req, _lookup(req), digest)


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


def _governed(req: CallRequest, found: _Found, digest: str) -> CallAnswer:
    """The call on ``found``. From the cache, raises ``_Stale`` (nothing written) where fresh rows must decide."""
    if found.action is not None:
        return _existing(found.action, digest)
    if found.tool is None:
        raise RequestValidationError.single(["body", "name"], f"Unknown tool {req.tool!r}.", "unknown_tool")
    tool, price = found.tool.tool, found.price
    if price is None:
        raise RequestValidationError.single(
            ["body", "name"], "This tool has no price set and cannot be called.", "tool_price_not_set"
        )
    if found.cached:
        validator = found.tool.arguments_validator
        if validator is not None and not validator.is_valid(req.arguments):
            raise _Stale()  # a replay of the key, or the 422, is for the fresh lookup to tell
    else:
        _validate_arguments(found.tool, req.arguments)

    velocity: VelocityLimitExceeded | None = None
    try:
        action, velocity = run_retrying(lambda: _phase1(req, found, tool, price, digest))
    except IntegrityError:
        # A concurrent request with the same key inserted first (the unique index made us wait for it),
        # or, for a call decided from the cache, the key's earlier request.
        existing = _lookup(req).action
        if existing is None:
            raise
        return _existing(existing, digest)
    if velocity is not None:
        wallet_freeze_for_velocity(exc=velocity, actor_key_id=req.principal.key_id)
    if action.state == ActionState.DENIED:
        assert action.response is not None
        return CallAnswer(action.action_id, action.response, replayed=False)
    _remember(req, found)

    fault_point("after_claim")
    claimed = action
    if tool.source == ToolSource.LOCAL:
        action = run_retrying(lambda: _phase3_local(claimed, req))
    else:
        result = _dispatch(action, tool, req)
        fault_point("after_upstream")
        # Still unrecorded after the retries: the action stays claimed (409, retry later); the
        # sweeper settles it if this worker never does.
        action = run_retrying(lambda: _phase3(claimed, result))
    assert action.response is not None
    return CallAnswer(action.action_id, action.response, replayed=False)


def _existing(action: Action, digest: str) -> CallAnswer:
    if action.request_hash != digest:
        raise IdempotencyKeyReused()
    if action.finished and action.response is not None:
        return CallAnswer(action.action_id, action.response, replayed=True)
    raise IdempotencyKeyInProgress(
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        action_id=action.action_id,
        retry_after_seconds=RETRY_AFTER_SECONDS,
    )


_REFUSALS = (permit_exc.PermitDenied, permit_exc.QuoteUnavailable, SpendRefused, InsufficientFunds)


def _phase1(
    req: CallRequest, found: _Found, tool: Tool, list_price: Decimal, digest: str
) -> tuple[Action, VelocityLimitExceeded | None]:
    """Authorize on what ``_lookup`` read, then claim in one statement; or record the refusal.

    Authorization (the permit's and the quote's signed statements, the policies) is decided in
    Python; the claim (``_claim``) inserts the action already claimed, consumes the quote, debits,
    reserves and appends the audit event in one statement, re-checking under its locks everything
    that can have changed since the read (statuses, funds, spend windows, the permit's allowance
    and signed limits, the quote). A refusal writes nothing there; the denial (action, receipt,
    audit event) is then written in a transaction of its own. Raises ``IntegrityError`` when a
    concurrent request holds the same key.
    """
    now = timezone.now()
    key = req.principal.key
    wallet = key.wallet
    assert wallet is not None
    action = Action(
        action_id=new_id("act"),
        tenant_id=wallet.tenant_id,
        wallet=wallet,
        api_key_id=key.key_id,
        idempotency_key=req.idempotency_key,
        request_hash=digest,
        tool=tool.service_id,
        arguments=req.arguments,
        transport=req.transport,
        quote_id=req.quote_id,
        created_at=now,
    )
    permit = found.permit
    try:
        if permit is None:
            raise permit_exc.PermitNotFound(permit_id=req.permit_id)
        price, quote = list_price, None
        if req.quote_id:
            quote = quote_check(quote=found.quote, quote_id=req.quote_id, wallet=wallet, tool=tool.service_id, now=now)
            price = quote.quoted_credits
        decision = authorize(
            permit=permit,
            wallet=wallet,
            key_id=key.key_id,
            tool=tool.service_id,
            price=price,
            category=tool.category,
            now=now,
            # A cached permit's signed statement verified when it was cached, and the reservation requires
            # the row to still carry that signature and the signed limits.
            verify_signature=not found.cached,
            policies=found.policies,
        )
        action.policy_decision_id = decision.policy_decision_id
        if decision.refusal is not None:
            if found.cached:  # decided on cached rows (a permit's spend, say): decide again on fresh ones
                raise _Stale()
            raise decision.refusal
        debit = None
        if price <= 0:
            wallet_check_may_spend(wallet=wallet)  # free calls still honour frozen/expired/closed
        else:
            debit = debit_call(
                wallet_id=wallet.wallet_id,
                amount=price,
                service_category=tool.category,
                description=f"tool call {tool.service_id}",
                request_path=req.endpoint,
                correlation_id=action.action_id,
            )
        action.state = ActionState.DISPATCH_CLAIMED
        action.permit = permit
        action.price = price
        action.ledger_entry_id = debit.entry_id if debit else None
        action.claimed_at = timezone.now()
        event = audit_event_prepare(
            event="tool_call.dispatch_claimed",
            ok=True,
            tenant_id=wallet.tenant_id,
            wallet_id=wallet.wallet_id,
            key_id=key.key_id,
            tool=tool.service_id,
            endpoint=req.endpoint,
            policy_decision_id=action.policy_decision_id,
            detail={
                "action_id": action.action_id,
                "permit_id": permit.permit_id,
                "ledger_entry_id": debit.entry_id if debit else None,
                "amount": _money(price),
                "quote_id": req.quote_id or None,
            },
        )
        fault_point("before_claim")
        posted = _claim(action, quote, debit, permit, now, event, found, req.deferred if _uncharged(req) else None)
        action.ledger_entry = posted.entry if posted is not None else None
        return action, None
    except _REFUSALS as refusal:
        if _uncharged(req):  # the request is charged before its denial is written: decided again, afresh
            raise _Stale() from None
        velocity = refusal if isinstance(refusal, VelocityLimitExceeded) else None
        outcome = Outcome.INSUFFICIENT_FUNDS if isinstance(refusal, InsufficientFunds) else Outcome.DENIED
        with transaction.atomic(durable=True):
            action.state = ActionState.ACCEPTED
            action.permit = None
            action.price = None
            action.ledger_entry = None
            action.claimed_at = None
            action._state.adding = True
            fastsql.insert(action)
            _finish(
                action,
                state=ActionState.DENIED,
                outcome=outcome,
                reason_code=refusal.code,
                message=refusal.detail_message,
                extra=refusal.extra,
                permit=permit,
                credits_authorized=Decimal(0),
                credits_charged=Decimal(0),
                endpoint=req.endpoint,
                # 402 for funds, 403 for every other refusal (409 stays reserved for keys in progress).
                http_status=402 if isinstance(refusal, InsufficientFunds) else 403,
            )
        return action, velocity


def _dispatch(action: Action, tool: Tool, req: CallRequest) -> CallResult:
    """Phase 2: one upstream tools/call outside any transaction. Never raises, never resends."""
    try:
        client = upstream_client()
    except RuntimeError as exc:
        return CallResult(kind="not_sent", reason=str(exc), request_id=action.action_id)
    result = client.call_tool(
        tool.service_id,
        req.arguments,
        idempotency_key=f"{action.wallet_id}:{action.idempotency_key}",
        request_id=action.action_id,
        extra_meta={"io.tollgate/action-id": action.action_id},
        output_schema=tool.output_schema or None,
        input_schema=tool.input_schema or None,  # arguments marked x-mcp-header travel as headers too
    )
    metrics.observe_upstream(result.elapsed, kind=result.kind)
    return result


def _response_hash(result: CallResult) -> str:
    body = result.result if result.result is not None else result.error
    return sha256_hex(canonical_bytes_fast(body)) if body is not None else ""


def _lock_claimed(action: Action) -> Action | None:
    """Lock the action row and confirm it is still claimed; None if someone else finished it.

    Only the state is read back: phase 1's object already holds the permit, the ledger entry and
    the wallet, none of which phase 3 may change under the action's lock.
    """
    row = fastsql.fetch_row(_LOCK_CLAIMED_SQL, [action.action_id])
    return action if row is not None and row[0] == ActionState.DISPATCH_CLAIMED else None


_LOCK_CLAIMED_SQL = "SELECT state FROM mcpgateway_action WHERE action_id = %s FOR NO KEY UPDATE"


# Upstream results that keep the charge and owe nothing back: (outcome, reason code).
_KEEPS_CHARGE = {
    "success": (Outcome.SUCCESS, ""),
    "tool_error": (Outcome.TOOL_ERROR, "tool_error"),
    "invalid_response": (Outcome.RESPONSE_REJECTED, "response_rejected"),
}


def _phase3(action: Action, result: CallResult) -> Action:
    """Record the upstream outcome, refund where owed, receipt and audit, in one transaction.

    When the charge stands (success, tool error, rejected answer) that is one statement in
    autocommit (``gateway_finish``: its own transaction); refunds and uncertain deliveries take
    several statements in one transaction.
    """
    kind = result.kind
    detail = {"upstream_kind": kind, "upstream_reason": result.reason[:200], "status_code": result.status_code}
    if kind in _KEEPS_CHARGE:
        outcome, reason_code = _KEEPS_CHARGE[kind]
        price = action.price or Decimal(0)
        fault_point("before_receipt")
        receipt = _finish(
            action,
            state=ActionState.COMPLETED,
            outcome=outcome,
            reason_code=reason_code,
            message=f"The upstream's answer was rejected: {result.reason[:200]}"
            if reason_code == "response_rejected"
            else "",
            result=None if reason_code == "response_rejected" else result.result,
            response_hash=_response_hash(result),
            credits_authorized=price,
            credits_charged=price,
            audit_detail=detail,
            while_claimed=True,
        )
        if receipt is None:
            # The sweeper declared it delivery_uncertain first; that receipt stands.
            logger.warning("action %s finished after it was swept (%s)", action.action_id, kind)
            return Action.objects.get(pk=action.pk)
        return action
    with transaction.atomic(durable=True):
        locked = _lock_claimed(action)
        fault_point("before_receipt")
        if locked is None:
            # The sweeper declared it delivery_uncertain first; that receipt stands.
            logger.warning("action %s finished after it was swept (%s)", action.action_id, result.kind)
            return Action.objects.get(pk=action.pk)
        price = locked.price or Decimal(0)
        if kind == "uncertain":
            _finish(
                locked,
                state=ActionState.DELIVERY_UNCERTAIN,
                outcome=Outcome.DELIVERY_UNCERTAIN,
                reason_code="delivery_uncertain",
                message=(
                    "The request may have reached the upstream but no complete answer came back. It will not "
                    "be re-sent; the charge is kept pending external reconciliation."
                ),
                credits_authorized=price,
                credits_charged=price,
                audit_detail=detail,
            )
            _alert_uncertain(locked, result.reason)
        else:  # not_sent, http_error, jsonrpc_error: the tool did not run, the charge is owed back
            upstream_error = result.error or {}
            _refund_and_finish(
                locked,
                price=price,
                reason_code="upstream_error" if kind == "jsonrpc_error" else f"upstream_{kind}",
                message=str(upstream_error.get("message") or result.reason)[:300],
                extra={"upstream_error": upstream_error} if upstream_error else {},
                response_hash=_response_hash(result),
                audit_detail=detail,
            )
    return locked


def _refund_and_finish(
    action: Action,
    *,
    price: Decimal,
    reason_code: str,
    message: str,
    extra: dict[str, Any],
    response_hash: str,
    audit_detail: dict[str, Any],
) -> None:
    """Refund the charge and release the allowance; if the refund cannot post, open a reconciliation item."""
    refund = None
    unrefunded_reason = ""
    if price > 0 and action.ledger_entry is not None:
        try:
            with transaction.atomic():
                # Lock order as in phase 1: the wallet row (the refund), then the permit row.
                refund = ledger_refund(
                    amount=price,
                    charge=action.ledger_entry,
                    description=f"refund: {action.tool} did not run",
                    correlation_id=action.action_id,
                )
                if action.permit_id:
                    permit_release(permit_id=action.permit_id, amount=price)
        except ApplicationError as err:
            unrefunded_reason = f"{err.code}: {err.detail_message}"[:300]
    elif action.permit_id:
        permit_release(permit_id=action.permit_id, amount=price)
    outcome = Outcome.FAILED_UNREFUNDED if unrefunded_reason else Outcome.FAILED_REFUNDED
    receipt = _finish(
        action,
        state=ActionState.COMPLETED,
        outcome=outcome,
        reason_code=reason_code,
        message=message,
        extra=extra,
        response_hash=response_hash,
        credits_authorized=price,
        credits_charged=price if unrefunded_reason else Decimal(0),
        refund_entry=refund,
        audit_detail={**audit_detail, **({"refund_error": unrefunded_reason} if unrefunded_reason else {})},
    )
    if unrefunded_reason:
        refund_reconciliation_open(receipt=receipt, amount=price, origin="failed_unrefunded", reason=unrefunded_reason)


def _alert_uncertain(action: Action, reason: str) -> None:
    alert_raise(
        tenant_id=action.tenant_id,
        wallet_id=action.wallet_id,
        kind="delivery_uncertain",
        severity="critical",
        message=(
            f"Delivery of {action.tool} (action {action.action_id}) could not be confirmed ({reason[:120]}). "
            "It was not re-sent; reconcile with the upstream."
        ),
        detail={"action_id": action.action_id, "tool": action.tool},
    )


def _finish(
    action: Action,
    *,
    state: str,
    outcome: str,
    credits_authorized: Decimal,
    credits_charged: Decimal,
    reason_code: str = "",
    message: str = "",
    extra: dict[str, Any] | None = None,
    result: dict[str, Any] | None = None,
    response_hash: str = "",
    permit: Permit | None = None,
    refund_entry: Any = None,
    endpoint: str = "",
    http_status: int | None = None,
    audit_detail: dict[str, Any] | None = None,
    while_claimed: bool = False,
) -> Any:
    """Issue the receipt (with its audit event) and store the action's final answer. Caller holds the transaction.

    With ``while_claimed`` all of it is one statement (``gateway_finish``), sent in autocommit by
    the caller, that first locks the action and checks it is still claimed: None (nothing
    written) when it is not.
    """
    wallet = action.wallet if isinstance(action.wallet, Wallet) else Wallet.objects.get(pk=action.wallet_id)
    receipt, event = receipt_prepare(
        action_id=action.action_id,
        wallet=wallet,
        api_key_id=action.api_key_id,
        tool=action.tool,
        outcome=outcome,
        request_document=request_document(action.tool, action.arguments),
        request_hash=action.request_hash,
        credits_authorized=credits_authorized,
        credits_charged=credits_charged,
        response_hash=response_hash,
        reason_code=reason_code,
        permit=permit or action.permit,
        ledger_entry=action.ledger_entry,
        refund_entry=refund_entry,
        quote_id=action.quote_id,
        policy_decision_id=action.policy_decision_id,
        endpoint=endpoint or f"transport:{action.transport}",
        audit_detail=audit_detail,
    )
    status, rpc_code = OUTCOME_STATUS[outcome]
    response: dict[str, Any] = {
        "action_id": action.action_id,
        "receipt_id": receipt.receipt_id,
        "outcome": outcome,
        "reason_code": reason_code,
        "credits_charged": _money(credits_charged),
        "http_status": http_status or status,
        "result": result,
        "error": None,
    }
    if rpc_code is not None:
        response["error"] = {
            "code": rpc_code,
            "message": message or outcome,
            "data": {
                "error": reason_code or outcome,
                "outcome": outcome,
                "receipt_id": receipt.receipt_id,
                "action_id": action.action_id,
                **(extra or {}),
            },
        }
    action.state = state
    action.outcome = outcome
    action.reason_code = reason_code
    action.receipt = receipt
    action.response = response
    action.completed_at = timezone.now()
    if while_claimed:
        with fastsql.own_transaction():
            row = fastsql.fetch_row(
                _FINISH_SQL,
                [
                    action.action_id,
                    json.dumps(fastsql.json_row(receipt)),
                    state,
                    outcome,
                    reason_code,
                    receipt.receipt_id,
                    json.dumps(response),
                    action.completed_at,
                    *event.params(),
                ],
            )
        if row is None or row[0] != "ok":
            return None
        fastsql.inserted(receipt)
        return receipt
    fastsql.insert(receipt)  # receipts are only ever inserted (``Receipt.save`` refuses updates)
    fastsql.update(action, ["state", "outcome", "reason_code", "receipt", "response", "completed_at"])
    audit_append_prepared(event)  # last: it locks the tenant's chain head until commit
    return receipt


# gateway_finish (mcpgateway/migrations/0004): 8 arguments of its own, then audit_append's 15.
_FINISH_SQL = "SELECT gateway_finish(" + ", ".join(["%s"] * 23) + ")"


# --- The local dogfood tool --------------------------------------------------------------


def _phase3_local(action: Action, req: CallRequest) -> Action:
    """Run ``partner.notes.write`` inside the final transaction: no dispatch uncertainty."""
    from mcpgateway.models import PartnerNote

    with transaction.atomic(durable=True):
        locked = (
            Action.objects.select_for_update(no_key=True, of=("self",))
            .select_related("permit", "ledger_entry", "wallet")
            .get(pk=action.pk)
        )
        note = PartnerNote.objects.create(
            note_id=new_id("note"),
            tenant_id=locked.tenant_id,
            wallet_id=locked.wallet_id,
            action_id=locked.action_id,
            text=str(req.arguments.get("text", "")),
        )
        structured = {"note_id": note.note_id, "text": note.text}
        result = {
            "content": [{"type": "text", "text": f"Saved note {note.note_id}."}],
            "structuredContent": structured,
            "isError": False,
        }
        price = locked.price or Decimal(0)
        _finish(
            locked,
            state=ActionState.COMPLETED,
            outcome=Outcome.SUCCESS,
            result=result,
            response_hash=sha256_hex(canonical_bytes_fast(result)),
            credits_authorized=price,
            credits_charged=price,
            audit_detail={"local_tool": True},
        )
    return locked


# --- The sweeper ----------------------------------------------------------------------------


def sweep_threshold() -> timedelta:
    """Claims older than this are lost: the dispatch timeout (connect + twice the read timeout) plus a margin."""
    seconds = settings.UPSTREAM_CONNECT_TIMEOUT + 2 * settings.UPSTREAM_READ_TIMEOUT + settings.SWEEP_MARGIN_SECONDS
    return timedelta(seconds=seconds)


def action_sweep(*, older_than: timedelta | None = None, limit: int = 500) -> list[str]:
    """Turn stale ``dispatch_claimed`` actions into ``delivery_uncertain`` with receipt, audit and alert.

    Nothing is re-sent. Each action is settled in its own transaction under its
    row lock (``SKIP LOCKED``: a worker finishing it right now wins).
    """
    cutoff = timezone.now() - (older_than if older_than is not None else sweep_threshold())
    swept: list[str] = []
    candidates = list(
        Action.objects.filter(state=ActionState.DISPATCH_CLAIMED, claimed_at__lt=cutoff)
        .order_by("claimed_at")
        .values_list("action_id", flat=True)[:limit]
    )
    for action_id in candidates:
        with transaction.atomic(durable=True):
            locked = (
                Action.objects.select_for_update(no_key=True, of=("self",), skip_locked=True)
                .select_related("permit", "ledger_entry", "wallet")
                .filter(action_id=action_id, state=ActionState.DISPATCH_CLAIMED)
                .first()
            )
            if locked is None:
                continue
            price = locked.price or Decimal(0)
            _finish(
                locked,
                state=ActionState.DELIVERY_UNCERTAIN,
                outcome=Outcome.DELIVERY_UNCERTAIN,
                reason_code="dispatch_lost",
                message=(
                    "The gateway lost track of this dispatch (the worker stopped after claiming it). It was "
                    "not re-sent; the charge is kept pending external reconciliation."
                ),
                credits_authorized=price,
                credits_charged=price,
                endpoint="sweeper",
                audit_detail={"swept": True},
            )
            _alert_uncertain(locked, "dispatch lost: the worker stopped after claiming it")
            swept.append(action_id)
    return swept


@transaction.atomic(durable=True)
def tool_update(*, service_id: str, category: str, enabled: bool, actor: str = "") -> Tool:
    """Change a tool's category or availability (prices are set in billing); audited."""
    tool = Tool.objects.select_for_update(no_key=True).get(service_id=service_id)
    before = {"category": tool.category, "enabled": tool.enabled}
    tool.category = category
    tool.enabled = enabled
    tool.save(update_fields=["category", "enabled", "updated_at"])
    audit_record(
        event="tool.updated",
        ok=True,
        tool=service_id,
        detail={"before": before, "after": {"category": category, "enabled": enabled}, "actor": actor},
    )
    return tool
