"""Concurrent governed calls on PostgreSQL: one key -> one dispatch and one debit; allowance never exceeded."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import connection

from billing.models import LedgerEntry, Wallet
from mcpgateway.models import Action
from permits.models import Permit
from tests import factories
from tests.conftest import make_tenant
from tests.gateway_helpers import register_upstream, setup_caller
from tests.upstream_server import FaultUpstream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def run_threads(n: int, target) -> list:
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target(i)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_fifty_concurrent_calls_with_one_key_dispatch_and_debit_once(settings):
    with FaultUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="1")
        tenant = make_tenant("same-key")
        caller = setup_caller(tenant, balance=100)
        start = Wallet.objects.get(pk=tenant.agent.pk).balance

        bodies = run_threads(50, lambda i: caller.rpc("echo", {"n": 1}, key="one-key").json())

        receipts = set()
        in_progress = 0
        for body in bodies:
            if "result" in body:
                receipts.add(body["result"]["_meta"]["io.tollgate/receipt-id"])
            else:
                assert body["error"]["code"] == -32009, body
                assert body["error"]["data"]["error"] == "idempotency_key_in_progress"
                in_progress += 1
        assert len(receipts) == 1
        assert in_progress < 50
        assert upstream.received[f"{tenant.agent.wallet_id}:one-key"] == 1
        assert LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count() == 1
        assert Wallet.objects.get(pk=tenant.agent.pk).balance == start - 1
        assert Action.objects.filter(wallet_id=tenant.agent.wallet_id).count() == 1
        # After the dust settles every retry replays the one outcome.
        again = caller.rpc("echo", {"n": 1}, key="one-key")
        assert again["Idempotent-Replayed"] == "true"
        assert again.json()["result"]["_meta"]["io.tollgate/receipt-id"] in receipts


def test_twenty_distinct_calls_against_an_allowance_for_ten(settings):
    with FaultUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="1")
        tenant = make_tenant("allowance")
        caller = setup_caller(tenant, balance=100, max_credits="10")

        bodies = run_threads(20, lambda i: caller.rpc("echo", {"n": i}, key=f"distinct-{i}").json())

        succeeded = [b for b in bodies if "result" in b]
        denied = [b for b in bodies if "error" in b]
        assert len(succeeded) == 10
        assert len(denied) == 10
        assert {b["error"]["data"]["error"] for b in denied} == {"permit_exhausted"}
        assert {b["error"]["data"]["outcome"] for b in denied} == {"denied"}
        assert sum(upstream.received.values()) == 10
        permit = Permit.objects.get(pk=caller.permit_id)
        assert permit.spent_credits == Decimal(10)
        assert LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count() == 10


def test_a_governed_call_whose_refill_was_unforeseen_is_claimed_again_with_the_refill(settings):
    """The governed call shares the debit: a concurrent charge that brings the wallet near its refill
    threshold while the claim waits makes billing_debit refuse with 40001 (its locks did not take the
    parent); phase 1 runs again, locks the parent, posts the refill and dispatches once."""
    from tests.test_billing_charge_fn import charge_held_open, wait_for_a_lock_wait

    with FaultUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="6")
        tenant = make_tenant("unforeseen-refill")
        caller = setup_caller(tenant, balance=10)
        factories.top_up(tenant.sponsor, 100)  # the refill's payer
        Wallet.objects.filter(pk=tenant.agent.pk).update(refill_threshold=Decimal("1"), refill_amount=Decimal("20"))
        release = threading.Event()
        holder = charge_held_open(Wallet.objects.get(pk=tenant.agent.pk), "6", release)  # 10 -> 4, held
        answer: dict = {}

        def call() -> None:
            try:
                answer["body"] = caller.rpc("echo", {"n": 1}, key="late").json()
            finally:
                connection.close()

        waiter = threading.Thread(target=call)
        waiter.start()
        wait_for_a_lock_wait()
        release.set()
        holder.join(30)
        waiter.join(60)
        assert "result" in answer["body"], answer
        assert answer["body"]["result"]["_meta"]["io.tollgate/outcome"] == "success", answer
        assert upstream.received[f"{tenant.agent.wallet_id}:late"] == 1
        agent = Wallet.objects.get(pk=tenant.agent.pk)
        assert agent.balance == Decimal("18")  # 10 - 6 (held) + 20 (refill) - 6 (the call)
        assert LedgerEntry.objects.filter(wallet=agent, kind="refill").count() == 1
        assert Action.objects.filter(wallet=agent).count() == 1


def test_concurrent_calls_cannot_pass_a_policys_daily_cap_together(settings):
    """Authorization reads the spend a policy caps before any lock; the claim checks the cap again after
    the debit, under the wallet's lock. Four calls authorized while the wallet is held, with room for two
    under the cap: two are claimed, two are denied by the policy, and the cap holds."""
    from django.db import transaction

    from billing.services import ledger_debit
    from permits.services import policy_create
    from tests.test_billing_charge_fn import held_open, wait_for_a_lock_wait

    with FaultUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="1")
        tenant = make_tenant("daily-cap-race")
        caller = setup_caller(tenant, balance=50)
        policy = policy_create(wallet=tenant.agent, max_daily_credits=Decimal("10"))
        with transaction.atomic():
            ledger_debit(wallet=tenant.agent.wallet_id, amount=Decimal("8"), service_category="compute")
        release = threading.Event()
        holder = held_open(lambda: Wallet.objects.select_for_update(no_key=True).get(pk=tenant.agent.pk), release)
        bodies: list = [None] * 4

        def call(i: int) -> None:
            try:
                bodies[i] = caller.rpc("echo", {"n": i}, key=f"cap-{i}").json()
            finally:
                connection.close()

        callers = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for thread in callers:
            thread.start()
        wait_for_a_lock_wait(count=4)  # all four authorized on a spend of 8, each waiting for the wallet
        release.set()
        holder.join(30)
        for thread in callers:
            thread.join(60)

        succeeded = [body for body in bodies if "result" in body]
        denied = [body for body in bodies if "error" in body]
        assert len(succeeded) == 2, bodies
        assert len(denied) == 2, bodies
        for body in denied:
            data = body["error"]["data"]
            assert (data["error"], data["rule"], data["policy_id"]) == (
                "policy_denied",
                "max_daily_credits",
                policy.policy_id,
            )
        charges = LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge")
        assert sum(-entry.amount for entry in charges) == Decimal("10")
        assert sum(upstream.received.values()) == 2
