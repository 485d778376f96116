"""Crash and fault matrix: the worker dies at each boundary of the governed action; the same key is retried.

Whatever the boundary: at most one debit, at most one upstream call, and the final state is the one
docs/architecture.md gives (a death before the claim commits leaves nothing, so the retry runs the call;
a death after it leaves a claim that the sweep turns into delivery_uncertain, never a resend).
Also: serialization failures and deadlocks are retried or answered 409 with the key released.
"""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import httpx
import psycopg
import pytest
from django.db import OperationalError

from billing.models import LedgerEntry, Wallet
from mcpgateway import services
from mcpgateway.models import Action
from mcpgateway.services import claim as claiming
from tests.conftest import make_tenant
from tests.gateway_helpers import register_upstream, setup_caller
from tests.live import running_gateway
from tests.upstream_server import FaultUpstream

KILL_CASES = [
    # point, the retry's answer: "success" (nothing had committed) or "uncertain" (the claim had)
    ("before_claim", "success"),
    ("after_claim", "uncertain"),
    ("after_upstream", "uncertain"),
    ("before_receipt", "uncertain"),
]


def rpc(url: str, secret: str, permit_id: str, key: str) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"n": 1}, "_meta": {"permit_id": permit_id, "idempotency_key": key}},
    }
    return httpx.post(f"{url}/mcp/messages", json=body, headers={"X-API-Key": secret}, timeout=30)


def until_healthy(url: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("gateway did not come back")


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("point", "after_retry"), KILL_CASES)
def test_worker_killed_at_each_boundary(tmp_path, point, after_retry):
    with FaultUpstream() as upstream:
        register_upstream(upstream.url, price="2")
        tenant = make_tenant(f"kill-{point}")
        caller = setup_caller(tenant, balance=20)
        start = Wallet.objects.get(pk=tenant.agent.pk).balance
        env = {
            "UPSTREAM_MCP_URL": upstream.url,
            "TOLLGATE_FAULTS": f"{point}=kill",
            "TOLLGATE_FAULT_DIR": str(tmp_path),
        }
        forwarded = f"{tenant.agent.wallet_id}:k-{point}"
        with running_gateway(tmp_path, extra_env=env) as gw:
            with pytest.raises(httpx.HTTPError):
                rpc(gw.url, tenant.agent_secret, caller.permit_id, f"k-{point}")
            assert (tmp_path / f"tollgate-fault-{point}.fired").exists()
            until_healthy(gw.url)
            retry = rpc(gw.url, tenant.agent_secret, caller.permit_id, f"k-{point}").json()
            if after_retry == "success":
                assert retry["result"]["_meta"]["io.tollgate/outcome"] == "success", retry
                assert upstream.received[forwarded] == 1
            else:
                # The claim committed: the key is in progress until the sweep settles it. Never re-sent.
                assert retry["error"]["code"] == -32009, retry
                assert services.action_sweep(older_than=timedelta(0))
                final = rpc(gw.url, tenant.agent_secret, caller.permit_id, f"k-{point}").json()
                assert final["error"]["data"]["outcome"] == "delivery_uncertain"
                assert upstream.received[forwarded] == (0 if point == "after_claim" else 1)
        charges = LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count()
        assert charges == 1
        assert Wallet.objects.get(pk=tenant.agent.pk).balance == start - 2
        assert Action.objects.filter(wallet_id=tenant.agent.wallet_id).count() == 1
        assert sum(upstream.received.values()) <= 1


def _db_error(sqlstate_cls: type[psycopg.Error]) -> OperationalError:
    err = OperationalError(f"injected {sqlstate_cls.__name__}")
    err.__cause__ = sqlstate_cls("injected")
    return err


@pytest.mark.django_db
@pytest.mark.parametrize("error", [psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected])
def test_transient_conflicts_are_retried(settings, tenant, monkeypatch, error):
    with FaultUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="1")
        caller = setup_caller(tenant)
        real = claiming._claim  # the round trip that debits, reserves and claims
        failures = {"left": 2}

        def flaky(*args, **kwargs):
            if failures["left"]:
                failures["left"] -= 1
                raise _db_error(error)
            return real(*args, **kwargs)

        monkeypatch.setattr(claiming, "_claim", flaky)
        body = caller.rpc("echo", {}, key="flaky").json()
        assert body["result"]["_meta"]["io.tollgate/outcome"] == "success"
        assert LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count() == 1
        assert upstream.received[f"{tenant.agent.wallet_id}:flaky"] == 1


@pytest.mark.django_db
def test_persistent_conflict_is_409_with_the_key_released(settings, tenant, monkeypatch):
    with FaultUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="1")
        caller = setup_caller(tenant)
        real = claiming._claim

        def always(*args, **kwargs):
            raise _db_error(psycopg.errors.SerializationFailure)

        monkeypatch.setattr(claiming, "_claim", always)
        r = caller.invoke("echo", {}, key="stuck")
        assert r.status_code == 409
        assert r["Retry-After"] == "1"
        assert r.json()["detail"]["error"] == "transaction_conflict"
        mcp = caller.rpc("echo", {}, key="stuck-mcp").json()
        assert mcp["error"]["data"]["error"] == "transaction_conflict"
        assert not Action.objects.exists()
        assert upstream.count("tools/call") == 0
        # The key was released: once the conflict clears, the same key goes through once.
        monkeypatch.setattr(claiming, "_claim", real)
        ok = caller.invoke("echo", {}, key="stuck")
        assert ok.status_code == 200
        assert ok.json()["outcome"] == "success"
        assert LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count() == 1


@pytest.mark.django_db
def test_conflict_on_a_plain_api_operation_is_409_not_500(tenant, monkeypatch):
    from billing import services as billing_services

    def conflicted(**kwargs):
        raise _db_error(psycopg.errors.DeadlockDetected)

    monkeypatch.setattr(billing_services, "wallet_charge", conflicted)
    from billing import views

    monkeypatch.setattr(views.services, "wallet_charge", conflicted, raising=False)
    r = tenant.agent_client.post(f"/v1/billing/charge?wallet_id={tenant.agent.wallet_id}&units=1")
    assert r.status_code == 409
    assert r.json()["detail"]["error"] == "transaction_conflict"
    assert Wallet.objects.get(pk=tenant.agent.pk).balance == Decimal(0)
