"""One map of refusal codes (common.refusals): every code a database function answers becomes its exception
there, registered by the app that owns it; a code registered twice, or unknown, is a bug."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from billing.exceptions import SpendRefused
from common import refusals
from common.refusals import NOT_REFUSED, RefusedCall, refusal_codes, refusal_exception, refusals_register
from common.sqlfiles import sql_files
from permits import exceptions as permit_exc

# The codes that tell the caller to decide again on fresh rows: handled before the map, never raised.
DECIDE_AGAIN = {"stale", "rate_limited", "key_stale"}
_CODE = re.compile(r"\bcode\s*:=\s*'([a-z_]+)'|WHEN [^']*THEN '(idempotency_[a-z_]+)'")


def answered_codes() -> set[str]:
    """Every code a function of the SQL files sets (``code := '...'``, and billing_charge's CASE of them)."""
    found = set()
    for file in sql_files():
        for assigned, cased in _CODE.findall(file.text()):
            found.add(assigned or cased)
    return found


def test_every_code_a_function_answers_is_in_the_map() -> None:
    codes = answered_codes()
    assert {"not_found", "policy_denied", "quote_unavailable", "permit_refused", "policy_daily_cap"} <= codes
    assert codes - NOT_REFUSED - DECIDE_AGAIN <= refusal_codes()


def test_the_claims_codes_are_the_permits_apps() -> None:
    refusal = refusal_exception({"code": "quote_unavailable"}, RefusedCall(quote_id="qt_1"))
    assert isinstance(refusal, permit_exc.QuoteUnavailable)
    assert refusal.extra == {"quote_id": "qt_1"}
    over = refusal_exception(
        {"code": "policy_daily_cap", "subject_id": "pol_1", "figure": Decimal(3), "figure_limit": Decimal(4)},
        RefusedCall(amount=Decimal(2), wallet_id="w_child", cap_wallets={"pol_1": "w_agent"}, policy_decision_id="pd"),
    )
    assert isinstance(over, permit_exc.PolicyDenied)
    # The cap counts the agent's line, not the caller's to read: no spend figure.
    assert over.extra == {
        "policy_id": "pol_1",
        "rule": "max_daily_credits",
        "limit": "4.00000000",
        "required": "2.00000000",
        "policy_decision_id": "pd",
    }


@pytest.mark.parametrize(
    ("code", "cap", "spent"),
    [("budget_exceeded", "budget", "total_spent"), ("daily_limit_exceeded", "daily_limit", "daily_spent")],
)
def test_a_caps_refusal_names_the_cap_and_the_spend_under_the_wallets_field_names(
    code: str, cap: str, spent: str
) -> None:
    refusal = refusal_exception(
        {"code": code, "subject_id": "w_agent", "figure": Decimal(7), "figure_limit": Decimal(10)},
        RefusedCall(amount=Decimal(5)),
    )
    assert isinstance(refusal, SpendRefused)
    assert (refusal.code, refusal.http_status) == (code, 403)
    assert list(refusal.as_detail().items())[2:] == [
        ("wallet_id", "w_agent"),
        (cap, "10.00000000"),
        (spent, "7.00000000"),
        ("required", "5.00000000"),
    ]


def test_ok_and_replay_are_no_refusal_and_an_unknown_code_is_a_bug() -> None:
    assert refusal_exception({"code": "ok"}, RefusedCall()) is None
    assert refusal_exception({"code": "replay"}, RefusedCall()) is None
    with pytest.raises(RuntimeError, match="unknown refusal code 'made_up'"):
        refusal_exception({"code": "made_up"}, RefusedCall())


def test_a_code_belongs_to_one_app(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refusals, "_BUILDERS", dict(refusals._BUILDERS))
    with pytest.raises(RuntimeError, match="'policy_denied' is registered twice"):
        refusals_register({"policy_denied": lambda row, call: RuntimeError()})
    with pytest.raises(RuntimeError, match="'ok' is registered twice"):
        refusals_register({"ok": lambda row, call: RuntimeError()})
