"""The ledger as worked examples: provision, fund, charge, refund, refill, freeze, close.

Each example ends in asserted balances and ledger entries.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, InternalError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from audit.models import Alert, AuditEvent
from billing import selectors, services
from billing.exceptions import (
    BudgetExceeded,
    DailyLimitExceeded,
    InsufficientFunds,
    RefundExceedsCharge,
    WalletClosed,
    WalletExpired,
    WalletFrozen,
    WalletHasOpenChildren,
)
from billing.models import LedgerEntry, Wallet, WalletStatus
from tests import factories

D = Decimal


def books_balance() -> None:
    """The whole ledger balances and every wallet's balance is the sum of its entries."""
    assert LedgerEntry.objects.aggregate(t=Sum("amount"))["t"] in (None, D(0))
    for wallet in Wallet.objects.all():
        assert wallet.balance >= 0
        assert wallet.balance == selectors.account_balance(wallet.wallet_id), wallet.wallet_id


def entries(wallet: Wallet) -> list[tuple[str, Decimal, Decimal | None]]:
    """(kind, amount, balance_after) of a wallet's entries, oldest first."""
    qs = LedgerEntry.objects.filter(wallet=wallet).order_by("created_at", "entry_id")
    return [(e.kind, e.amount, e.balance_after) for e in qs]


def refreshed(wallet: Wallet) -> Wallet:
    wallet.refresh_from_db()
    return wallet


@pytest.mark.django_db
def test_provision_fund_charge_refund():
    sponsor = services.wallet_create_sponsor(name="acme")
    services.wallet_provision(wallet=sponsor, amount=1000)
    agent = services.wallet_create_agent(parent=sponsor, name="bot", initial_balance=D("100"))
    child = services.wallet_create_agent(parent=agent, name="sub", initial_balance=D("10"))
    assert agent.wallet_id.startswith("agt_")
    assert child.wallet_id.startswith("chd_")
    assert child.wallet_type == "child"
    assert child.tenant_id == sponsor.wallet_id

    outcome = services.wallet_charge(wallet=agent, service_category="compute", units=D("3"))
    assert outcome.body["amount"] == "3.00000000"
    assert outcome.body["balance"] == "87.00000000"
    charge = LedgerEntry.objects.get(entry_id=outcome.body["entry_id"])

    services.wallet_refund(charge=charge, amount=D("1"))
    with pytest.raises(RefundExceedsCharge):
        services.wallet_refund(charge=charge, amount=D("2.5"))

    assert refreshed(sponsor).balance == D("900")
    assert refreshed(agent).balance == D("88")
    assert refreshed(child).balance == D("10")
    assert agent.total_spent == D("2")
    assert entries(sponsor) == [("provision", D("1000"), D("1000")), ("fund", D("-100"), D("900"))]
    assert entries(agent) == [
        ("fund", D("100"), D("100")),
        ("fund", D("-10"), D("90")),
        ("charge", D("-3"), D("87")),
        ("refund", D("1"), D("88")),
    ]
    assert selectors.account_balance("mint") == D("-1000")
    assert selectors.account_balance("revenue") == D("2")
    assert selectors.wallet_spend(agent).today == D("2")
    books_balance()
    kinds = list(AuditEvent.objects.filter(tenant_id=sponsor.wallet_id).values_list("event", flat=True))
    for movement in ("ledger.provision", "ledger.fund", "ledger.charge", "ledger.refund"):
        assert movement in kinds


@pytest.mark.django_db
def test_charge_price_is_category_price_times_units():
    services.category_price_set(category="search", credits_per_unit=D("0.25"))
    agent = factories.make_wallet(factories.make_sponsor("acme", 50), "bot", 20)
    outcome = services.wallet_charge(wallet=agent, service_category="search", units=D("2.5"))
    assert outcome.body["unit_price"] == "0.25000000"
    assert outcome.body["amount"] == "0.62500000"
    assert refreshed(agent).balance == D("19.375")
    books_balance()


