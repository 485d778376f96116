"""Crash: the gateway worker is SIGKILLed after the claim and before the answer; the sweep settles it."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest
from django.core.management import call_command

from audit.models import Alert, AuditEvent
from mcpgateway.models import Action
from receipts.models import Receipt
from tests.conftest import make_tenant
from tests.gateway_helpers import register_upstream, setup_caller
from tests.live import running_gateway
from tests.upstream_server import FaultUpstream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def wait_for(predicate, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def healthy(url: str) -> bool:
    """Whether the gateway answers ``/health`` (a timeout while gunicorn replaces a worker is a no)."""
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def call(url: str, secret: str, permit_id: str, key: str) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "hang", "arguments": {}, "_meta": {"permit_id": permit_id, "idempotency_key": key}},
    }
    return httpx.post(f"{url}/mcp/messages", json=body, headers={"X-API-Key": secret}, timeout=60)


def test_worker_killed_after_claim_ends_delivery_uncertain_after_the_sweep(tmp_path):
    with FaultUpstream(hang_seconds=30) as upstream:
        register_upstream(upstream.url, price="3")
        tenant = make_tenant("crash")
        caller = setup_caller(tenant, balance=20)
        with running_gateway(tmp_path, UPSTREAM_MCP_URL=upstream.url, UPSTREAM_READ_TIMEOUT="60") as gw:
            failures: list[BaseException] = []

            def doomed() -> None:
                try:
                    call(gw.url, tenant.agent_secret, caller.permit_id, "crash-key")
                except BaseException as exc:  # the connection dies with the worker
                    failures.append(exc)

            thread = threading.Thread(target=doomed)
            thread.start()
            forwarded = f"{tenant.agent.wallet_id}:crash-key"
            wait_for(lambda: upstream.received[forwarded] == 1)
            action = Action.objects.get(idempotency_key="crash-key")
            assert action.state == "dispatch_claimed"
            workers = gw.worker_pids()
            assert workers
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            thread.join(30)
            assert failures, "the caller should have lost its connection"

            action.refresh_from_db()
            assert action.state == "dispatch_claimed"  # nobody finished it
            call_command("sweep_dispatches", "--older-than", "0")

            action.refresh_from_db()
            assert action.state == "delivery_uncertain"
            receipt = Receipt.objects.get(pk=action.receipt_id)
            assert receipt.outcome == "delivery_uncertain"
            assert receipt.reason_code == "dispatch_lost"
            assert receipt.credits_charged == 3
            assert AuditEvent.objects.filter(
                event_id=receipt.audit_event_id, event="tool_call.delivery_uncertain"
            ).exists()
            assert Alert.objects.filter(wallet_id=tenant.agent.wallet_id, kind="delivery_uncertain").count() == 1

            # gunicorn has started a new worker; a replay of the key returns that outcome, nothing is re-sent.
            wait_for(lambda: healthy(gw.url))
            replay = call(gw.url, tenant.agent_secret, caller.permit_id, "crash-key")
            assert replay.headers["Idempotent-Replayed"] == "true"
            error = replay.json()["error"]
            assert error["data"]["outcome"] == "delivery_uncertain"
            assert error["data"]["receipt_id"] == receipt.receipt_id
            assert upstream.received[forwarded] == 1
            # A second sweep finds nothing more to do.
            from datetime import timedelta

            from mcpgateway.services import action_sweep

            assert action_sweep(older_than=timedelta(0)) == []
