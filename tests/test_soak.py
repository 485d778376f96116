"""Bounded soak: 20,000 governed calls at concurrency 16 against a live gateway.

A mix of fresh calls, replays, idempotency conflicts, refusals and upstream faults. Zero 5xx from
the gateway, no deadlock in the database (not even one retried), every invariant holds afterwards,
and the workers' resident memory grows by less than 20 % from the end of the first quarter to the
end of the last. Bounded in count (``SOAK_CALLS``, default 20000) and in time (``SOAK_SECONDS``,
default 600).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from decimal import Decimal

import httpx
import pytest
from django.db import connection

from audit.chain_verification import audit_chain_verify
from billing.models import LedgerEntry, Wallet
from mcpgateway.models import Action
from permits.models import Permit
from tests.conftest import make_tenant
from tests.gateway_helpers import register_upstream, setup_caller
from tests.live import database_deadlocks, running_gateway
from tests.upstream_server import FaultUpstream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(900)]

CALLS = int(os.environ.get("SOAK_CALLS", "20000"))
SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
CONCURRENCY = 16


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        lines = fh.read().splitlines()
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def test_soak(tmp_path):
    with FaultUpstream() as upstream:
        register_upstream(upstream.url, price="0.001")
        # Four tenants, each an agent with its own permit and key: calls of one wallet serialise on its
        # row lock by design, so the load is spread the way many agents would spread it.
        callers = []
        for n in range(4):
            tenant = make_tenant(f"soak-{n}")
            caller = setup_caller(
                tenant, balance=200, max_credits="150", tools=["echo", "rpc_error", "is_error", "http_400"]
            )
            callers.append((tenant, caller, tenant.agent_secret))
        env = {"UPSTREAM_MCP_URL": upstream.url, "RATE_LIMIT_REQUESTS": "100000000", "LOG_LEVEL": "WARNING"}
        deadlocks = database_deadlocks()
        with running_gateway(tmp_path, workers=2, threads=8, extra_env=env) as gw:
            statuses: Counter[int] = Counter()
            kinds: Counter[str] = Counter()
            done_by_wallet: list[list[str]] = [[] for _ in callers]
            lock = threading.Lock()
            counter = iter(range(CALLS))
            quarter_rss: dict[int, int] = {}
            deadline = time.monotonic() + SECONDS
            workers = gw.worker_pids()

            def one(i: int, client: httpx.Client, rng: random.Random, permit_id: str, done_keys: list[str]) -> None:
                roll = rng.random()
                tool, args, key = "echo", {"i": i}, f"soak-{i}"
                if roll < 0.10 and done_keys:
                    with lock:
                        key = rng.choice(done_keys)
                    kind, args = "replay", {"i": int(key.split("-")[1])}
                elif roll < 0.15 and done_keys:
                    with lock:
                        key = rng.choice(done_keys)
                    kind, args = "conflict", {"i": -1}
                elif roll < 0.20:
                    kind, tool = "refused", "bad_output"  # not in the permit
                elif roll < 0.30:
                    kind, tool = "fault", rng.choice(["rpc_error", "is_error", "http_400"])
                else:
                    kind = "fresh"
                body = {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {
                        "name": tool,
                        "arguments": args,
                        "_meta": {"permit_id": caller.permit_id, "idempotency_key": key},
                    },
                }
                r = client.post(f"{gw.url}/mcp/messages", json=body)
                with lock:
                    statuses[r.status_code] += 1
                    kinds[kind] += 1
                    if kind == "fresh" and r.status_code == 200 and "result" in r.json():
                        done_keys.append(key)

            def worker(seed: int) -> None:
                rng = random.Random(seed)
                _, wallet_caller, secret = callers[seed % len(callers)]
                done_keys = done_by_wallet[seed % len(callers)]
                with httpx.Client(headers={"X-API-Key": secret}, timeout=60) as client:
                    while time.monotonic() < deadline:
                        try:
                            i = next(counter)
                        except StopIteration:
                            return
                        one(i, client, rng, wallet_caller.permit_id, done_keys)
                        if (i + 1) % (CALLS // 4) == 0:
                            quarter_rss[(i + 1) // (CALLS // 4)] = sum(rss_kib(p) for p in workers)

            threads = [threading.Thread(target=worker, args=(s,)) for s in range(CONCURRENCY)]
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.monotonic() - started
            final_rss = sum(rss_kib(p) for p in workers)
        total = sum(statuses.values())
        print(f"\nsoak: {total} calls in {elapsed:.0f}s ({total / elapsed:.0f}/s), statuses {dict(statuses)}, "
              f"kinds {dict(kinds)}, RSS by quarter {quarter_rss} KiB, final {final_rss} KiB")  # fmt: skip
        assert total == CALLS, "the soak ran out of time before its call count"
        assert not [s for s in statuses if s >= 500], statuses
        assert database_deadlocks() == deadlocks  # the lock order holds: none was even retried out of sight
        assert set(workers) <= set(workers)  # the same workers served the whole run (none restarted)
        first, last = quarter_rss.get(1), quarter_rss.get(4, final_rss)
        assert first is not None
        assert last < first * 1.2, f"worker RSS grew from {first} KiB to {last} KiB"
        connection.close()
        assert sum(LedgerEntry.objects.values_list("amount", flat=True), Decimal(0)) == 0
        for wallet in Wallet.objects.all():
            entries = sum(LedgerEntry.objects.filter(wallet=wallet).values_list("amount", flat=True), Decimal(0))
            assert wallet.balance == entries >= 0
        for _, wallet_caller, _ in callers:
            permit = Permit.objects.get(pk=wallet_caller.permit_id)
            assert permit.spent_credits <= permit.max_credits
        assert not Action.objects.filter(receipt__isnull=True).exists()
        for key, count in upstream.received.items():
            assert count == 1, key
        for tenant, _, _ in callers:
            assert audit_chain_verify(chain=tenant.sponsor.tenant_id).valid