@pytest.mark.django_db
def test_insufficient_funds_changes_nothing():
    sponsor = factories.make_sponsor("acme", 5)
    with pytest.raises(InsufficientFunds) as err:
        services.wallet_create_agent(parent=sponsor, initial_balance=D("6"))
    assert err.value.as_detail()["shortfall"] == "1.00000000"
    agent = factories.make_wallet(sponsor, "bot", 5)
    with pytest.raises(InsufficientFunds) as err:
        services.wallet_charge(wallet=agent, service_category="compute", units=D("7"))
    detail = err.value.as_detail()
    assert detail == {
        "error": "insufficient_funds",
        "message": detail["message"],
        "wallet_id": agent.wallet_id,
        "balance": "5.00000000",
        "required": "7.00000000",
        "shortfall": "2.00000000",
    }
    assert refreshed(agent).balance == D("5")
    assert entries(agent) == [("fund", D("5"), D("5"))]
    books_balance()


@pytest.mark.django_db
def test_auto_refill_from_parent():
    sponsor = factories.make_sponsor("acme", 100)
    agent = factories.make_wallet(sponsor, "bot", 12, refill_threshold=D("10"), refill_amount=D("50"))

    # 12 - 5 would fall under 10: 50 comes from the sponsor first.
    outcome = services.wallet_charge(wallet=agent, service_category="compute", units=5)
    assert outcome.body["refill"]["amount"] == "50.00000000"
    assert outcome.body["balance"] == "57.00000000"
    assert refreshed(sponsor).balance == D("38")
    assert entries(agent) == [
        ("fund", D("12"), D("12")),
        ("refill", D("50"), D("62")),
        ("charge", D("-5"), D("57")),
    ]
    # A charge the balance alone cannot cover succeeds when the refill covers it.
    services.wallet_provision(wallet=sponsor, amount=100)
    outcome = services.wallet_charge(wallet=refreshed(agent), service_category="compute", units=D("80"))
    assert outcome.body["balance"] == "27.00000000"
    assert refreshed(sponsor).balance == D("88")
    books_balance()


@pytest.mark.django_db
def test_no_refill_when_the_parent_cannot_pay():
    sponsor = factories.make_sponsor("acme", 12)
    agent = factories.make_wallet(sponsor, "bot", 12, refill_threshold=D("10"), refill_amount=D("50"))
    assert refreshed(sponsor).balance == 0
    outcome = services.wallet_charge(wallet=agent, service_category="compute", units=5)
    assert outcome.body["refill"] is None
    assert outcome.body["balance"] == "7.00000000"
    with pytest.raises(InsufficientFunds):
        services.wallet_charge(wallet=agent, service_category="compute", units=8)
    services.wallet_provision(wallet=sponsor, amount=50)
    outcome = services.wallet_charge(wallet=agent, service_category="compute", units=8)
    assert outcome.body["refill"]["amount"] == "50.00000000"
    assert refreshed(agent).balance == D("49")
    assert refreshed(sponsor).balance == D("0")
    books_balance()


@pytest.mark.django_db
def test_moving_credit_to_children_draws_no_refill():
    """The refill threshold is the line's (the wallet and its children): an agent that moves its credit
    to a child and charges a little is not refilled, however often it tries. Before, each round drew
    the full refill amount from the sponsor, and the agent parked it in its children."""
    sponsor = factories.make_sponsor("acme", 1000)
    agent = factories.make_wallet(sponsor, "bot", 20, refill_threshold=D("10"), refill_amount=D("50"))
    child = services.wallet_create_agent(parent=agent, name="sub")
    for _ in range(3):
        held = refreshed(agent).balance
        if held > 0:
            services.wallet_fund(source=refreshed(agent), target=child, amount=held)
        with pytest.raises(InsufficientFunds):
            services.wallet_charge(wallet=refreshed(agent), service_category="compute", units=D("0.01"))
    assert refreshed(sponsor).balance == D("980")
    assert refreshed(child).balance == D("20")
    assert not LedgerEntry.objects.filter(kind="refill").exists()
    books_balance()


