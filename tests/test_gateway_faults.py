"""The governed call against an upstream that misbehaves: each fault ends in the outcome table's row."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.models import LedgerEntry, Wallet
from billing.services import tool_price_set
from mcpgateway import services
from mcpgateway.models import Action
from permits.models import Permit
from receipts.models import Receipt, RefundReconciliation
from tests.gateway_helpers import register_upstream, setup_caller
from tests.upstream_server import PARAM_TOOL_SCHEMA, FaultUpstream, free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def fault(settings):
    settings.UPSTREAM_READ_TIMEOUT = 0.5
    settings.UPSTREAM_CONNECT_TIMEOUT = 0.5
    with FaultUpstream(hang_seconds=3) as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="2")
        yield upstream


def balance(tenant) -> Decimal:
    return Wallet.objects.get(pk=tenant.agent.pk).balance


CASES = [
    # tool, outcome, charge kept, JSON-RPC error code (None: a result)
    ("echo", "success", True, None),
    ("is_error", "tool_error", True, None),
    ("rpc_error", "failed_refunded", False, -32003),
    ("bad_output", "response_rejected", True, -32004),
    ("garbage", "response_rejected", True, -32004),
    ("hang", "delivery_uncertain", True, -32005),
    ("slow", "delivery_uncertain", True, -32005),
    ("drop", "delivery_uncertain", True, -32005),
    ("bad_gateway", "delivery_uncertain", True, -32005),
    ("http_400", "failed_refunded", False, -32003),
]


@pytest.mark.parametrize(("tool", "outcome", "kept", "code"), CASES)
def test_fault_matrix(fault, tenant, tool, outcome, kept, code):
    caller = setup_caller(tenant)
    start = balance(tenant)
    key = f"fault-{tool}"
    first = caller.rpc(tool, {"x": 1}, key=key).json()
    if code is None:
        assert "result" in first, first
        meta = first["result"]["_meta"]
        assert meta["io.tollgate/outcome"] == outcome
        receipt_id = meta["io.tollgate/receipt-id"]
    else:
        assert first["error"]["code"] == code, first
        assert first["error"]["data"]["outcome"] == outcome
        receipt_id = first["error"]["data"]["receipt_id"]
    receipt = Receipt.objects.get(receipt_id=receipt_id)
    assert receipt.outcome == outcome
    expected = start - 2 if kept else start
    assert balance(tenant) == expected
    assert receipt.credits_charged == (Decimal(2) if kept else Decimal(0))
    if not kept:
        assert receipt.refund_entry is not None
        assert Permit.objects.get(pk=caller.permit_id).spent_credits == 0
    # Retrying the same key ten times: same answer, no second debit, the upstream saw one call.
    for _ in range(10):
        again = caller.rpc(tool, {"x": 1}, key=key)
        assert again["Idempotent-Replayed"] == "true"
        body = again.json()
        assert (body.get("result") or {}).get("_meta", {}).get("io.tollgate/receipt-id", receipt_id) == receipt_id
        if code is not None:
            assert body["error"]["data"]["receipt_id"] == receipt_id
    assert balance(tenant) == expected
    assert LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count() == 1
    agent_key = f"{tenant.agent.wallet_id}:{key}"
    assert fault.received[agent_key] == 1, dict(fault.received)
    assert Action.objects.get(idempotency_key=key).receipt_id == receipt_id


def test_refused_connection_is_failed_refunded(settings, tenant):
    port = free_port()
    with FaultUpstream() as upstream:
        register_upstream(upstream.url, price="2")
    settings.UPSTREAM_MCP_URL = f"http://127.0.0.1:{port}/mcp"
    settings.UPSTREAM_CONNECT_TIMEOUT = 0.5
    caller = setup_caller(tenant)
    start = balance(tenant)
    body = caller.rpc("echo", {}, key="refused").json()
    assert body["error"]["data"]["outcome"] == "failed_refunded"
    assert balance(tenant) == start
    assert (
        caller.rpc("echo", {}, key="refused").json()["error"]["data"]["receipt_id"]
        == body["error"]["data"]["receipt_id"]
    )


def test_refund_that_cannot_post_is_failed_unrefunded_with_a_reconciliation_item(fault, tenant, monkeypatch):
    from common.errors import Conflict
    from mcpgateway.services import finish as finishing

    def broken_refund(**kwargs):
        raise Conflict("refunds are down")

    monkeypatch.setattr(finishing, "ledger_refund", broken_refund)
    caller = setup_caller(tenant)
    start = balance(tenant)
    body = caller.rpc("rpc_error", {}, key="unrefunded").json()
    assert body["error"]["data"]["outcome"] == "failed_unrefunded"
    assert balance(tenant) == start - 2
    item = RefundReconciliation.objects.get(receipt_id=body["error"]["data"]["receipt_id"])
    assert item.status == "pending"
    assert item.amount == 2


def test_arguments_marked_as_headers_reach_a_stateless_era_upstream(settings, tenant):
    """In the 2026-07-28 era, the arguments a tool's inputSchema marks ``x-mcp-header`` travel as
    ``Mcp-Param-*`` headers too (an SDK server refuses the call without them)."""
    settings.UPSTREAM_READ_TIMEOUT = 0.5
    settings.UPSTREAM_CONNECT_TIMEOUT = 0.5
    with FaultUpstream(stateless_versions=["2026-07-28"]) as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        services.tools_sync(remote_tools=[{"name": "param_echo", "inputSchema": PARAM_TOOL_SCHEMA}])
        tool_price_set(tool="param_echo", credits=Decimal("1"))
        caller = setup_caller(tenant)
        body = caller.rpc("param_echo", {"region": "eu-west", "count": 3, "options": {"dry_run": True}}).json()
    assert "result" in body, body
    headers = {k.lower(): v for k, v in body["result"]["structuredContent"]["headers"].items()}
    assert headers == {"mcp-param-region": "eu-west", "mcp-param-count": "3", "mcp-param-dry-run": "true"}
