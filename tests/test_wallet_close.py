"""Closing a wallet waits until no refund can come back to it.

A refund posts to the charged wallet only, and a closed wallet takes none: a wallet closed with a call
in flight, a ``delivery_uncertain`` call awaiting its reconciliation result, or an owed refund would
leave that refund owed for ever. Each test leaves a real governed call in one of those states, tries
to close the wallet (as the service and as the console's action), and follows the call to its end.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from billing import services as billing_services
from billing.exceptions import WalletHasOpenCalls
from billing.models import LedgerEntry, Wallet
from mcpgateway import services
from mcpgateway.models import Action
from mcpgateway.services import governed
from receipts.models import Receipt, RefundReconciliation
from receipts.services import (
    reconciliation_record_executed,
    refund_reconciliation_mark_not_executed,
    refund_reconciliation_retry,
)
from tests.conftest import Tenant
from tests.gateway_helpers import Caller, issue_permit, setup_caller

pytestmark = pytest.mark.django_db


def call_left_claimed(tenant: Tenant, monkeypatch: pytest.MonkeyPatch, key: str) -> Action:
    """A governed call of ``echo`` (2 credits) whose worker stopped right after its claim."""
    caller = setup_caller(tenant, balance=10)

    def worker_stops(name: str) -> None:
        if name == "after_claim":
            raise RuntimeError("the worker stopped")

    monkeypatch.setattr(governed, "fault_point", worker_stops)
    with pytest.raises(RuntimeError):
        caller.rpc("echo", {"text": "hello"}, key=key)
    monkeypatch.undo()
    action = Action.objects.get(idempotency_key=key)
    assert action.state == "dispatch_claimed"
    return action


def refused(wallet: Wallet) -> dict[str, Any]:
    with pytest.raises(WalletHasOpenCalls) as caught:
        billing_services.wallet_close(wallet=wallet)
    assert Wallet.objects.get(pk=wallet.pk).status != "closed"
    return {name: count for name, count in caught.value.extra.items() if name != "wallet_id"}


def test_the_wallet_closes_only_once_the_refund_it_was_owed_has_posted(fault: Any, tenant: Tenant, monkeypatch):
    agent = tenant.agent
    action = call_left_claimed(tenant, monkeypatch, "close-1")
    assert refused(agent) == {"calls_in_flight": 1}

    assert services.action_sweep(older_than=timedelta(0)) == [action.action_id]
    receipt = Receipt.objects.get(action_id=action.action_id)
    assert receipt.outcome == "delivery_uncertain"
    assert refused(agent) == {"calls_awaiting_reconciliation": 1}

    refund_reconciliation_mark_not_executed(receipt_id=receipt.receipt_id, actor="ops")
    assert refused(agent) == {"refunds_owed": 1}

    assert refund_reconciliation_retry(receipt_id=receipt.receipt_id, actor="ops").status == "resolved"
    assert Wallet.objects.get(pk=agent.pk).balance == Decimal("10")
    billing_services.wallet_close(wallet=agent)
    closed = Wallet.objects.get(pk=agent.pk)
    assert (closed.status, closed.balance) == ("closed", 0)
    assert LedgerEntry.objects.filter(wallet_id=agent.wallet_id, kind="return").get().amount == Decimal("-10")


def test_a_call_reconciled_as_executed_owes_nothing(fault: Any, tenant: Tenant, monkeypatch):
    action = call_left_claimed(tenant, monkeypatch, "close-2")
    services.action_sweep(older_than=timedelta(0))
    receipt = Receipt.objects.get(action_id=action.action_id)
    reconciliation_record_executed(receipt_id=receipt.receipt_id, actor="ops")
    billing_services.wallet_close(wallet=tenant.agent)
    assert Wallet.objects.get(pk=tenant.agent.pk).status == "closed"
    assert not RefundReconciliation.objects.exists()


def test_finished_calls_and_a_sibling_s_open_call_do_not_hold_a_wallet(fault: Any, tenant: Tenant, monkeypatch):
    """Only the wallet's own open calls count: a finished call owes nothing, and a call in flight
    holds its own wallet, not a sibling."""
    sponsor = Wallet.objects.get(pk=tenant.sponsor.pk)
    sibling = billing_services.wallet_create_agent(parent=sponsor, initial_balance=0)
    call_left_claimed(tenant, monkeypatch, "close-3")
    billing_services.wallet_close(wallet=sibling)
    assert Wallet.objects.get(pk=sibling.pk).status == "closed"

    assert Caller(tenant, issue_permit(tenant)).rpc("echo", {"text": "done"}, key="close-4").status_code == 200
    assert Action.objects.get(idempotency_key="close-4").state == "completed"
    assert refused(tenant.agent) == {"calls_in_flight": 1}


def test_the_console_names_what_holds_the_wallet_open(fault: Any, tenant: Tenant, monkeypatch, admin_client):
    call_left_claimed(tenant, monkeypatch, "close-5")
    form = {"action": "close_wallets", "_selected_action": [tenant.agent.pk]}
    page = admin_client.post("/admin/billing/wallet/", form).content.decode()
    assert "calls in flight: 1" in page  # the confirmation page says so before anything is tried
    answer = admin_client.post("/admin/billing/wallet/", {**form, "post": "yes"}, follow=True)
    assert answer.status_code == 200
    text = answer.content.decode()
    assert "wallet_has_open_calls" in text
    assert "calls in flight: 1" in text
    assert Wallet.objects.get(pk=tenant.agent.pk).status == "active"