@pytest.mark.django_db
def test_a_childs_refill_from_its_agent_draws_no_refill_from_the_sponsor():
    sponsor = factories.make_sponsor("acme", 1000)
    agent = factories.make_wallet(sponsor, "bot", 30, refill_threshold=D("10"), refill_amount=D("50"))
    child = services.wallet_create_agent(
        parent=agent, name="sub", initial_balance=D("1"), refill_threshold=D("1000"), refill_amount=D("25")
    )
    # The child's charge takes it under its threshold: 25 comes from the agent (30 - 1 = 29 left, 4 after).
    outcome = services.wallet_charge(wallet=child, service_category="compute", units=D("0.01"))
    assert outcome.body["refill"]["amount"] == "25.00000000"
    assert refreshed(agent).balance == D("4")
    # The agent's own small charge: the line still holds 4 + 25.99 >= 10, so the sponsor pays nothing.
    outcome = services.wallet_charge(wallet=refreshed(agent), service_category="compute", units=D("0.01"))
    assert outcome.body["refill"] is None
    assert refreshed(sponsor).balance == D("970")
    books_balance()


@pytest.mark.django_db
def test_the_line_spending_down_is_refilled():
    sponsor = factories.make_sponsor("acme", 1000)
    agent = factories.make_wallet(sponsor, "bot", 20, refill_threshold=D("10"), refill_amount=D("50"))
    child = services.wallet_create_agent(parent=agent, name="sub", initial_balance=D("15"))
    services.wallet_charge(wallet=child, service_category="compute", units=D("10"))  # the line holds 10
    outcome = services.wallet_charge(wallet=refreshed(agent), service_category="compute", units=D("1"))
    assert outcome.body["refill"]["amount"] == "50.00000000"  # 9 < 10: the line spent its credit
    assert refreshed(agent).balance == D("54")
    assert refreshed(sponsor).balance == D("930")
    books_balance()


@pytest.mark.django_db
def test_freeze_unfreeze_and_close():
    sponsor = factories.make_sponsor("acme", 100)
    agent = factories.make_wallet(sponsor, "bot", 30)
    services.wallet_freeze(wallet=agent, reason="suspicious", actor="admin:test")
    with pytest.raises(WalletFrozen):
        services.wallet_charge(wallet=agent, service_category="compute")
    with pytest.raises(WalletFrozen):
        services.wallet_create_agent(parent=agent, initial_balance=1)
    assert Alert.objects.filter(wallet_id=agent.wallet_id, kind="wallet_frozen").count() == 1
    services.wallet_unfreeze(wallet=agent)
    services.wallet_charge(wallet=agent, service_category="compute")
    assert refreshed(agent).balance == D("29")

    child = factories.make_wallet(agent, "sub", 4)
    with pytest.raises(WalletHasOpenChildren):
        services.wallet_close(wallet=agent)
    services.wallet_close(wallet=child)
    services.wallet_close(wallet=agent)
    assert refreshed(agent).status == WalletStatus.CLOSED
    assert refreshed(agent).balance == 0
    assert refreshed(sponsor).balance == D("99")
    assert entries(child)[-1] == ("return", D("-4"), D("0"))
    with pytest.raises(WalletClosed):
        services.wallet_charge(wallet=agent, service_category="compute")
    with pytest.raises(WalletClosed):
        services.wallet_fund(source=sponsor, target=agent, amount=1)
    books_balance()
    events = set(AuditEvent.objects.filter(wallet_id=agent.wallet_id).values_list("event", flat=True))
    assert {"wallet.frozen", "wallet.unfrozen", "wallet.closed", "ledger.return"} <= events


@pytest.mark.django_db
def test_expired_wallet_refuses_charges():
    sponsor = factories.make_sponsor("acme", 100)
    agent = factories.make_wallet(sponsor, "bot", 30, expires_at=timezone.now() - timedelta(seconds=1))
    assert agent.effective_status == "expired"
    with pytest.raises(WalletExpired):
        services.wallet_charge(wallet=agent, service_category="compute")


