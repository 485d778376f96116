"""The governed action (docs/architecture.md, "The governed call"): the core of the gateway.

One logical action is one ``Action`` row, unique per (wallet, idempotency key)
across every transport. It moves through three phases:

Phase 1: find the action (same request hash -> replay the stored answer, or
409 while it runs; other hash -> 422 ``idempotency_key_reused``, nothing
written); authorize (the permit, checked in Python, and the policies' verdict,
judged in SQL by permits_policy_verdict, on the rows read or cached); then
claim in one statement (``gateway_claim``), which re-checks under its locks
what may have changed since the read: insert the action already
``dispatch_claimed``, consume the quote, if any, debit the
wallet, reserve the price against the permit allowance and audit. A refusal
(permit, policy, spend controls, funds, quote) writes nothing there; it is
recorded in a transaction of its own as a ``denied``/``insufficient_funds``
action with its receipt; nothing was charged.

Phase 2, no transaction: send ``tools/call`` upstream once, forwarding the
idempotency key (header and ``params._meta``). Never resent.

Phase 3, one statement (``gateway_finish``) when the charge stands: record the
outcome while the action is still claimed, sign the receipt, append the audit
event, link everything and store the answer. Otherwise one transaction of
several statements does the same, refunding where the tool certainly did not
run (or opening a reconciliation item when the refund cannot be posted) or
recording ``delivery_uncertain`` when the answer was lost.

A worker that dies after the claim leaves the action ``dispatch_claimed``;
``action_sweep`` later turns it into ``delivery_uncertain`` with its receipt.
The local dogfood tool runs inside phase 3's transaction, so it has no
dispatch uncertainty.

This module runs the phases in order (``governed_call``); each has its module:
``claim``, ``dispatch`` and ``finish``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import IntegrityError

from billing.exceptions import VelocityLimitExceeded
from billing.services import wallet_freeze_for_velocity
from common import tracing
from common.dbretry import run_retrying
from common.errors import IdempotencyKeyInProgress, IdempotencyKeyReused, RequestValidationError, conflict_response
from common.faults import fault_point
from mcpgateway.argschema import ArgumentError
from mcpgateway.exceptions import ToolSchemaUnusable
from mcpgateway.models import Action, ActionState, ToolSource
from mcpgateway.services.call import CallAnswer, CallRequest, _charged, _uncharged, request_hash_of
from mcpgateway.services.claim import _phase1
from mcpgateway.services.dispatch import _dispatch
from mcpgateway.services.finish import _phase3, _phase3_local
from mcpgateway.services.lookup import _cached, _Found, _lookup, _remember, _Stale
from mcpgateway.services.tools import _RegisteredTool
from mcpgateway.services.upstreams import UpstreamCredentialsUnavailable, upstream_credentials_ready
from permits.exceptions import PermitKeyMismatch
from permits.models import Permit

RETRY_AFTER_SECONDS = 2


def _arguments_error(tool: _RegisteredTool, arguments: dict[str, Any]) -> ArgumentError | None:
    """Why ``arguments`` break the tool's inputSchema (or its bounds), or None: one pass, linear in their size.

    The caller has refused a tool whose inputSchema is unusable (``tool.arguments`` is then None).
    """
    assert tool.arguments is not None
    return tool.arguments.check(
        arguments,
        max_nodes=settings.TOOL_ARGUMENT_MAX_NODES,
        max_items=settings.TOOL_ARGUMENT_MAX_ITEMS,
        max_steps=settings.TOOL_ARGUMENT_MAX_STEPS,
    ).error


def _refuse_arguments(error: ArgumentError) -> RequestValidationError:
    """The 422 of arguments that break the inputSchema or its bounds, before anything is accepted or charged."""
    loc = ["body", "arguments", *[str(p) for p in error.path]]
    return RequestValidationError.single(loc, error.message[:300], error.type)


def governed_call(req: CallRequest) -> CallAnswer:
    """``_governed_call``, in the span ``tools/call <tool>`` when tracing is on (``common.tracing``)."""
    if not tracing.ENABLED:
        return _governed_call(req)
    with tracing.call_span(req.trace_context) as span:
        answer = _governed_call(req)
        response = answer.response
        tracing.call_outcome(
            span,
            tool=req.tool,
            action_id=answer.action_id,
            outcome=str(response["outcome"]),
            credits_charged=str(response["credits_charged"]),
            replayed=answer.replayed,
            failed=answer.http_status >= 500,
        )
        return answer


def _governed_call(req: CallRequest) -> CallAnswer:
    """Run one logical tools/call through permit -> meter -> dispatch -> receipt, at most once.

    Raises before acceptance (nothing written): ``RequestValidationError``
    (unknown or unpriced tool, arguments that break the inputSchema or its bounds, validated once),
    ``ToolSchemaUnusable`` (422: the tool's inputSchema cannot be used), ``IdempotencyKeyReused``
    (422), ``IdempotencyKeyInProgress`` (409) and ``UpstreamCredentialsUnavailable`` (503 or 502: no
    OAuth access token for the tool's server could be had).

    A call whose tool, price, permit and policies the process has cached is decided on those
    and claimed without reading them again (the claim compares what can have changed); any
    doubt, including a refusal, and it is decided again on rows read afresh (``_lookup``).
    """
    principal = req.principal
    if principal.is_operator or principal.wallet_id is None:
        from common.errors import WalletKeyRequired

        raise WalletKeyRequired("Tool calls need a wallet-scoped API key: the call is charged to its wallet.")
    digest = request_hash_of(req.tool, req.arguments)
    judged: dict[int, tuple[_RegisteredTool, ArgumentError | None]] = {}  # the arguments are validated once
    cached = _cached(req)
    if cached is not None:
        try:
            return _governed(req, cached, digest, judged)
        except _Stale:
            pass
    if _uncharged(req):
        req = _charged(req)  # before the fresh path, which may record a denial
    for attempt in range(1, FRESH_ATTEMPTS + 1):
        try:
            return _governed(req, _lookup(req), digest, judged)
        except _Stale as stale:
            # The tool, its price or the policies changed between the lookup and the claim (nothing was
            # written): decide again on rows read afresh.
            if attempt == FRESH_ATTEMPTS:
                raise conflict_response() from stale
    raise AssertionError("unreachable")


# Fresh lookups a call is decided on before its claim gives up (409) when the rows keep changing under it.
FRESH_ATTEMPTS = 3


def _governed(
    req: CallRequest, found: _Found, digest: str, judged: dict[int, tuple[_RegisteredTool, ArgumentError | None]]
) -> CallAnswer:
    """The call on ``found``. From the cache, raises ``_Stale`` (nothing written) where fresh rows must decide.

    ``judged`` keeps the verdict on the arguments per registered tool, so a call decided again on
    fresh rows does not validate them again when its tool has not changed.
    """
    if found.action is not None:
        return _existing(found.action, digest, req.principal.key_id)
    if found.tool is None:
        raise RequestValidationError.single(["body", "name"], f"Unknown tool {req.tool!r}.", "unknown_tool")
    if found.tool.schema_problem is not None:
        if found.cached:
            raise _Stale()  # the fresh lookup tells a replay of the key from the refusal
        raise ToolSchemaUnusable(
            f"The tool {req.tool!r} cannot be called: its inputSchema cannot be used to validate arguments "
            f"({found.tool.schema_problem[:200]}).",
            tool=req.tool,
        )
    tool, price = found.tool.tool, found.price
    if price is None:
        raise RequestValidationError.single(
            ["body", "name"], "This tool has no price set and cannot be called.", "tool_price_not_set"
        )
    seen = judged.get(id(found.tool))
    if seen is not None and seen[0] is found.tool:
        error = seen[1]
    else:
        error = _arguments_error(found.tool, req.arguments)
        judged[id(found.tool)] = (found.tool, error)
    if error is not None:
        if found.cached:
            raise _Stale()  # a replay of the key, or the 422, is for the fresh lookup to tell
        raise _refuse_arguments(error)

    server = found.tool.server
    if server is not None and tool.source == ToolSource.UPSTREAM:
        # An OAuth access token is fetched here, off any transaction and before anything is written.
        wallet = req.principal.key.wallet
        try:
            upstream_credentials_ready(server=server, tenant_id=wallet.tenant_id if wallet is not None else "")
        except UpstreamCredentialsUnavailable:
            if found.cached:  # decided on a cached server row (older credentials?): decide again on fresh rows
                raise _Stale() from None
            raise

    if tracing.ENABLED and found.tool.server is not None:
        tracing.current_set("tollgate.upstream.server", found.tool.server.slug)
    velocity: VelocityLimitExceeded | None = None
    try:
        with tracing.phase("claim"):
            action, velocity = run_retrying(lambda: _phase1(req, found, tool, price, digest))
    except IntegrityError:
        # A concurrent request with the same key inserted first (the unique index made us wait for it),
        # or, for a call decided from the cache, the key's earlier request.
        existing = _lookup(req).action
        if existing is None:
            raise
        return _existing(existing, digest, req.principal.key_id)
    if velocity is not None:
        wallet_freeze_for_velocity(exc=velocity, actor_key_id=req.principal.key_id)
    if action.state == ActionState.DENIED:
        assert action.response is not None
        return CallAnswer(action.action_id, action.response, replayed=False)
    _remember(req, found)

    fault_point("after_claim")
    claimed = action
    if tool.source == ToolSource.LOCAL:
        with tracing.phase("finish"):
            action = run_retrying(lambda: _phase3_local(claimed, req))
    else:
        result = _dispatch(action, tool, req, found.tool.server)
        fault_point("after_upstream")
        # Still unrecorded after the retries: the action stays claimed (409, retry later); the
        # sweeper settles it if this worker never does.
        with tracing.phase("finish"):
            action = run_retrying(lambda: _phase3(claimed, result))
    assert action.response is not None
    return CallAnswer(action.action_id, action.response, replayed=False)


def _existing(action: Action, digest: str, key_id: str) -> CallAnswer:
    """The answer to a request whose idempotency key names ``action`` (the wallet's call with that key).

    Only a key the action's permit would let call answers from it: when the permit binds another key
    (``subject_key_id``), 403 ``permit_key_mismatch`` before anything about the call, so another key of
    the wallet cannot read the bound key's results by replaying its idempotency keys.
    """
    if action.api_key_id != key_id and action.permit_id:
        bound = Permit.objects.filter(pk=action.permit_id).values_list("subject_key_id", flat=True).first()
        if bound and bound != key_id:
            raise PermitKeyMismatch(permit_id=action.permit_id)
    if action.request_hash != digest:
        raise IdempotencyKeyReused()
    if action.finished and action.response is not None:
        return CallAnswer(action.action_id, action.response, replayed=True)
    raise IdempotencyKeyInProgress(
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        action_id=action.action_id,
        retry_after_seconds=RETRY_AFTER_SECONDS,
    )
