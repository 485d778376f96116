"""Concurrent governed calls on PostgreSQL: one key -> one dispatch and one debit; allowance never exceeded."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import connection

from billing.models import LedgerEntry, Wallet
from mcpgateway.models import Action
from permits.models import Permit
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