@pytest.mark.django_db
def test_budget_and_daily_limit():
    sponsor = factories.make_sponsor("acme", 100)
    agent = factories.make_wallet(sponsor, "bot", 50, budget=D("10"))
    first = services.wallet_charge(wallet=agent, service_category="compute", units=6)
    with pytest.raises(BudgetExceeded):
        services.wallet_charge(wallet=agent, service_category="compute", units=6)
    # A refund gives the budget back: spend is net of refunds.
    services.wallet_refund(charge=LedgerEntry.objects.get(entry_id=first.body["entry_id"]), amount=3)
    services.wallet_charge(wallet=agent, service_category="compute", units=6)
    assert refreshed(agent).total_spent == D("9")

    limited = factories.make_wallet(sponsor, "daily", 20, daily_limit=D("5"))
    services.wallet_charge(wallet=limited, service_category="compute", units=3)
    with pytest.raises(DailyLimitExceeded):
        services.wallet_charge(wallet=limited, service_category="compute", units=3)
    services.wallet_charge(wallet=limited, service_category="compute", units=2)
    assert selectors.wallet_spend(limited).today == D("5")
    books_balance()


@pytest.mark.django_db
def test_velocity_freezes_the_wallet_and_the_freeze_commits():
    sponsor = factories.make_sponsor("acme", 5000)
    agent = factories.make_wallet(sponsor, "bot", 2000)
    services.wallet_charge(wallet=agent, service_category="compute", units=999)
    with pytest.raises(WalletFrozen) as err:
        services.wallet_charge(wallet=agent, service_category="compute", units=2)
    assert err.value.code == "wallet_frozen"
    agent = refreshed(agent)
    assert agent.status == WalletStatus.FROZEN
    assert agent.frozen_reason.startswith("velocity")
    assert agent.balance == D("1001")
    assert Alert.objects.filter(wallet_id=agent.wallet_id, kind="wallet_frozen_velocity").count() == 1
    assert AuditEvent.objects.filter(wallet_id=agent.wallet_id, event="wallet.frozen").count() == 1
    with pytest.raises(WalletFrozen):
        services.wallet_charge(wallet=agent, service_category="compute", units=D("0.5"))
    books_balance()


@pytest.mark.django_db
def test_fund_is_parent_to_child_only():
    sponsor = factories.make_sponsor("acme", 100)
    agent = factories.make_wallet(sponsor, "a", 10)
    other = factories.make_wallet(sponsor, "b", 10)
    from common.errors import Conflict

    with pytest.raises(Conflict):
        services.wallet_fund(source=agent, target=other, amount=1)
    with pytest.raises(Conflict):
        services.wallet_fund(source=agent, target=sponsor, amount=1)
    with pytest.raises(InsufficientFunds):
        services.wallet_fund(source=sponsor, target=agent, amount=81)
    services.wallet_fund(source=sponsor, target=agent, amount=80)
    assert refreshed(sponsor).balance == 0
    assert refreshed(agent).balance == D("90")
    books_balance()


@pytest.mark.django_db
def test_prices():
    assert selectors.price_for_category("compute") == D("1")
    assert selectors.tool_price("partner.notes.write") is None
    services.tool_price_set(tool="partner.notes.write", credits=D("0.3"))
    assert selectors.tool_price("partner.notes.write") == D("0.3")
    services.tool_price_set(tool="partner.notes.write", credits=None)
    assert selectors.tool_price("partner.notes.write") is None
    assert AuditEvent.objects.filter(event="pricing.tool_price_set").count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_an_unbalanced_transaction_and_edits():
    sponsor = factories.make_sponsor("acme", 10)
    with pytest.raises((IntegrityError, InternalError)), transaction.atomic():
        LedgerEntry.objects.create(
            entry_id="led_unbalanced",
            transaction_id="ltx_unbalanced",
            tenant_id=sponsor.tenant_id,
            account="mint",
            counterparty="revenue",
            kind="provision",
            amount=D("5"),
        )
    assert not LedgerEntry.objects.filter(entry_id="led_unbalanced").exists()
    entry = LedgerEntry.objects.filter(wallet=sponsor).first()
    assert entry is not None
    for sql in (
        "UPDATE billing_ledger_entry SET amount = 11 WHERE entry_id = %s",
        "DELETE FROM billing_ledger_entry WHERE entry_id = %s",
    ):
        with pytest.raises((IntegrityError, InternalError)), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [entry.entry_id])
    with pytest.raises(IntegrityError), transaction.atomic():
        Wallet.objects.filter(pk=sponsor.pk).update(balance=D("-1"))
    assert connection.in_atomic_block is False
    books_balance()
