"""Races on real PostgreSQL with real threads (each thread has its own connection)."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.db.models import Sum

from billing import services
from billing.exceptions import InsufficientFunds, SpendRefused
from billing.models import ChargeIdempotency, LedgerEntry, Wallet
from common.errors import ApplicationError
from tests import factories
from tests.conftest import client_for

D = Decimal
pytestmark = pytest.mark.django_db(transaction=True)


def run_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run ``target(i)`` in ``count`` threads started together; return results (or exceptions) by index."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = target(i)
        except Exception as exc:  # collected and asserted by the test
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def post_charge(secret: str, wallet_id: str, key: str, units: str, category: str = "compute") -> tuple[int, str]:
    r = client_for(secret).post(
        f"/v1/billing/charge?wallet_id={wallet_id}&service_category={category}&units={units}",
        HTTP_IDEMPOTENCY_KEY=key,
    )
    body = r.json()
    code = body["detail"]["error"] if isinstance(body.get("detail"), dict) else ""
    return r.status_code, code or r.get("Idempotent-Replayed", "first")


def test_one_idempotency_key_fifty_threads_one_debit(tenant):
    factories.top_up(tenant.agent, 100)
    results = run_threads(50, lambda i: post_charge(tenant.agent_secret, tenant.agent.wallet_id, "same", "1"))
    statuses = Counter(results)
    assert statuses[(200, "first")] == 1, statuses
    assert set(statuses) <= {(200, "first"), (200, "true"), (409, "idempotency_key_in_progress")}, statuses
    assert LedgerEntry.objects.filter(wallet=tenant.agent, kind="charge").count() == 1
    assert ChargeIdempotency.objects.filter(wallet=tenant.agent).count() == 1
    tenant.agent.refresh_from_db()
    assert tenant.agent.balance == D("99")


def test_balance_ten_twenty_charges_of_one(tenant):
    factories.top_up(tenant.agent, 10)
    results = run_threads(20, lambda i: post_charge(tenant.agent_secret, tenant.agent.wallet_id, f"k{i}", "1"))
    statuses = Counter(status for status, _ in results)
    assert statuses == {200: 10, 402: 10}, results
    tenant.agent.refresh_from_db()
    assert tenant.agent.balance == 0
    assert LedgerEntry.objects.filter(wallet=tenant.agent, kind="charge").count() == 10


def test_velocity_under_concurrency(tenant):
    factories.top_up(tenant.agent, 1200)
    services.wallet_charge(wallet=tenant.agent, service_category="compute", units=990)
    results = run_threads(20, lambda i: post_charge(tenant.agent_secret, tenant.agent.wallet_id, f"v{i}", "5"))
    accepted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    assert len(accepted) == 2, results  # 995 and 1000; the next would be above 1000
    assert all(r == (403, "wallet_frozen") for r in refused), results
    spent = -LedgerEntry.objects.filter(wallet=tenant.agent, kind="charge").aggregate(t=Sum("amount"))["t"]
    assert spent == D("1000")
    tenant.agent.refresh_from_db()
    assert tenant.agent.status == "frozen"
    from audit.models import Alert

    assert Alert.objects.filter(wallet_id=tenant.agent.wallet_id, kind="wallet_frozen_velocity").count() == 1
    assert post_charge(tenant.agent_secret, tenant.agent.wallet_id, "later", "0.01") == (403, "wallet_frozen")


def snapshot_check() -> dict[str, Decimal]:
    """In one consistent snapshot: all accounts sum to zero, no balance is negative, balances equal entries."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cursor.execute("SELECT COALESCE(SUM(amount), 0) FROM billing_ledger_entry")
        (total,) = cursor.fetchone()
        assert total == 0
        cursor.execute(
            """
            SELECT w.wallet_id, w.balance, COALESCE(SUM(e.amount), 0)
              FROM billing_wallet w LEFT JOIN billing_ledger_entry e ON e.wallet_id = w.wallet_id
             GROUP BY w.wallet_id, w.balance
            """
        )
        balances = {}
        for wallet_id, balance, entries in cursor.fetchall():
            assert balance >= 0, wallet_id
            assert balance == entries, (wallet_id, balance, entries)
            balances[wallet_id] = balance
        return balances


def test_conservation_under_random_funds_and_charges():
    sponsor = factories.make_sponsor("acme", 20_000)
    agents = [factories.make_wallet(sponsor, f"a{i}", 200) for i in range(3)]
    for i in range(3):
        factories.make_wallet(agents[i], f"c{i}", 20)
    # One refilling child to exercise parent-then-child locking on debits too.
    services.wallet_create_agent(
        parent=agents[0], name="refiller", initial_balance=5, refill_threshold=D("2"), refill_amount=D("3")
    )
    wallets = list(Wallet.objects.order_by("path"))
    assert len(wallets) == 8
    total_ops, threads = 5000, 16
    per_thread = total_ops // threads
    stop = threading.Event()
    checks: list[int] = []

    def checker() -> None:
        try:
            while not stop.is_set():
                snapshot_check()
                checks.append(1)
                stop.wait(0.2)
        finally:
            connections.close_all()

    def worker(i: int) -> Counter[str]:
        rng = random.Random(i)
        outcomes: Counter[str] = Counter()
        for _ in range(per_thread):
            wallet = rng.choice(wallets)
            op = rng.random()
            try:
                if op < 0.35 and wallet.parent_id is not None:
                    parent = next(w for w in wallets if w.wallet_id == wallet.parent_id)
                    services.wallet_fund(source=parent, target=wallet, amount=D(rng.randint(1, 300)) / 100)
                    outcomes["fund"] += 1
                elif op < 0.40:
                    services.wallet_provision(wallet=sponsor, amount=D(rng.randint(1, 500)) / 100)
                    outcomes["provision"] += 1
                else:
                    services.wallet_charge(wallet=wallet, service_category="tooling", units=D(rng.randint(1, 200)) / 10)
                    outcomes["charge"] += 1
            except InsufficientFunds:
                outcomes["insufficient"] += 1
            except SpendRefused as exc:
                outcomes[exc.code] += 1
            except ApplicationError as exc:
                outcomes[exc.code] += 1
        return outcomes

    watcher = threading.Thread(target=checker)
    watcher.start()
    try:
        results = run_threads(threads, worker)
    finally:
        stop.set()
        watcher.join(timeout=60)
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    totals: Counter[str] = sum(results, Counter())
    assert sum(totals.values()) == per_thread * threads
    assert totals["charge"] > 1000, totals
    assert totals["fund"] > 500, totals
    assert set(totals) <= {"fund", "provision", "charge", "insufficient"}, totals
    assert checks, "the checker never ran"
    snapshot_check()
