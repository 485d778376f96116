"""The one map from the refusal codes of the database functions to the exceptions they become.

Every function that refuses answers a code and the figures that go with it (its columns, or the JSON
DETAIL of a raised refusal): ``billing_debit``, ``billing_charge``, ``billing_refund``, ``billing_post``
and ``billing_wallet_may_spend`` (billing's codes), ``gateway_claim`` (billing's debit codes plus the
permit's and the quote's). Each app registers the codes it owns, with the function that builds the
exception, when its refusal module is imported (``billing.refusals``, ``permits.refusals``; each app's
``ready`` imports it), and every caller turns a code into its exception here, with what it knows of the
call (``RefusedCall``). This module imports no app (docs/decisions.md, "One map of refusal codes").

Codes that tell the caller to decide again on fresh rows rather than refuse (``gateway_claim``'s
``stale`` and ``rate_limited``, ``billing_charge``'s ``key_stale`` and ``rate_limited`` under a deferred
rate-limit charge) are not refusals: their callers handle them before asking this map. A code that is
not in the map is a bug (``RuntimeError``), never an answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

# The codes that are not refusals: the call went through (``ok``) or answers a stored response (``replay``).
NOT_REFUSED = frozenset({"ok", "replay"})


@dataclass(frozen=True)
class RefusedCall:
    """What the caller knows of the call a refusal answers; each code's builder reads what it needs."""

    amount: Decimal = Decimal(0)  # what the call asked for (a refusal's ``required``)
    wallet_id: str = ""  # the calling wallet: the figures of another wallet are not the caller's to read
    permit_id: str = ""
    quote_id: str = ""
    now: datetime | None = None
    cap_wallets: Mapping[str, str] = field(default_factory=dict)  # policy -> the wallet whose spend its cap counts
    policy_decision_id: str = ""


# A code's builder: the function's answer (its columns by name) and the call -> the exception to raise.
Build = Callable[[Mapping[str, Any], RefusedCall], Exception]

_BUILDERS: dict[str, Build] = {}


def refusals_register(builders: Mapping[str, Build]) -> None:
    """Register an app's codes. A code belongs to one app: registering it again with another builder is a bug."""
    for code, build in builders.items():
        if code in NOT_REFUSED or _BUILDERS.get(code, build) is not build:
            raise RuntimeError(f"refusal code {code!r} is registered twice")
        _BUILDERS[code] = build


def refusal_codes() -> frozenset[str]:
    """Every registered refusal code."""
    return frozenset(_BUILDERS)


def refusal_exception(row: Mapping[str, Any], call: RefusedCall) -> Exception | None:
    """The exception for the refusal ``row`` answers (``row["code"]`` and its figures), or None for ``ok``
    and ``replay``. Raises ``RuntimeError`` for a code no app registered."""
    code = row["code"]
    if code is None or code in NOT_REFUSED:
        return None
    build = _BUILDERS.get(code)
    if build is None:
        raise RuntimeError(f"a database function answered an unknown refusal code {code!r}")
    return build(row, call)
