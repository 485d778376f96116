"""What a governed call is decided on (``_Found``): its rows read in one round trip, or the process's cache.

``_lookup`` reads them afresh; ``_cached`` finds them among what calls claimed before (``_remember``).
A call decided on cached rows raises ``_Stale`` wherever fresh rows must decide instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from decimal import Decimal

from common import fastsql
from common.cache import BoundedCache
from mcpgateway.models import Action
from mcpgateway.services.call import CallRequest
from mcpgateway.services.tools import _registered, _registered_tool, _RegisteredTool, tool_is_callable
from permits.models import Permit, Quote
from permits.services import PolicyVerdict, policy_verdict_from_json, policy_verdict_sql


@dataclass(frozen=True)
class _Found:
    """What a governed call is decided on: read for it in one round trip (``_lookup``), or from the cache."""

    action: Action | None  # the action of (wallet, idempotency key), if any
    tool: _RegisteredTool | None  # the callable tool of that name
    price: Decimal | None  # its price (None: not set, not callable)
    permit: Permit | None  # the permit, when it is the wallet's
    quote: Quote | None  # the quote, when one is named and it is the wallet's
    verdict: PolicyVerdict  # permits_policy_verdict of the wallet's line for this tool, price and permit
    policies_version: str  # permits_policies_version of the wallet's line
    cached: bool = False  # from the process's cache: the claim compares what can have changed


_VERDICT = policy_verdict_sql(
    tool="t.service_id",
    server="s.slug",
    category="t.category",
    amount="coalesce(q.quoted_credits, pr.credits)",
    permit="p.signed_statement",
)


@functools.cache
def _lookup_sql() -> str:
    # Column names come from the models' metadata, never from input.
    return (
        f"SELECT {fastsql.columns(Action, 'a')}, t.service_id, gateway_tool_version(t.service_id), "  # noqa: S608
        f"pr.credits, {fastsql.columns(Permit, 'p')}, {fastsql.columns(Quote, 'q')}, "
        # The policy verdict at the price the call is decided at: the quote's when it names one (a quote of
        # another tool or wallet is refused before the verdict is read), else the tool's list price.
        f"({_VERDICT}), "
        "permits_policies_version(%s) "
        "FROM (SELECT 1) AS one "
        "LEFT JOIN mcpgateway_action a ON a.wallet_id = %s AND a.idempotency_key = %s "
        "LEFT JOIN mcpgateway_tool t ON t.service_id = %s "
        "LEFT JOIN mcpgateway_upstream_server s ON s.server_id = t.server_id "
        "LEFT JOIN billing_tool_price pr ON pr.tool = t.service_id "
        "LEFT JOIN permits_permit p ON p.permit_id = %s AND p.wallet_id = %s "
        "LEFT JOIN permits_quote q ON q.quote_id = %s AND q.wallet_id = %s"
    )


def _lookup(req: CallRequest) -> _Found:
    """One round trip, in autocommit: the action of the key, the tool with its price, the permit, the quote
    and the policy verdict for the call (``permits_policy_verdict``). Nothing is locked: phase 1's claim
    re-checks under its locks whatever can change."""
    wallet = req.principal.key.wallet
    assert wallet is not None
    wallet_id, ancestry = wallet.wallet_id, wallet.ancestry
    key, name, permit_id, quote_id = req.idempotency_key, req.tool, req.permit_id, req.quote_id
    row = fastsql.fetch_row(
        _lookup_sql(),
        [wallet.tenant_id, ancestry, ancestry, wallet_id, key, name, permit_id, wallet_id, quote_id, wallet_id],
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
        verdict=policy_verdict_from_json(row[at]),
        policies_version=row[at + 1],
    )


# What a call needs beyond its own action, cached per process once a call has been claimed on it: a tool's
# list price, a permit whose signed statement verified, the policy verdict of a wallet's line for a tool
# (at that list price, under that permit) with the policies' version.
# A call that finds all of them here is decided without the lookup; its claim compares the tool's version,
# the price and the policies' version, and the reservation requires the permit row to still carry every
# signed column and the signature, so nothing cached can authorize what the rows no longer allow (``_Stale``:
# read afresh). Only what the claim re-checks is used from here: a refusal decided on cached rows is never
# recorded (the call is decided again on fresh ones), and balances, spend and the permit's allowance are
# only ever read under the claim's locks.
CACHE_LIMIT = 10_000  # entries per cache; past it the oldest entry goes (common.cache)
_prices: BoundedCache[str, Decimal] = BoundedCache("gateway.prices", max_entries=CACHE_LIMIT)
_permits: BoundedCache[str, Permit] = BoundedCache("gateway.permits", max_entries=CACHE_LIMIT)
# (wallet, tool, permit) -> (permits_policies_version, the verdict): the claim compares the version, the tool's
# and the price, and the reservation the permit's signature (the statement the verdict read)
_verdicts: BoundedCache[tuple[str, str, str], tuple[str, PolicyVerdict]] = BoundedCache(
    "gateway.verdicts", max_entries=CACHE_LIMIT
)


class _Stale(Exception):
    """A call decided on cached rows must be decided again on fresh ones (nothing was written)."""


def _cached(req: CallRequest) -> _Found | None:
    """The call's rows from the process's cache, or None when any is missing (or it names a quote)."""
    wallet = req.principal.key.wallet
    if wallet is None or req.quote_id:
        return None
    tool, price = _registered.get(req.tool), _prices.get(req.tool)
    permit, verdict = _permits.get(req.permit_id), _verdicts.get((wallet.wallet_id, req.tool, req.permit_id))
    if tool is None or price is None or permit is None or verdict is None or not tool_is_callable(tool.tool):
        return None
    return _Found(
        action=None,
        tool=tool,
        price=price,
        permit=permit,
        quote=None,
        verdict=verdict[1],
        policies_version=verdict[0],
        cached=True,
    )


def _remember(req: CallRequest, found: _Found) -> None:
    """Cache what a call read afresh and was claimed on."""
    wallet = req.principal.key.wallet
    if found.cached or wallet is None or found.price is None or found.permit is None:
        return
    _prices.set(req.tool, found.price)
    _permits.set(req.permit_id, found.permit)
    _verdicts.set((wallet.wallet_id, req.tool, req.permit_id), (found.policies_version, found.verdict))
