"""Two gunicorn instances sharing PostgreSQL and Redis: invariants hold, rate limits are shared.

Needs Debian's redis-server (started here on a loopback port). Skipped with a message when it is
missing, except under CI=true, where a missing redis-server is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import pytest
from django.db import connection

from audit.chain_verification import audit_chain_verify
from billing.models import LedgerEntry, Wallet
from mcpgateway.models import Action
from permits.models import Permit
from tests import factories
from tests.conftest import make_tenant
from tests.gateway_helpers import register_upstream, setup_caller
from tests.live import running_gateway
from tests.upstream_server import FaultUpstream, free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def redis_url(tmp_path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server not found (install the Debian package 'redis-server')"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        import socket

        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def rpc(base: str, secret: str, permit_id: str, key: str, n: int) -> dict:
    body = {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"n": n}, "_meta": {"permit_id": permit_id, "idempotency_key": key}},
    }
    r = httpx.post(f"{base}/mcp/messages", json=body, headers={"X-API-Key": secret}, timeout=30)
    assert r.status_code < 500, r.text
    return r.json()


def test_two_instances_share_limits_and_keep_every_invariant(tmp_path, redis_url):
    with FaultUpstream() as upstream:
        register_upstream(upstream.url, price="0.5")
        tenant = make_tenant("scale")
        caller = setup_caller(tenant, balance=300, max_credits="200")
        load_keys = [factories.make_key(tenant.agent).secret for _ in range(4)]
        # A wallet line of its own: the load's 200 calls below count against the agent's line.
        limit_key = factories.make_key(factories.make_wallet(tenant.sponsor, "limits")).secret
        limit = 250  # above the load's 200 calls of one wallet line in one window
        env = {"UPSTREAM_MCP_URL": upstream.url, "CACHE_URL": redis_url, "RATE_LIMIT_REQUESTS": str(limit)}
        with (
            running_gateway(tmp_path, threads=8, extra_env=env) as a,
            running_gateway(tmp_path, threads=8, extra_env=env) as b,
        ):
            # Rate limits are shared: `limit` requests split across both, then the next fails on either
            # (started early in a window, so that all of them land in one).
            if 60 - time.time() % 60 < 30:
                time.sleep(60 - time.time() % 60 + 0.5)
            for i in range(limit):
                base = a.url if i % 2 else b.url
                r = httpx.get(f"{base}/v1/me/authority", headers={"X-API-Key": limit_key}, timeout=10)
                assert r.status_code == 200, (i, r.status_code)
            for base in (a.url, b.url):
                refused = httpx.get(f"{base}/v1/me/authority", headers={"X-API-Key": limit_key}, timeout=10)
                assert refused.status_code == 429
                assert refused.headers["X-RateLimit-Remaining"] == "0"

            # A bounded load across both: 160 distinct calls, plus 20 keys each sent to both instances at once.
            jobs = []
            for i in range(160):
                jobs.append(((a.url, b.url)[i % 2], load_keys[i % 4], f"load-{i}", i))
            for i in range(20):
                for base in (a.url, b.url):
                    jobs.append((base, load_keys[i % 4], f"dup-{i}", 1000 + i))
            with ThreadPoolExecutor(max_workers=8) as pool:
                results = list(pool.map(lambda job: rpc(job[0], job[1], caller.permit_id, job[2], job[3]), jobs))
        for body in results:
            assert "result" in body or body["error"]["code"] in (-32009, -32001), body
        # One dispatch per key, whichever instance got it.
        for i in range(20):
            assert upstream.received[f"{tenant.agent.wallet_id}:dup-{i}"] == 1
        assert sum(upstream.received.values()) == 180
        connection.close()
        # Invariants over every account.
        total = sum(LedgerEntry.objects.values_list("amount", flat=True), Decimal(0))
        assert total == 0
        for wallet in Wallet.objects.all():
            entries = sum(LedgerEntry.objects.filter(wallet=wallet).values_list("amount", flat=True), Decimal(0))
            assert wallet.balance == entries
            assert wallet.balance >= 0
        permit = Permit.objects.get(pk=caller.permit_id)
        assert permit.spent_credits <= permit.max_credits
        assert permit.spent_credits == Decimal("90")  # 180 calls x 0.5
        assert not Action.objects.filter(receipt__isnull=True).exists()
        check = audit_chain_verify(chain=tenant.sponsor.tenant_id)
        assert check.valid, check
        assert audit_chain_verify(chain="system").valid
