"""A hypothesis state machine over wallets, charges, permits and refunds, calling the services directly.

Rules create agent and child wallets, provision, fund, charge (``wallet_charge``),
refund charges (``wallet_refund``), freeze and unfreeze, issue permits and
reserve or release against them (``permit_reserve`` / ``permit_release``, in a
transaction like the gateway's phase 1, together with a debit). Refusals (402,
403, 409: insufficient funds, frozen, budget, daily limit, velocity, refund
beyond the charge, exhausted permit) are expected outcomes: the machine records
them and checks that a refusal changed nothing. After every step:

* the ledger sums to zero (every ``billing_ledger_entry.amount``);
* no wallet balance is negative;
* each wallet's balance equals the sum of its entries, and each entry's
  ``balance_after`` matches the running sum;
* each transaction's entries sum to zero;
* a permit never has ``spent_credits`` above ``max_credits``, nor negative
  spend or calls;
* no subtree ever spends beyond the limits of any of its agent ancestors
  (budget, daily limit, hourly velocity), counted from the ledger itself;
* no charge posts on a wallet while it or an ancestor is frozen (checked by the
  charge rule against the state before the step).

Agents have children with their own balances, so the machine tries what an agent
would try to escape its limits: create a child, fund it, charge it, and charge a
child whose parent was frozen.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from billing import services as billing
from billing.exceptions import VelocityLimitExceeded
from billing.models import ZERO, LedgerEntry, LedgerKind, ServiceCategory, Wallet, WalletStatus
from common.errors import ApplicationError
from permits import services as permit_services
from permits.models import Permit

pytestmark = pytest.mark.django_db

_names = itertools.count(1)
STATS: Counter[str] = Counter()
AMOUNTS = st.decimals(min_value=Decimal("0.01"), max_value=Decimal("400"), places=2)
SMALL = st.decimals(min_value=Decimal("0.01"), max_value=Decimal("60"), places=2)
# 402, 403, 409: refusals the services are expected to raise.
EXPECTED_REFUSALS = (402, 403, 409)


def _fresh(wallet: Wallet) -> Wallet:
    return Wallet.objects.get(pk=wallet.pk)


class LedgerMachine(RuleBasedStateMachine):
    spenders = Bundle("spenders")  # agent and child wallets
    charges = Bundle("charges")
    permits = Bundle("permits")

    def __init__(self) -> None:
        super().__init__()
        self.sponsor = billing.wallet_create_sponsor(name=f"sm-{next(_names)}", initial_credits=Decimal("1000"))

    # -- helpers ------------------------------------------------------------------------------

    def _state(self) -> list[tuple[str, Decimal, str]]:
        return list(
            Wallet.objects.filter(tenant_id=self.sponsor.tenant_id)
            .order_by("wallet_id")
            .values_list("wallet_id", "balance", "status")
        )

    def _refused(self, exc: ApplicationError, before: Any) -> None:
        assert exc.http_status in EXPECTED_REFUSALS, f"unexpected {exc.http_status} {exc.code}"
        STATS[f"refused:{exc.code}"] += 1
        if not isinstance(exc, VelocityLimitExceeded):  # a velocity refusal freezes the wallet, by design
            assert self._state() == before, f"refusal {exc.code} changed balances or statuses"

    # -- wallets and money -------------------------------------------------------------------

    @initialize(
        target=spenders,
        budget=st.none() | st.decimals(min_value=50, max_value=400, places=2),
        daily_limit=st.none() | st.decimals(min_value=20, max_value=300, places=2),
    )
    def first_agents(self, budget: Decimal | None, daily_limit: Decimal | None) -> Any:
        """Two funded agents (one with refills from the sponsor) and a child, so every rule can fire from step one."""
        a = billing.wallet_create_agent(
            parent=self.sponsor, name="a1", initial_balance=Decimal(300), budget=budget, daily_limit=daily_limit
        )
        b = billing.wallet_create_agent(
            parent=self.sponsor,
            name="a2",
            initial_balance=Decimal(100),
            refill_threshold=Decimal(20),
            refill_amount=Decimal(50),
        )
        c = billing.wallet_create_agent(parent=a, name="c1", initial_balance=Decimal(50))
        return multiple(a, b, c)

    @rule(
        target=spenders,
        amount=st.one_of(st.just(Decimal(0)), AMOUNTS),
        budget=st.one_of(st.none(), st.none(), st.decimals(min_value=10, max_value=400, places=2)),
    )
    def create_agent(self, amount: Decimal, budget: Decimal | None) -> Any:
        before = self._state()
        try:
            return billing.wallet_create_agent(
                parent=self.sponsor, name=f"agent-{next(_names)}", initial_balance=amount, budget=budget
            )
        except ApplicationError as exc:
            self._refused(exc, before)
            return multiple()

    @rule(target=spenders, parent=spenders, amount=st.one_of(st.just(Decimal(0)), SMALL))
    def create_child(self, parent: Wallet, amount: Decimal) -> Any:
        parent = _fresh(parent)
        if parent.wallet_type != "agent":
            return multiple()
        before = self._state()
        try:
            return billing.wallet_create_agent(parent=parent, name=f"child-{next(_names)}", initial_balance=amount)
        except ApplicationError as exc:
            self._refused(exc, before)
            return multiple()

    @initialize(target=charges)
    def first_charge(self) -> LedgerEntry:
        """A charge to refund from step one (on its own funded agent)."""
        agent = billing.wallet_create_agent(parent=self.sponsor, name="a0", initial_balance=Decimal(100))
        assert (
            billing.wallet_charge(wallet=agent, service_category=ServiceCategory.OTHER, units=Decimal(10)).status == 200
        )
        entry = LedgerEntry.objects.get(wallet=agent, kind=LedgerKind.CHARGE)
        return entry

    @initialize(target=permits)
    def first_permit(self) -> Permit:
        """A permit on its own funded agent, to reserve against from step one."""
        agent = billing.wallet_create_agent(parent=self.sponsor, name="p0", initial_balance=Decimal(100))
        return self._issue(agent, Decimal(50))

    @rule(amount=AMOUNTS)
    def provision(self, amount: Decimal) -> None:
        billing.wallet_provision(wallet=self.sponsor, amount=amount)

    @rule(child=spenders, amount=SMALL)
    def fund(self, child: Wallet, amount: Decimal) -> None:
        child = _fresh(child)
        assert child.parent is not None
        before = self._state()
        try:
            billing.wallet_fund(source=child.parent, target=child, amount=amount)
        except ApplicationError as exc:
            self._refused(exc, before)

    @rule(
        target=charges,
        wallet=spenders,
        units=st.one_of(
            st.decimals(min_value=Decimal("0.5"), max_value=Decimal("40"), places=1),
            st.decimals(min_value=Decimal("40"), max_value=Decimal("600"), places=1),  # budgets, funds, velocity
        ),
        category=st.sampled_from([ServiceCategory.OTHER, ServiceCategory.TOOLING, ServiceCategory.COMPUTE]),
    )
    def charge(self, wallet: Wallet, units: Decimal, category: str) -> Any:
        before = self._state()
        line = _fresh(wallet).ancestry
        stopped = Wallet.objects.filter(wallet_id__in=line).exclude(status=WalletStatus.ACTIVE).exists()
        try:
            outcome = billing.wallet_charge(wallet=_fresh(wallet), service_category=category, units=units)
        except ApplicationError as exc:
            self._refused(exc, before)
            if stopped:
                STATS["refused_below_a_stopped_wallet"] += 1
            return multiple()
        assert outcome.status == 200
        assert not stopped, f"{wallet.wallet_id} was charged while it or an ancestor was frozen or closed"
        STATS["charged"] += 1
        entry = (
            LedgerEntry.objects.filter(wallet_id=wallet.wallet_id, kind=LedgerKind.CHARGE)
            .order_by("-created_at", "-entry_id")
            .first()
        )
        assert entry is not None
        return entry

    @rule(charge=charges, fraction=st.sampled_from([Decimal("0.25"), Decimal("0.5"), Decimal("1"), Decimal("2")]))
    def refund(self, charge: LedgerEntry, fraction: Decimal) -> None:
        amount = (-charge.amount * fraction).quantize(Decimal("0.00000001"))
        refunded_before = LedgerEntry.objects.filter(refund_of=charge, account=charge.wallet_id).aggregate(
            t=Sum("amount")
        )["t"] or Decimal(0)
        before = self._state()
        try:
            billing.wallet_refund(amount=amount, charge=charge)
        except ApplicationError as exc:
            self._refused(exc, before)
            assert (
                refunded_before + amount > -charge.amount
                or Wallet.objects.get(pk=charge.wallet_id).status == WalletStatus.CLOSED
            )
            return
        refunded = LedgerEntry.objects.filter(refund_of=charge, account=charge.wallet_id).aggregate(t=Sum("amount"))[
            "t"
        ]
        assert refunded <= -charge.amount, "refunds exceed the charge"
        STATS["refunded"] += 1

    @rule(wallet=spenders)
    def freeze(self, wallet: Wallet) -> None:
        try:
            billing.wallet_freeze(wallet=_fresh(wallet), reason="state machine")
        except ApplicationError as exc:
            self._refused(exc, self._state())

    @rule(wallet=spenders)
    def unfreeze(self, wallet: Wallet) -> None:
        if _fresh(wallet).status != WalletStatus.FROZEN:
            return
        before = self._state()
        try:
            billing.wallet_unfreeze(wallet=_fresh(wallet))
        except ApplicationError as exc:
            self._refused(exc, before)

    # -- permits -----------------------------------------------------------------------------

    @rule(target=permits, wallet=spenders, max_credits=st.decimals(min_value=1, max_value=80, places=2))
    def issue_permit(self, wallet: Wallet, max_credits: Decimal) -> Permit:
        return self._issue(wallet, max_credits)

    def _issue(self, wallet: Wallet, max_credits: Decimal) -> Permit:
        wallet = _fresh(wallet)
        issued = permit_services.permit_issue(
            terms=permit_services.PermitTerms(
                wallet=wallet,
                issuer_wallet=wallet.parent,
                allowed_tools=["*"],
                max_credits=max_credits,
                max_calls=None,
                expires_at=timezone.now() + timedelta(hours=1),
            ),
            idempotency_scope="state-machine",
            idempotency_key=f"sm-{next(_names)}",
            request_hash="0" * 64,
        )
        return issued.permit

    @rule(permit=permits, amount=SMALL)
    def reserve_and_debit(self, permit: Permit, amount: Decimal) -> None:
        """What the gateway's phase 1 does: reserve against the permit, then debit, in one transaction."""
        before = (self._state(), self._permit_row(permit))
        try:
            with transaction.atomic():
                permit_services.permit_reserve(permit=permit, amount=amount)
                billing.ledger_debit(wallet=permit.wallet_id, amount=amount, service_category="tooling")
        except VelocityLimitExceeded as exc:
            billing.wallet_freeze_for_velocity(exc=exc)
            STATS[f"refused:{exc.code}"] += 1
            assert self._permit_row(permit) == before[1], "a refused debit kept its permit reservation"
            return
        except ApplicationError as exc:
            self._refused(exc, before[0])
            refused = True
        else:
            refused = False
        if refused:
            assert self._permit_row(permit) == before[1], "a refusal kept its permit reservation"
            return
        STATS["reserved"] += 1

    @rule(permit=permits, amount=SMALL)
    def release(self, permit: Permit, amount: Decimal) -> None:
        with transaction.atomic():
            permit_services.permit_release(permit_id=permit.permit_id, amount=amount)

    def _permit_row(self, permit: Permit) -> tuple[Decimal, int]:
        row = Permit.objects.get(pk=permit.pk)
        return row.spent_credits, row.calls_used

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def ledger_sums_to_zero(self) -> None:
        total = LedgerEntry.objects.aggregate(t=Sum("amount"))["t"] or ZERO
        assert total == ZERO, f"the ledger sums to {total}"
        unbalanced = (
            LedgerEntry.objects.values("transaction_id")
            .annotate(t=Sum("amount"))
            .exclude(t=ZERO)
            .values_list("transaction_id", "t")
        )
        assert not list(unbalanced), f"unbalanced transactions: {list(unbalanced)[:5]}"

    @invariant()
    def balances_match_entries(self) -> None:
        for wallet in Wallet.objects.filter(tenant_id=self.sponsor.tenant_id):
            assert wallet.balance >= 0, f"{wallet.wallet_id} is negative: {wallet.balance}"
            entries = list(LedgerEntry.objects.filter(wallet=wallet).order_by("created_at", "entry_id"))
            assert wallet.balance == sum((e.amount for e in entries), ZERO), f"{wallet.wallet_id} != its entries"
            stamps = [e.created_at for e in entries]
            if len(set(stamps)) == len(stamps):
                running = ZERO
                for e in entries:
                    running += e.amount
                    assert e.balance_after == running, f"{e.entry_id}: balance_after {e.balance_after} != {running}"

    @invariant()
    def subtrees_within_agent_limits(self) -> None:
        now = timezone.now()
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        for agent in Wallet.objects.filter(tenant_id=self.sponsor.tenant_id, wallet_type="agent"):
            spend = LedgerEntry.objects.filter(
                wallet__path__startswith=agent.path, kind__in=[LedgerKind.CHARGE, LedgerKind.REFUND]
            )
            lifetime = -(spend.aggregate(t=Sum("amount"))["t"] or ZERO)
            last_hour = -(
                spend.filter(created_at__gte=now - timedelta(hours=1)).aggregate(t=Sum("amount"))["t"] or ZERO
            )
            today = -(spend.filter(created_at__gte=midnight).aggregate(t=Sum("amount"))["t"] or ZERO)
            if agent.budget is not None:
                assert lifetime <= agent.budget, (
                    f"subtree of {agent.wallet_id} spent {lifetime} > budget {agent.budget}"
                )
            if agent.daily_limit is not None:
                assert today <= agent.daily_limit, f"subtree of {agent.wallet_id} spent {today} today"
            assert last_hour <= billing.VELOCITY_HOUR_LIMIT, f"subtree of {agent.wallet_id}: {last_hour} in an hour"
            assert agent.total_spent == max(lifetime, ZERO), f"{agent.wallet_id}: total_spent != subtree spend"

    @invariant()
    def permits_within_allowance(self) -> None:
        for permit in Permit.objects.filter(tenant_id=self.sponsor.tenant_id):
            assert ZERO <= permit.spent_credits <= permit.max_credits, permit.permit_id
            assert permit.calls_used >= 0, permit.permit_id


def test_ledger_state_machine():
    STATS.clear()
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(f"ledger state machine: {dict(sorted(STATS.items()))}")
    # The run exercised the paths it is about: successful charges, refunds and reservations, and refusals.
    assert STATS["charged"] > 0
    assert STATS["refunded"] > 0
    assert STATS["reserved"] > 0
    assert sum(n for name, n in STATS.items() if name.startswith("refused:")) > 0
