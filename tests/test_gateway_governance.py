"""The governed path of tools/call (docs/architecture.md): refusals, idempotency, quotes, allowances.

MCP calls go through /mcp/messages (plain JSON-RPC, the same governed path); the
deprecated REST invoke is used where the HTTP status matters.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar

import pytest
from django.db import connection
from rest_framework.test import APIClient

from audit.models import AuditEvent
from billing.models import LedgerEntry, Wallet
from billing.services import tool_price_set, wallet_freeze, wallet_unfreeze
from mcpgateway import services
from mcpgateway.models import Action, PartnerNote, Tool, ToolSource
from permits.models import Permit, Quote
from permits.services import permit_revoke, policy_create, quote_create
from receipts.models import Receipt
from tests import factories
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import Caller, issue_permit, register_upstream, setup_caller
from tests.upstream_server import FaultUpstream, running_demo_upstream

pytestmark = pytest.mark.django_db

T = TypeVar("T")
_ids = itertools.count(1)


def balance(tenant: Tenant) -> Decimal:
    return Wallet.objects.get(pk=tenant.agent.pk).balance


def charges(tenant: Tenant) -> int:
    return LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count()


def rpc_raw(client: APIClient, params: dict[str, Any], **headers: Any) -> Any:
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call", "params": params}
    return client.post("/mcp/messages", body, format="json", **headers)


def wait_for(probe: Callable[[], T | None], seconds: float = 10.0) -> T:
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def assert_refused(body: dict[str, Any], *, outcome: str, reason: str, code: int = -32001) -> Receipt:
    """A JSON-RPC refusal with a receipt: nothing charged, the action denied."""
    assert "result" not in body, body
    error = body["error"]
    assert error["code"] == code, body
    assert error["data"]["outcome"] == outcome
    assert error["data"]["error"] == reason
    receipt = Receipt.objects.get(receipt_id=error["data"]["receipt_id"])
    assert receipt.outcome == outcome
    assert receipt.reason_code == reason
    assert receipt.credits_charged == 0
    assert receipt.ledger_entry_id is None
    action = Action.objects.get(action_id=error["data"]["action_id"])
    assert action.state == "denied"
    assert action.receipt_id == receipt.receipt_id
    return receipt


# --- Call metadata and validation (nothing accepted, nothing written) -------------------------------


def test_call_metadata_is_required(fault, tenant):
    caller = setup_caller(tenant)
    client = tenant.agent_client
    body = rpc_raw(client, {"name": "echo", "arguments": {}, "_meta": {"idempotency_key": "k-1"}}).json()
    assert body["error"]["code"] == -32602
    assert body["error"]["data"]["error"] == "missing_permit_id"

    body = rpc_raw(client, {"name": "echo", "arguments": {}, "_meta": {"permit_id": caller.permit_id}}).json()
    assert body["error"]["code"] == -32602
    assert body["error"]["data"]["error"] == "missing_idempotency_key"

    for bad in ("x" * 256, " padded", "tab\tkey"):
        body = caller.rpc("echo", {}, key=bad).json()
        assert body["error"]["code"] == -32602, bad
        assert body["error"]["data"]["error"] == "invalid_idempotency_key", bad

    body = rpc_raw(client, {"name": "", "arguments": {}}).json()
    assert body["error"]["data"]["error"] == "missing_tool_name"
    body = rpc_raw(client, {"name": "echo", "arguments": [1], "_meta": {}}).json()
    assert body["error"]["data"]["error"] == "invalid_arguments"
    assert not Action.objects.exists()
    assert fault.count("tools/call") == 0

    # A key of exactly 255 printable characters is fine.
    body = caller.rpc("echo", {}, key="k" * 255).json()
    assert body["result"]["_meta"]["io.tollgate/outcome"] == "success"


def test_call_metadata_may_come_as_headers(fault, tenant):
    caller = setup_caller(tenant)
    r = rpc_raw(
        tenant.agent_client,
        {"name": "echo", "arguments": {"h": 1}},
        HTTP_X_PERMIT_ID=caller.permit_id,
        HTTP_IDEMPOTENCY_KEY="hdr-1",
    )
    assert r.json()["result"]["_meta"]["io.tollgate/outcome"] == "success"
    action = Action.objects.get(idempotency_key="hdr-1")
    assert action.permit_id == caller.permit_id


def test_rest_invoke_validation_is_422(fault, tenant):
    caller = setup_caller(tenant)
    client = tenant.agent_client
    r = client.post("/mcp/tools/echo/invoke", {"idempotency_key": "r-1"}, format="json")
    assert r.status_code == 422
    assert ["body", "permit_id"] in [e["loc"] for e in r.json()["detail"]]
    r = caller.invoke("echo", {}, key="x" * 256)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "idempotency_key"]
    r = client.post("/mcp/tools/echo/invoke", [1, 2], format="json")
    assert r.status_code == 422
    assert not Action.objects.exists()


def test_unknown_and_disabled_tools_are_unknown_tool(fault, tenant):
    caller = setup_caller(tenant)
    body = caller.rpc("no.such.tool", {}).json()
    assert body["error"]["code"] == -32602
    assert body["error"]["data"]["error"] == "unknown_tool"
    r = caller.invoke("no.such.tool", {})  # on REST the tool is in the path: an unknown one is 404
    assert r.status_code == 404
    assert r.json()["detail"]["error"] == "not_found"

    Tool.objects.filter(service_id="echo").update(enabled=False)
    assert caller.rpc("echo", {}).json()["error"]["data"]["error"] == "unknown_tool"
    assert not Action.objects.exists()
    assert fault.count("tools/call") == 0


def test_a_tool_without_a_price_cannot_be_called(fault, tenant):
    caller = setup_caller(tenant)
    tool_price_set(tool="echo", credits=None)
    body = caller.rpc("echo", {}).json()
    assert body["error"]["code"] == -32602
    assert body["error"]["data"]["error"] == "tool_price_not_set"
    r = caller.invoke("echo", {})
    assert r.status_code == 422
    assert r.json()["detail"][0]["type"] == "tool_price_not_set"
    assert not Action.objects.exists()
    # A price of zero is a price: callable, nothing debited.
    tool_price_set(tool="echo", credits=Decimal(0))
    start = balance(tenant)
    body = caller.rpc("echo", {}).json()
    assert body["result"]["_meta"]["io.tollgate/credits-charged"] == "0.00000000"
    assert balance(tenant) == start
    assert charges(tenant) == 0


def test_arguments_breaking_the_input_schema_are_refused_before_anything(settings, tenant):
    with running_demo_upstream() as demo:
        settings.UPSTREAM_MCP_URL = demo.url
        register_upstream(demo.url, price="1")
        caller = setup_caller(tenant)
        start = balance(tenant)
        for bad in ({"text": 5}, {}, {"text": None}):
            body = caller.rpc("notes.append", bad).json()
            assert body["error"]["code"] == -32602, bad
            assert body["error"]["data"]["error"] == "invalid_arguments", bad
        r = caller.invoke("notes.append", {"text": 5})
        assert r.status_code == 422
        assert r.json()["detail"][0]["type"] == "invalid_arguments"
        assert r.json()["detail"][0]["loc"] == ["body", "arguments", "text"]
        assert not Action.objects.exists()
        assert balance(tenant) == start
        assert Permit.objects.get(pk=caller.permit_id).spent_credits == 0
        assert demo.state.snapshot()["tool_calls"] == {}

        body = caller.rpc("notes.append", {"text": "hello"}, key="demo-ok").json()
        assert body["result"]["structuredContent"]["text"] == "hello"
        assert balance(tenant) == start - 1
        assert demo.state.snapshot()["key_arrivals"] == {f"{tenant.agent.wallet_id}:demo-ok": 1}


# --- Refusals with a receipt ----------------------------------------------------------------------


def test_permit_of_another_wallet_or_unknown_is_not_found(fault, tenant, other_tenant):
    caller = setup_caller(tenant)
    foreign = setup_caller(other_tenant)
    start = balance(tenant)
    for permit_id in (foreign.permit_id, "pmt_doesnotexist"):
        body = caller.rpc("echo", {}, permit_id=permit_id).json()
        receipt = assert_refused(body, outcome="denied", reason="permit_not_found")
        assert receipt.permit_id is None
    r = caller.invoke("echo", {}, permit_id=foreign.permit_id)
    assert r.status_code == 403
    assert r.json()["outcome"] == "denied"
    assert r.json()["reason_code"] == "permit_not_found"
    assert r.json()["receipt_id"].startswith("rcpt_")
    assert r.json()["credits_charged"] == "0.00000000"
    assert balance(tenant) == start
    assert Permit.objects.get(pk=foreign.permit_id).spent_credits == 0
    assert charges(tenant) == 0
    assert fault.count("tools/call") == 0


def test_tool_not_permitted(fault, tenant):
    caller = setup_caller(tenant, tools=["rpc_error", "notes.*"])
    body = caller.rpc("echo", {}).json()
    receipt = assert_refused(body, outcome="denied", reason="tool_not_permitted")
    assert receipt.permit_id == caller.permit_id
    assert Permit.objects.get(pk=caller.permit_id).spent_credits == 0
    assert fault.count("tools/call") == 0


def test_revoked_permit(fault, tenant):
    caller = setup_caller(tenant)
    permit_revoke(permit_id=caller.permit_id)
    start = balance(tenant)
    assert_refused(caller.rpc("echo", {}).json(), outcome="denied", reason="permit_revoked")
    assert caller.invoke("echo", {}).status_code == 403
    assert balance(tenant) == start
    assert fault.count("tools/call") == 0


def test_permit_bound_to_another_key(fault, tenant):
    factories.top_up(tenant.agent, 50)
    bound_key = factories.make_key(tenant.agent, "bound")
    caller = Caller(tenant, issue_permit(tenant, subject_key_id=bound_key.key.key_id))
    assert_refused(caller.rpc("echo", {}).json(), outcome="denied", reason="permit_key_mismatch")
    # The bound key itself may use it.
    bound = client_for(bound_key.secret)
    params = {"name": "echo", "arguments": {}, "_meta": {"permit_id": caller.permit_id, "idempotency_key": "bk"}}
    body = rpc_raw(bound, params).json()
    assert body["result"]["_meta"]["io.tollgate/outcome"] == "success"


def test_another_key_cannot_replay_a_bound_keys_call(fault, tenant):
    """A replay answers the wallet's stored call only to a key its permit lets call: another key of the
    wallet that sends the bound key's idempotency key and arguments gets 403, not the bound key's
    result, whatever permit it names; a key the permit does not bind may replay an unbound call."""
    factories.top_up(tenant.agent, 50)
    bound_key = factories.make_key(tenant.agent, "bound")
    bound_permit = issue_permit(tenant, subject_key_id=bound_key.key.key_id)
    params = {
        "name": "echo",
        "arguments": {"text": "private"},
        "_meta": {"permit_id": bound_permit, "idempotency_key": "bk"},
    }
    first = rpc_raw(client_for(bound_key.secret), params).json()
    assert first["result"]["_meta"]["io.tollgate/outcome"] == "success"
    for permit_id in (bound_permit, issue_permit(tenant), "pmt_none"):
        again = dict(params, _meta={"permit_id": permit_id, "idempotency_key": "bk"})
        body = rpc_raw(tenant.agent_client, again).json()
        assert "result" not in body, body
        assert body["error"]["data"]["error"] == "permit_key_mismatch"
    replay = rpc_raw(client_for(bound_key.secret), params).json()  # its own replay
    assert replay["result"]["structuredContent"] == first["result"]["structuredContent"]

    unbound = issue_permit(tenant)
    shared = {"name": "echo", "arguments": {"text": "shared"}, "_meta": {"permit_id": unbound, "idempotency_key": "sk"}}
    made = rpc_raw(client_for(bound_key.secret), shared).json()
    assert (
        rpc_raw(tenant.agent_client, shared).json()["result"]["structuredContent"]
        == made["result"]["structuredContent"]
    )
    assert fault.count("tools/call") == 2


def test_insufficient_funds(fault, tenant):
    caller = setup_caller(tenant, balance=1)
    start = balance(tenant)
    assert start == 1
    body = caller.rpc("echo", {}).json()
    assert_refused(body, outcome="insufficient_funds", reason="insufficient_funds", code=-32002)
    data = body["error"]["data"]
    assert data["required"] == "2.00000000"
    assert data["shortfall"] == "1.00000000"
    r = caller.invoke("echo", {})
    assert r.status_code == 402
    assert r.json()["outcome"] == "insufficient_funds"
    assert r.json()["error"]["data"]["balance"] == "1.00000000"
    assert balance(tenant) == start
    assert charges(tenant) == 0
    permit = Permit.objects.get(pk=caller.permit_id)
    assert permit.spent_credits == 0
    assert permit.calls_used == 0
    assert fault.count("tools/call") == 0


def test_frozen_wallet_and_replay_of_a_denial(fault, tenant):
    caller = setup_caller(tenant)
    wallet_freeze(wallet=tenant.agent, reason="test")
    body = caller.rpc("echo", {}, key="frozen-1").json()
    receipt = assert_refused(body, outcome="denied", reason="wallet_frozen")
    r = caller.invoke("echo", {}, key="frozen-rest")
    assert r.status_code == 403
    assert r.json()["reason_code"] == "wallet_frozen"
    permit = Permit.objects.get(pk=caller.permit_id)
    assert (permit.spent_credits, permit.calls_used) == (0, 0)  # the reservation was rolled back

    # Unfrozen: a replay of the denied key still answers the stored denial; a new key goes through.
    wallet_unfreeze(wallet=Wallet.objects.get(pk=tenant.agent.pk))
    again = caller.rpc("echo", {}, key="frozen-1")
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["error"]["data"]["receipt_id"] == receipt.receipt_id
    assert again.json()["error"]["data"]["error"] == "wallet_frozen"
    r = caller.invoke("echo", {}, key="frozen-rest")
    assert r.status_code == 403
    assert r["Idempotent-Replayed"] == "true"
    fresh = caller.rpc("echo", {}, key="frozen-2").json()
    assert fresh["result"]["_meta"]["io.tollgate/outcome"] == "success"
    assert Receipt.objects.filter(action_id__in=Action.objects.values("action_id")).count() == 3
    assert fault.count("tools/call") == 1


def test_a_frozen_wallet_cannot_call_even_a_free_tool(fault, tenant):
    tool_price_set(tool="echo", credits=Decimal("0"))
    caller = setup_caller(tenant)
    ok = caller.rpc("echo", {}, key="free-ok").json()
    assert ok["result"]["_meta"]["io.tollgate/credits-charged"] == "0.00000000"
    wallet_freeze(wallet=tenant.agent, reason="test")
    assert_refused(caller.rpc("echo", {}, key="free-frozen").json(), outcome="denied", reason="wallet_frozen")
    assert fault.count("tools/call") == 1


def test_policy_denial_records_the_decision(fault, tenant):
    caller = setup_caller(tenant)
    policy = policy_create(wallet=tenant.sponsor, name="no echo", denied_tools=["echo"])
    body = caller.rpc("echo", {}).json()
    receipt = assert_refused(body, outcome="denied", reason="policy_denied")
    data = body["error"]["data"]
    assert data["policy_id"] == policy.policy_id
    assert data["policy_decision_id"].startswith("pdec_")
    assert receipt.policy_decision_id == data["policy_decision_id"]
    event = AuditEvent.objects.get(event_id=receipt.audit_event_id)
    assert event.event == "tool_call.denied"
    assert event.policy_decision_id == data["policy_decision_id"]
    assert event.ok is False
    assert Permit.objects.get(pk=caller.permit_id).spent_credits == 0
    # Other tools are unaffected, and their decision is on their receipt too.
    ok = caller.rpc("rpc_error", {}).json()
    assert ok["error"]["data"]["outcome"] == "failed_refunded"
    assert Receipt.objects.get(receipt_id=ok["error"]["data"]["receipt_id"]).policy_decision_id.startswith("pdec_")


def test_operator_keys_cannot_call_tools(fault, tenant, operator_client):
    params = {"name": "echo", "arguments": {}, "_meta": {"permit_id": "pmt_x", "idempotency_key": "op-1"}}
    body = rpc_raw(operator_client, params).json()
    assert body["error"]["code"] == -32001
    assert body["error"]["data"]["error"] == "wallet_key_required"
    r = operator_client.post("/mcp/tools/echo/invoke", {"permit_id": "pmt_x", "idempotency_key": "op-2"}, format="json")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "wallet_key_required"
    assert not Action.objects.exists()


# --- Idempotency -------------------------------------------------------------------------------


def test_same_key_other_request_is_refused_and_writes_nothing(fault, tenant):
    caller = setup_caller(tenant)
    first = caller.rpc("echo", {"a": 1}, key="reuse-1").json()
    assert first["result"]["_meta"]["io.tollgate/outcome"] == "success"
    counts = (Action.objects.count(), Receipt.objects.count(), LedgerEntry.objects.count(), AuditEvent.objects.count())
    start = balance(tenant)

    body = caller.rpc("echo", {"a": 2}, key="reuse-1").json()
    assert body["error"]["code"] == -32602
    assert body["error"]["data"]["error"] == "idempotency_key_reused"
    body = caller.rpc("rpc_error", {"a": 1}, key="reuse-1").json()
    assert body["error"]["data"]["error"] == "idempotency_key_reused"
    r = caller.invoke("echo", {"a": 2}, key="reuse-1")
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail[0]["type"] == "idempotency_key_reused"
    assert detail[0]["loc"] == ["header", "Idempotency-Key"]

    after = (Action.objects.count(), Receipt.objects.count(), LedgerEntry.objects.count(), AuditEvent.objects.count())
    assert after == counts
    assert balance(tenant) == start
    assert fault.received[f"{tenant.agent.wallet_id}:reuse-1"] == 1


def test_keys_are_scoped_by_wallet(fault, tenant, other_tenant):
    mine = setup_caller(tenant)
    theirs = setup_caller(other_tenant)
    a = mine.rpc("echo", {"w": 1}, key="shared").json()
    b = theirs.rpc("echo", {"w": 2}, key="shared").json()
    assert a["result"]["_meta"]["io.tollgate/outcome"] == "success"
    assert b["result"]["_meta"]["io.tollgate/outcome"] == "success"
    assert a["result"]["_meta"]["io.tollgate/receipt-id"] != b["result"]["_meta"]["io.tollgate/receipt-id"]


def test_replay_returns_the_stored_answer(fault, tenant):
    caller = setup_caller(tenant)
    first = caller.invoke("echo", {"r": 1}, key="replay-1")
    assert first.status_code == 200
    assert "Idempotent-Replayed" not in first
    start = balance(tenant)
    second = caller.invoke("echo", {"r": 1}, key="replay-1")
    assert second.status_code == 200
    assert second["Idempotent-Replayed"] == "true"
    one, two = first.json(), second.json()
    assert one.pop("replayed") is False
    assert two.pop("replayed") is True
    assert one == two

    m1 = caller.rpc("echo", {"r": 2}, key="replay-2").json()["result"]
    r2 = caller.rpc("echo", {"r": 2}, key="replay-2")
    assert r2["Idempotent-Replayed"] == "true"
    m2 = r2.json()["result"]
    assert m1["_meta"].pop("io.tollgate/replayed") is False
    assert m2["_meta"].pop("io.tollgate/replayed") is True
    assert m1 == m2
    assert balance(tenant) == start - 2
    assert fault.received[f"{tenant.agent.wallet_id}:replay-1"] == 1
    assert fault.received[f"{tenant.agent.wallet_id}:replay-2"] == 1


# --- Quotes and permit allowances ----------------------------------------------------------------


def test_a_quote_freezes_the_price_once(fault, tenant):
    caller = setup_caller(tenant)
    quote = quote_create(wallet=tenant.agent, tool="echo")
    assert quote.quoted_credits == 2
    tool_price_set(tool="echo", credits=Decimal(5))
    start = balance(tenant)
    body = caller.rpc("echo", {}, key="q-1", quote_id=quote.quote_id).json()
    meta = body["result"]["_meta"]
    assert meta["io.tollgate/credits-charged"] == "2.00000000"
    assert balance(tenant) == start - 2
    receipt = Receipt.objects.get(receipt_id=meta["io.tollgate/receipt-id"])
    assert receipt.quote_id == quote.quote_id
    assert receipt.credits_charged == 2
    quote.refresh_from_db()
    assert quote.status == "consumed"
    assert quote.consumed_by == meta["io.tollgate/action-id"]

    again = caller.rpc("echo", {}, key="q-2", quote_id=quote.quote_id).json()
    assert_refused(again, outcome="denied", reason="quote_unavailable")
    assert balance(tenant) == start - 2

    # A quote for another tool is no good either; without a quote the current price applies.
    other = quote_create(wallet=tenant.agent, tool="rpc_error")
    assert_refused(
        caller.rpc("echo", {}, key="q-3", quote_id=other.quote_id).json(), outcome="denied", reason="quote_unavailable"
    )
    assert Quote.objects.get(pk=other.pk).status == "active"
    plain = caller.rpc("echo", {}, key="q-4").json()
    assert plain["result"]["_meta"]["io.tollgate/credits-charged"] == "5.00000000"
    assert Permit.objects.get(pk=caller.permit_id).spent_credits == 7


def test_a_refused_call_does_not_spend_its_quote(fault, tenant):
    caller = setup_caller(tenant, balance=1, tools=["rpc_error"])
    quote = quote_create(wallet=tenant.agent, tool="echo")
    body = caller.rpc("echo", {}, quote_id=quote.quote_id).json()
    assert_refused(body, outcome="denied", reason="tool_not_permitted")
    assert Quote.objects.get(pk=quote.pk).status == "active"

    poor = Caller(tenant, issue_permit(tenant))  # any tool, but the wallet holds 1 and the quote says 2
    body = poor.rpc("echo", {}, quote_id=quote.quote_id).json()
    assert_refused(body, outcome="insufficient_funds", reason="insufficient_funds", code=-32002)
    assert Quote.objects.get(pk=quote.pk).status == "active"


def test_rest_invoke_quote_refusal_is_403(fault, tenant):
    caller = setup_caller(tenant)
    quote = quote_create(wallet=tenant.agent, tool="echo")
    assert caller.invoke("echo", {}, quote_id=quote.quote_id).status_code == 200
    r = caller.invoke("echo", {}, quote_id=quote.quote_id)
    assert r.json()["outcome"] == "denied"
    assert r.json()["reason_code"] == "quote_unavailable"
    assert r.status_code == 403


def test_permit_credit_allowance(fault, tenant):
    tool_price_set(tool="echo", credits=Decimal(1))
    caller = setup_caller(tenant, max_credits="3")
    for i in range(3):
        body = caller.rpc("echo", {"i": i}).json()
        assert body["result"]["_meta"]["io.tollgate/outcome"] == "success", body
    body = caller.rpc("echo", {"i": 3}).json()
    assert_refused(body, outcome="denied", reason="permit_exhausted")
    permit = Permit.objects.get(pk=caller.permit_id)
    assert permit.spent_credits == 3
    assert permit.calls_used == 3
    assert charges(tenant) == 3
    assert fault.count("tools/call") == 3


def test_permit_call_allowance(fault, tenant):
    caller = setup_caller(tenant, max_calls=2)
    for i in range(2):
        assert caller.rpc("echo", {"i": i}).json()["result"]["_meta"]["io.tollgate/outcome"] == "success"
    assert_refused(caller.rpc("echo", {"i": 2}).json(), outcome="denied", reason="permit_exhausted")
    assert Permit.objects.get(pk=caller.permit_id).calls_used == 2
    assert fault.count("tools/call") == 2


def test_refunded_calls_give_the_allowance_back(fault, tenant):
    caller = setup_caller(tenant, max_credits="2")
    for _ in range(3):
        body = caller.rpc("rpc_error", {}).json()
        assert body["error"]["data"]["outcome"] == "failed_refunded"
    permit = Permit.objects.get(pk=caller.permit_id)
    assert permit.spent_credits == 0
    assert permit.calls_used == 0
    assert caller.rpc("echo", {}).json()["result"]["_meta"]["io.tollgate/outcome"] == "success"


# --- REST invoke statuses ---------------------------------------------------------------------------


def test_rest_invoke_statuses(fault, tenant, settings):
    caller = setup_caller(tenant, balance=10)

    ok = caller.invoke("echo", {"s": 1})
    assert ok.status_code == 200
    body = ok.json()
    assert body["outcome"] == "success"
    assert body["receipt_id"].startswith("rcpt_")
    assert body["action_id"].startswith("act_")
    assert body["result"]["structuredContent"] == {"echo": {"s": 1}}
    assert body["error"] is None
    assert body["credits_charged"] == "2.00000000"

    tool_error = caller.invoke("is_error", {})
    assert tool_error.status_code == 200
    assert tool_error.json()["outcome"] == "tool_error"

    upstream_error = caller.invoke("rpc_error", {})
    assert upstream_error.status_code == 502
    assert upstream_error.json()["outcome"] == "failed_refunded"
    assert upstream_error.json()["error"]["data"]["upstream_error"]["code"] == -32602
    assert upstream_error.json()["credits_charged"] == "0.00000000"

    rejected = caller.invoke("garbage", {})
    assert rejected.status_code == 502
    assert rejected.json()["outcome"] == "response_rejected"

    uncertain = caller.invoke("hang", {})
    assert uncertain.status_code == 504
    assert uncertain.json()["outcome"] == "delivery_uncertain"
    assert uncertain.json()["credits_charged"] == "2.00000000"

    tool_price_set(tool="echo", credits=Decimal(50))
    poor = caller.invoke("echo", {})
    assert poor.status_code == 402
    assert poor.json()["outcome"] == "insufficient_funds"

    denied = caller.invoke("echo", {}, permit_id="pmt_nope")
    assert denied.status_code == 403

    unknown = caller.invoke("nope", {})
    assert unknown.status_code == 404
    assert "receipt_id" not in unknown.json()
    invalid = caller.invoke("echo", {}, key="x" * 256)
    assert invalid.status_code == 422
    assert "receipt_id" not in invalid.json()

    for r in (ok, tool_error, upstream_error, rejected, uncertain, poor, denied):
        receipt = Receipt.objects.get(receipt_id=r.json()["receipt_id"])
        assert receipt.outcome == r.json()["outcome"]
        assert receipt.action_id == r.json()["action_id"]


# --- E. A key whose first request is still running ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_key_in_progress_is_409_then_replays_the_outcome(settings, tenant):
    settings.UPSTREAM_READ_TIMEOUT = 5
    settings.UPSTREAM_CONNECT_TIMEOUT = 1
    with FaultUpstream(hang_seconds=30) as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="2")
        caller = setup_caller(tenant)
        answers: dict[str, Any] = {}

        def first_call() -> None:
            try:
                answers["first"] = caller.invoke("hang", {"n": 1}, key="busy")
            finally:
                connection.close()

        thread = threading.Thread(target=first_call)
        thread.start()
        try:
            action = wait_for(lambda: Action.objects.filter(idempotency_key="busy", state="dispatch_claimed").first())
            wait_for(lambda: upstream.received[f"{tenant.agent.wallet_id}:busy"] == 1)
            r = caller.invoke("hang", {"n": 1}, key="busy")
            assert r.status_code == 409
            assert r["Retry-After"] == "2"
            assert r.json()["detail"]["error"] == "idempotency_key_in_progress"
            assert r.json()["detail"]["action_id"] == action.action_id

            body = caller.rpc("hang", {"n": 1}, key="busy").json()
            assert body["error"]["code"] == -32009
            assert body["error"]["data"]["error"] == "idempotency_key_in_progress"
            assert body["error"]["data"]["retry_after_seconds"] == 2

            # Another request with the running key is still the idempotency conflict.
            assert caller.invoke("hang", {"n": 2}, key="busy").status_code == 422
        finally:
            upstream.stopping.set()  # the hanging upstream hangs up without an answer
            thread.join(15)
        assert not thread.is_alive()
        first = answers["first"]
        assert first.status_code == 504
        assert first.json()["outcome"] == "delivery_uncertain"

        replay = caller.invoke("hang", {"n": 1}, key="busy")
        assert replay.status_code == 504
        assert replay["Idempotent-Replayed"] == "true"
        assert replay.json()["receipt_id"] == first.json()["receipt_id"]
        assert upstream.received[f"{tenant.agent.wallet_id}:busy"] == 1


def test_mcp_in_progress_answer_carries_retry_after(fault, tenant):
    caller = setup_caller(tenant)
    first = caller.rpc("echo", {}, key="ip").json()
    Action.objects.filter(action_id=first["result"]["_meta"]["io.tollgate/action-id"]).update(state="dispatch_claimed")
    r = caller.rpc("echo", {}, key="ip")
    assert r.json()["error"]["code"] == -32009
    assert r["Retry-After"] == "2"


def test_a_call_whose_session_negotiation_outlasts_its_send_deadline_is_not_sent_and_refunded(
    fault, tenant, settings, monkeypatch
):
    """The sweeper gives a claim up after a fixed time that covers one call sent at once. A call whose
    upstream session took longer to negotiate is not sent at all (refunded), never sent after the
    sweep may have declared it lost."""
    from mcpgateway.upstream.client import UpstreamClient

    settings.UPSTREAM_CONNECT_TIMEOUT = 0.05
    settings.SWEEP_MARGIN_SECONDS = 0.1  # a send deadline 0.1 s after the claim
    caller = setup_caller(tenant)
    start = balance(tenant)
    negotiated = UpstreamClient._negotiated

    def slow(self: UpstreamClient) -> Any:
        time.sleep(0.4)
        return negotiated(self)

    monkeypatch.setattr(UpstreamClient, "_negotiated", slow)
    body = caller.rpc("echo", {"n": 1}, key="slow-session").json()
    assert body["error"]["data"]["outcome"] == "failed_refunded", body
    assert body["error"]["data"]["error"] == "upstream_not_sent", body
    assert fault.count("tools/call") == 0
    assert balance(tenant) == start
    monkeypatch.setattr(UpstreamClient, "_negotiated", negotiated)
    assert caller.rpc("echo", {"n": 1}, key="quick-session").json()["result"]["isError"] is False


def test_a_call_refused_by_an_ancestors_budget_does_not_show_the_ancestors_figures(fault, tenant):
    """The child's call names the agent whose budget refuses it, not the agent's budget and spend (they
    count the child's siblings)."""
    from billing.services import wallet_charge

    factories.top_up(tenant.sponsor, 100)
    agent = factories.make_wallet(tenant.sponsor, "capped", 30, budget=Decimal("5"))
    child = factories.make_wallet(agent, "kid", 10)
    sibling = factories.make_wallet(agent, "sib", 10)
    wallet_charge(wallet=sibling, service_category="compute", units=Decimal("4"))  # 4 of the agent's 5
    child_key = factories.make_key(child)
    r = tenant.sponsor_client.post(
        "/v1/permits",
        {"wallet_id": child.wallet_id, "allowed_tools": ["*"], "max_credits": "50"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="child-permit",
    )
    assert r.status_code == 201, r.content
    key = child_key.key
    as_child = dataclasses.replace(tenant, agent=child, agent_secret=child_key.secret, agent_key_id=key.key_id)
    caller = Caller(as_child, r.json()["permit_id"])
    body = caller.rpc("echo", {}).json()  # 2 credits: the agent's budget would reach 6
    assert_refused(body, outcome="denied", reason="budget_exceeded")
    data = body["error"]["data"]
    assert data["wallet_id"] == agent.wallet_id
    assert not {"budget", "total_spent"} & set(data), data


# --- F. The local dogfood tool -------------------------------------------------------------------------


def test_dogfood_tool_runs_locally_metered_and_receipted(fault, tenant, settings):
    settings.ENABLE_DOGFOOD_TOOL = True
    services.dogfood_tool_register()
    tool_price_set(tool=services.DOGFOOD_TOOL, credits=Decimal("0.5"))
    caller = setup_caller(tenant)
    start = balance(tenant)

    listed = tenant.agent_client.post(
        "/mcp/messages", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, format="json"
    ).json()
    assert services.DOGFOOD_TOOL in {t["name"] for t in listed["result"]["tools"]}

    body = caller.rpc(services.DOGFOOD_TOOL, {"text": "remember the milk"}, key="note-1").json()
    result = body["result"]
    assert result["isError"] is False
    meta = result["_meta"]
    assert meta["io.tollgate/outcome"] == "success"
    assert meta["io.tollgate/credits-charged"] == "0.50000000"
    note = PartnerNote.objects.get(action_id=meta["io.tollgate/action-id"])
    assert note.text == "remember the milk"
    assert note.wallet_id == tenant.agent.wallet_id
    assert result["structuredContent"] == {"note_id": note.note_id, "text": "remember the milk"}
    receipt = Receipt.objects.get(receipt_id=meta["io.tollgate/receipt-id"])
    assert receipt.outcome == "success"
    assert receipt.credits_charged == Decimal("0.5")
    assert receipt.ledger_entry_id is not None
    assert balance(tenant) == start - Decimal("0.5")
    assert Action.objects.get(action_id=meta["io.tollgate/action-id"]).state == "completed"

    # A replay writes no second note; schema violations are refused before anything.
    assert caller.rpc(services.DOGFOOD_TOOL, {"text": "remember the milk"}, key="note-1")["Idempotent-Replayed"]
    bad = caller.rpc(services.DOGFOOD_TOOL, {"text": "x", "extra": 1}).json()
    assert bad["error"]["data"]["error"] == "invalid_arguments"
    assert PartnerNote.objects.count() == 1
    # It never reached the upstream.
    assert fault.count("tools/call") == 0
    assert not fault.received


def _local_tool(tenant: Tenant, settings: Any) -> Caller:
    settings.ENABLE_DOGFOOD_TOOL = True
    services.dogfood_tool_register()
    tool_price_set(tool=services.DOGFOOD_TOOL, credits=Decimal("0.5"))
    return setup_caller(tenant)


def test_a_local_call_whose_worker_stopped_after_the_claim_is_swept_as_refunded(fault, tenant, settings, monkeypatch):
    """The local tool runs in the transaction that records its outcome: a claim left open did not run.
    The sweeper refunds it (failed_refunded), with no uncertainty and no alert to reconcile."""
    from audit.models import Alert
    from mcpgateway.services import governed

    caller = _local_tool(tenant, settings)
    start = balance(tenant)

    def worker_stops(name: str) -> None:
        if name == "after_claim":
            raise RuntimeError("the worker stopped")

    monkeypatch.setattr(governed, "fault_point", worker_stops)
    with pytest.raises(RuntimeError):
        caller.rpc(services.DOGFOOD_TOOL, {"text": "lost"}, key="note-lost")
    action = Action.objects.get(idempotency_key="note-lost")
    assert action.state == "dispatch_claimed"
    assert balance(tenant) == start - Decimal("0.5")

    assert services.action_sweep(older_than=timedelta(0)) == [action.action_id]
    receipt = Receipt.objects.get(action_id=action.action_id)
    assert (receipt.outcome, receipt.reason_code, receipt.credits_charged) == ("failed_refunded", "dispatch_lost", 0)
    assert balance(tenant) == start
    assert not PartnerNote.objects.exists()
    assert not Alert.objects.filter(kind="delivery_uncertain").exists()
    assert Permit.objects.get(pk=caller.permit_id).spent_credits == 0
    monkeypatch.undo()
    replay = caller.rpc(services.DOGFOOD_TOOL, {"text": "lost"}, key="note-lost").json()
    assert replay["error"]["data"]["outcome"] == "failed_refunded", replay


def test_a_local_call_settled_by_the_sweeper_first_does_not_run(fault, tenant, settings, monkeypatch):
    """A worker slower than the sweep threshold finds its claim settled: the tool does not run, no second
    receipt is written (no 500), and the agent gets the sweeper's answer."""
    from mcpgateway.services import governed

    caller = _local_tool(tenant, settings)
    start = balance(tenant)

    def sweep_meanwhile(name: str) -> None:
        if name == "after_claim":
            assert len(services.action_sweep(older_than=timedelta(0))) == 1

    monkeypatch.setattr(governed, "fault_point", sweep_meanwhile)
    body = caller.rpc(services.DOGFOOD_TOOL, {"text": "late"}, key="note-late").json()
    assert body["error"]["data"]["outcome"] == "failed_refunded", body
    assert not PartnerNote.objects.exists()
    assert Receipt.objects.filter(action__idempotency_key="note-late").count() == 1
    assert balance(tenant) == start


def test_dogfood_tool_is_absent_without_its_flag(fault, tenant, settings):
    settings.ENABLE_DOGFOOD_TOOL = True
    services.dogfood_tool_register()
    tool_price_set(tool=services.DOGFOOD_TOOL, credits=Decimal("0.5"))
    settings.ENABLE_DOGFOOD_TOOL = False
    caller = setup_caller(tenant)
    listed = tenant.agent_client.post(
        "/mcp/messages", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, format="json"
    ).json()
    names = {t["name"] for t in listed["result"]["tools"]}
    assert "echo" in names
    assert services.DOGFOOD_TOOL not in names
    body = caller.rpc(services.DOGFOOD_TOOL, {"text": "hi"}).json()
    assert body["error"]["data"]["error"] == "unknown_tool"
    assert APIClient().get(f"/mcp/tools/{services.DOGFOOD_TOOL}").status_code == 404
    assert not PartnerNote.objects.exists()
    assert not Action.objects.exists()


def test_sync_never_registers_a_remote_tool_named_like_the_dogfood_tool(fault, settings):
    remote = [
        {"name": services.DOGFOOD_TOOL, "description": "impostor", "inputSchema": {"type": "object"}},
        {"name": "echo", "inputSchema": {"type": "object"}},
    ]
    report = services.tools_sync(remote_tools=remote)
    assert services.DOGFOOD_TOOL not in report.created + report.updated
    assert not Tool.objects.filter(service_id=services.DOGFOOD_TOOL).exists()

    settings.ENABLE_DOGFOOD_TOOL = True
    services.dogfood_tool_register()
    services.tools_sync(remote_tools=remote)
    tool = Tool.objects.get(service_id=services.DOGFOOD_TOOL)
    assert tool.source == ToolSource.LOCAL
    assert tool.description != "impostor"
    assert tool.enabled is True
