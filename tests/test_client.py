"""The Python client (client/tollgate_client) against a live gunicorn gateway and the SDK demo upstream.

One gateway and one upstream serve the whole live test (it is a single function
in sections, to stay fast). The offline tests drive the client's retry and
error-mapping rules through ``httpx.MockTransport``.
"""

from __future__ import annotations

import copy
import json
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))

from tollgate_client import (
    AuthenticationError,
    Conflict,
    DecisionTimeout,
    InsufficientFunds,
    NotFound,
    PermissionDenied,
    PermitRequestNotApproved,
    Policy,
    PolicyChangeProposal,
    RateLimited,
    ServerError,
    TollgateClient,
    TransportError,
    ValidationError,
    verify_portable_offline,
    verify_portable_standalone,
)

from tests import factories
from tests.conftest import make_tenant
from tests.gateway_helpers import register_upstream
from tests.live import running_gateway
from tests.upstream_server import free_port, running_demo_upstream


def _approver(username: str, sponsor_wallet_id: str) -> Any:
    from django.contrib.auth import get_user_model

    from billing.models import Wallet
    from permits.models import TenantApprover

    user = get_user_model().objects.create_user(username=username, password="pw-correct-horse")
    TenantApprover.objects.create(user=user, tenant=Wallet.objects.get(wallet_id=sponsor_wallet_id))
    return user


def _decide(request_id: str, user: Any, *, approve: bool, note: str = "") -> None:
    from permits.services import permit_request_decide

    permit_request_decide(request_id=request_id, user=user, approve=approve, note=note)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_client_against_a_live_gateway(tmp_path):
    with running_demo_upstream() as demo:
        register_upstream(demo.url, price="0.5")
        operator_secret = factories.make_operator_key().secret
        other = make_tenant("client-other")
        with running_gateway(tmp_path, UPSTREAM_MCP_URL=demo.url) as gw, TollgateClient(gw.url, operator_secret) as op:
            _live_sections(op, gw.url, demo.stats_url, other)


def _live_sections(op: TollgateClient, url: str, stats_url: str, other: Any) -> None:
    # --- wallets (operator) ------------------------------------------------------------------
    sponsor = op.wallets.create_sponsor("client-sponsor", initial_credits="100")
    assert sponsor.wallet_id.startswith("spn_")
    assert sponsor.wallet_type == "sponsor"
    assert sponsor.balance == Decimal("100")
    agent = op.wallets.create_agent(sponsor.wallet_id, "client-agent", initial_balance=20)
    assert agent.wallet_id.startswith("agt_")
    assert agent.parent_wallet_id == sponsor.wallet_id
    assert agent.tenant_id == sponsor.wallet_id
    assert op.wallets.get(agent.wallet_id).balance == Decimal("20")
    sponsors = op.wallets.list(wallet_type="sponsor", limit=200)
    assert sponsor.wallet_id in {w.wallet_id for w in sponsors}
    assert all(w.wallet_type == "sponsor" for w in sponsors)
    ledger = op.wallets.ledger(agent.wallet_id, limit=5)
    assert ledger["wallet_id"] == agent.wallet_id
    assert Decimal(ledger["balance"]) == Decimal("20")
    assert ledger["total"] >= 1
    pricing = op.wallets.pricing()
    assert {"tool": "notes.append", "credits_per_call": "0.50000000"} in pricing["tools"]

    # --- API keys ----------------------------------------------------------------------------
    sponsor_key = op.keys.create(sponsor.wallet_id, "sponsor-ops")
    assert sponsor_key.secret is not None
    assert sponsor_key.secret.startswith("tg_")
    assert sponsor_key.secret not in repr(sponsor_key)
    first_agent_key = op.keys.create(agent.wallet_id, "agent-1")
    assert first_agent_key.secret is not None
    rotation = op.keys.rotate(agent.wallet_id, first_agent_key.key_id, reason="scheduled")
    assert rotation.old_key_id == first_agent_key.key_id
    assert rotation.old_key_revoked is True
    agent_secret = rotation.new_key.secret
    assert agent_secret is not None
    assert agent_secret != first_agent_key.secret
    spare = op.keys.create(agent.wallet_id, "spare")
    op.keys.revoke(agent.wallet_id, spare.key_id, reason="unused")
    listed = {k.key_id: k for k in op.keys.list(agent.wallet_id)}
    assert listed[first_agent_key.key_id].status == "revoked"
    assert listed[spare.key_id].status == "revoked"
    assert listed[spare.key_id].revoke_reason == "unused"
    assert listed[rotation.new_key.key_id].status == "active"
    assert all(k.secret is None for k in listed.values())
    actions = {e["action"] for e in op.keys.logs(agent.wallet_id, limit=50)}
    assert {"created", "rotated", "revoked"} <= actions
    with op.with_api_key(first_agent_key.secret) as stale, pytest.raises(AuthenticationError) as stale_err:
        stale.me.authority()
    assert stale_err.value.status == 401
    assert stale_err.value.code == "invalid_api_key"

    throwaway = op.wallets.create_agent(sponsor.wallet_id, "throwaway")
    op.keys.create(throwaway.wallet_id, "t1")
    op.keys.create(throwaway.wallet_id, "t2")
    drill = op.keys.emergency_revoke(throwaway.wallet_id, reason="drill")
    assert drill.revoked_count == 2
    assert drill.reason == "drill"
    assert {k.status for k in op.keys.list(throwaway.wallet_id)} == {"revoked"}

    with op.with_api_key(sponsor_key.secret) as sp, op.with_api_key(agent_secret) as ag:
        _authority_sections(op, sp, ag, sponsor.wallet_id, agent.wallet_id, stats_url, other)

    # --- a gateway that is not there: nothing was sent, the key is kept for a retry -----------
    with TollgateClient(f"http://127.0.0.1:{free_port()}", agent_secret, max_retries=1) as gone:
        with pytest.raises(TransportError) as gone_err:
            gone.call_tool("notes.append", {"text": "x"}, permit_id="pmt_x", idempotency_key="kept-key")
        assert gone_err.value.sent is False
        assert gone_err.value.idempotency_key == "kept-key"
        assert gone_err.value.status is None


def _authority_sections(
    op: TollgateClient,
    sp: TollgateClient,
    ag: TollgateClient,
    sponsor_id: str,
    agent_id: str,
    stats_url: str,
    other: Any,
) -> None:
    # --- wallet settings (an extension): the sponsor sets, the agent only lowers --------------------
    limited = sp.wallets.update(agent_id, daily_limit="500")
    assert limited.daily_limit == Decimal("500")
    assert limited.raw["changes"]["daily_limit"]["after"] == "500.00000000"
    assert ag.wallets.update(agent_id, daily_limit=Decimal("400")).daily_limit == Decimal("400")
    with pytest.raises(PermissionDenied):
        ag.wallets.update(agent_id, daily_limit=None)

    # --- permits (issued by the sponsor key) ---------------------------------------------------
    permit = sp.permits.issue(agent_id, ["notes.append", "math.add"], "5", max_calls=10)
    assert permit.permit_id.startswith("pmt_")
    assert permit.wallet_id == agent_id
    assert permit.issuer_wallet_id == sponsor_id
    assert permit.status == "active"
    assert permit.max_credits == Decimal("5")
    assert permit.signature
    assert permit.signed_statement["type"] == "permit"
    again = sp.permits.issue(agent_id, ["notes.*"], "1", idempotency_key="client-fixed-permit")
    assert sp.permits.issue(agent_id, ["notes.*"], "1", idempotency_key="client-fixed-permit") == again
    assert again.allowed_servers is None
    assert sp.permits.issue(agent_id, ["notes.*"], "1", allowed_servers=["demo"]).allowed_servers == ["demo"]
    assert ag.permits.get(permit.permit_id).permit_id == permit.permit_id
    assert permit.permit_id in {p.permit_id for p in sp.permits.list(wallet_id=agent_id)}
    by_id = ag.permits.verify(permit.permit_id)
    assert by_id.valid
    assert by_id.signature_valid
    assert by_id.reasons == []
    by_document = ag.permits.verify(statement=permit.signed_statement, signature=permit.signature)
    assert by_document.valid

    # --- quotes and the catalog ---------------------------------------------------------------
    quote = ag.quotes.create(agent_id, "notes.append")
    assert quote.quote_id.startswith("qt_")
    assert quote.quoted_credits == Decimal("0.5")
    assert quote.status == "active"
    assert ag.quotes.get(quote.quote_id).quote_id == quote.quote_id
    assert quote.quote_id in {q.quote_id for q in ag.quotes.list_mine(status="active")}
    manifest = ag.tools.manifest()
    assert manifest.version == "1.3.0"
    by_name = {t.name: t for t in manifest.tools}
    assert by_name["notes.append"].price_credits == Decimal("0.5")
    assert by_name["notes.append"].callable is True
    page = ag.tools.list(limit=2)
    assert len(page) == 2
    assert page.total >= len(by_name)
    assert "a" in ag.tools.get("math.add").input_schema.get("properties", {})

    # --- governed calls -----------------------------------------------------------------------
    first = ag.call_tool(
        "notes.append", {"text": "from the client"}, permit_id=permit.permit_id, quote_id=quote.quote_id
    )
    assert first.ok, first
    assert first.outcome == "success"
    assert first.replayed is False
    assert first.receipt_id.startswith("rcpt_")
    assert first.action_id.startswith("act_")
    assert first.credits_charged == Decimal("0.5")
    assert first.structured_content is not None
    assert first.structured_content["text"] == "from the client"
    assert first.error is None
    replay = ag.call_tool(
        "notes.append",
        {"text": "from the client"},
        permit_id=permit.permit_id,
        quote_id=quote.quote_id,
        idempotency_key=first.idempotency_key,
    )
    assert replay.replayed is True
    assert replay.receipt_id == first.receipt_id
    assert replay.result == {**(first.result or {}), "_meta": {**(first.result or {})["_meta"], **_replayed_meta()}}
    stats = httpx.get(stats_url).json()
    assert stats["tool_calls"]["notes.append"] == 1
    assert stats["sightings"][-1]["header_key"] == f"{agent_id}:{first.idempotency_key}"
    assert ag.quotes.get(quote.quote_id).status == "consumed"

    with pytest.raises(ValidationError) as reused:
        ag.call_tool(
            "notes.append", {"text": "different"}, permit_id=permit.permit_id, idempotency_key=first.idempotency_key
        )
    assert reused.value.code == "idempotency_key_reused"
    assert reused.value.errors[0]["type"] == "idempotency_key_reused"
    with pytest.raises(ValidationError) as unknown:
        ag.call_tool("no.such.tool", {}, permit_id=permit.permit_id)
    assert unknown.value.code == "unknown_tool"
    with pytest.raises(PermissionDenied) as operator_call:
        op.call_tool("math.add", {"a": 1, "b": 2}, permit_id=permit.permit_id)
    assert operator_call.value.code == "wallet_key_required"

    denied = ag.call_tool("clock.now", {}, permit_id=permit.permit_id)  # not in allowed_tools: a receipt, no raise
    assert denied.outcome == "denied"
    assert not denied.ok
    assert denied.receipt_id.startswith("rcpt_")
    assert denied.reason_code
    assert denied.error is not None
    assert denied.error["data"]["receipt_id"] == denied.receipt_id
    denied_receipt = ag.receipts.get(denied.receipt_id)
    assert denied_receipt.outcome == "denied"
    assert denied_receipt.credits_charged == Decimal(0)
    assert stats["tool_calls"].get("clock.now", 0) == httpx.get(stats_url).json()["tool_calls"].get("clock.now", 0)

    summed = ag.call_tool("math.add", {"a": 2, "b": 3}, permit_id=permit.permit_id)
    assert summed.ok
    assert summed.structured_content is not None

    # --- receipts, evidence, portable and offline verification -----------------------------------
    receipt = ag.receipts.get(first.receipt_id)
    assert receipt.outcome == "success"
    assert receipt.permit_id == permit.permit_id
    assert receipt.credits_charged == Decimal("0.5")
    assert receipt.quote_id == quote.quote_id
    evidence = ag.receipts.evidence(first.receipt_id)
    assert evidence.verified is True, evidence.verification
    assert evidence.receipt.receipt_id == first.receipt_id
    assert evidence.verification["receipt_signature"] == "ok"
    assert evidence.ledger_entry is not None
    portable = ag.receipts.portable(first.receipt_id)
    verdict = verify_portable_offline(portable)
    assert verdict.valid, verdict
    assert (verdict.receipt_id, verdict.outcome) == (first.receipt_id, "success")
    assert ag.receipts.verify_portable_offline(portable).valid
    jwks = ag.signing_keys.jwks()
    assert verify_portable_offline(portable, jwks).valid
    assert ag.signing_keys.active()["key_id"] == portable["kid"]
    _check_offline_verifiers_agree(portable, jwks)
    assert ag.receipts.verify(first.receipt_id).valid
    assert ag.receipts.verify(statement=receipt.signed_statement, signature=receipt.signature).valid
    of_permit = {r.receipt_id for r in ag.receipts.list(permit_id=permit.permit_id)}
    assert {first.receipt_id, denied.receipt_id, summed.receipt_id} <= of_permit
    assert {r.receipt_id for r in sp.permits.receipts(permit.permit_id)} == of_permit

    # --- /v1/me --------------------------------------------------------------------------------
    authority = ag.me.authority()
    assert authority.wallet_id == agent_id
    assert authority.wallet_type == "agent"
    assert permit.permit_id in {p.permit_id for p in authority.active_permits}
    assert authority.balance == Decimal("20") - Decimal("0.5") - Decimal("0.5")
    assert permit.permit_id in {p.permit_id for p in ag.me.permits(status="active")}
    assert first.receipt_id in {r.receipt_id for r in ag.me.receipts(outcome="success")}
    assert quote.quote_id in {q.quote_id for q in ag.me.quotes()}
    assert ag.me.alerts(limit=10).limit == 10
    assert ag.me.audit_events(limit=5).total >= 1
    with pytest.raises(PermissionDenied) as operator_me:
        op.me.authority()
    assert operator_me.value.code == "wallet_key_required"

    # --- charges ------------------------------------------------------------------------------
    charge = ag.wallets.charge(agent_id, service_category="compute", units="1", idempotency_key="client-charge-1")
    assert charge["wallet_id"] == agent_id
    again_charge = ag.wallets.charge(agent_id, service_category="compute", units="1", idempotency_key="client-charge-1")
    assert again_charge["entry_id"] == charge["entry_id"]

    # --- policies (sponsor) ---------------------------------------------------------------------
    policy = sp.policies.create(sponsor_id, name="caps", max_credits_per_call="2", denied_tools=["demo.stats"])
    assert policy.policy_id.startswith("pol_")
    assert policy.max_credits_per_call == Decimal("2")
    assert policy.denied_tools == ["demo.stats"]
    assert sp.policies.get(policy.policy_id).name == "caps"
    assert policy.policy_id in {p.policy_id for p in sp.policies.list(wallet_id=sponsor_id)}
    patched = sp.policies.patch(policy.policy_id, max_credits_per_call="3")
    assert isinstance(patched, Policy)
    assert patched.max_credits_per_call == Decimal("3")
    servers = sp.policies.create(sponsor_id, name="servers", enabled=False, allowed_servers=["demo"])
    assert (servers.allowed_servers, sp.policies.get(servers.policy_id).allowed_servers) == (["demo"], ["demo"])
    assert patched.version > policy.version
    # Relaxing human approval is a proposal a second person confirms in the console (on a wallet of
    # its own: approval on the sponsor's line would revoke the permits the sections below use).
    gated_wallet = op.wallets.create_agent(sponsor_id, "client-gated")
    gated = sp.policies.create(gated_wallet.wallet_id, human_approval_required=True)
    proposal = sp.policies.patch(gated.policy_id, human_approval_required=False)
    assert isinstance(proposal, PolicyChangeProposal)
    assert (proposal.pending, proposal.relaxes, proposal.policy_version) == (True, ["human_approval_required"], 1)
    still = sp.policies.get(gated.policy_id)
    assert (still.human_approval_required, still.version) == (True, 1)

    # --- permit requests and a human decision -------------------------------------------------------
    preq = ag.permit_requests.create(agent_id, ["math.add"], "2", justification="nightly sums")
    assert preq.request_id.startswith("preq_")
    assert preq.status == "pending"
    assert (preq.permit, preq.allowed_servers) == (None, None)
    assert ag.permit_requests.get(preq.request_id).pending
    assert "nightly sums" in ag.permit_requests.card(preq.request_id)
    with pytest.raises(DecisionTimeout):
        ag.permit_requests.wait_for_decision(preq.request_id, timeout=0.3, interval=0.1)
    approver = _approver("client-approver", sponsor_id)
    _decide(preq.request_id, approver, approve=True, note="fine")
    granted = ag.permit_requests.wait_for_decision(preq.request_id, timeout=10, interval=0.1)
    assert granted.permit_id.startswith("pmt_")
    assert granted.issued_via_request_id == preq.request_id
    assert granted.allowed_tools == ["math.add"]
    assert ag.call_tool("math.add", {"a": 1, "b": 1}, permit_id=granted.permit_id).ok
    refused = ag.permit_requests.create(
        agent_id, ["notes.append"], "50", justification="too much", allowed_servers=["demo"]
    )
    assert (refused.allowed_servers, ag.permit_requests.get(refused.request_id).allowed_servers) == (["demo"], ["demo"])
    _decide(refused.request_id, approver, approve=False, note="no")
    with pytest.raises(PermitRequestNotApproved) as not_approved:
        ag.permit_requests.wait_for_decision(refused.request_id, timeout=10, interval=0.1)
    assert not_approved.value.code == "rejected"
    assert not_approved.value.permit_request.decision_note == "no"

    # --- revocation: the next call is a denial with a receipt ----------------------------------------
    assert sp.permits.revoke(permit.permit_id).status == "revoked"
    after = ag.call_tool("notes.append", {"text": "late"}, permit_id=permit.permit_id)
    assert after.outcome == "denied"
    assert not ag.permits.verify(permit.permit_id).valid

    # --- error mapping ------------------------------------------------------------------------------
    with op.with_api_key("tg_keyunknown_" + "x" * 40) as bad, pytest.raises(AuthenticationError) as unauthenticated:
        bad.wallets.list()
    assert unauthenticated.value.status == 401
    with op.with_api_key(None) as anonymous, pytest.raises(AuthenticationError) as missing:
        anonymous.receipts.list()
    assert missing.value.code == "not_authenticated"
    with pytest.raises(NotFound) as not_found:
        ag.receipts.get("rcpt_doesnotexist")
    assert not_found.value.status == 404
    assert not_found.value.code == "not_found"
    with op.with_api_key(other.agent_secret) as stranger, pytest.raises(NotFound):
        stranger.receipts.get(first.receipt_id)  # another tenant: existence does not leak
    with pytest.raises(ValidationError) as invalid:
        ag.receipts.list(limit=500)
    assert invalid.value.status == 422
    assert invalid.value.errors
    assert invalid.value.errors[0]["loc"] == ["query", "limit"]
    assert {"loc", "msg", "type"} <= set(invalid.value.errors[0])
    with pytest.raises(PermissionDenied) as not_operator:
        ag.wallets.create_sponsor("nope")
    assert not_operator.value.status == 403
    assert not_operator.value.code == "operator_key_required"
    with pytest.raises(PermissionDenied) as out_of_reach:
        ag.wallets.get(other.agent.wallet_id)
    assert out_of_reach.value.code == "wallet_access_denied"
    with pytest.raises(InsufficientFunds) as poor:
        sp.wallets.create_agent(sponsor_id, "too-rich", initial_balance="100000")
    assert poor.value.status == 402
    assert poor.value.shortfall is not None
    assert poor.value.shortfall > 0


def _replayed_meta() -> dict[str, Any]:
    return {"io.tollgate/replayed": True}


def _check_offline_verifiers_agree(portable: dict[str, Any], jwks: dict[str, Any]) -> None:
    """The checkout's verifier and the client's standalone copy give the same verdicts."""
    from receipts.verify import verify_portable

    def tampered(change: Any) -> dict[str, Any]:
        doc = copy.deepcopy(portable)
        change(doc)
        return doc

    cases: list[tuple[Any, Any]] = [
        (portable, None),
        (portable, jwks),
        (portable, {"keys": []}),
        (tampered(lambda d: d["receipt"].update(outcome="denied")), None),
        (
            tampered(
                lambda d: d.update(signature=d["signature"][:-2] + ("AA" if d["signature"][-2:] != "AA" else "BA"))
            ),
            None,
        ),
        (tampered(lambda d: d.update(kid="sig_other")), None),
        (tampered(lambda d: d.update(format="v0")), None),
        (tampered(lambda d: d.update(signed_bytes=d["signed_bytes"] + "=")), None),
        ("not a document", None),
        # Unsigned fields that restate the signed statement must agree with it (a reader of the top-level
        # receipt_id could be shown another receipt's id).
        (tampered(lambda d: d.update(receipt_id="rcpt_someoneelse")), None),
        (tampered(lambda d: d.update(signed_bytes_sha256="0" * 64)), None),
        (tampered(lambda d: d.update(alg="none")), None),
    ]
    expected_reasons = [
        None,
        None,
        "unknown_kid",
        "receipt_differs_from_signed_bytes",
        "bad_signature",
        "kid_mismatch",
        "unknown_format",
        "malformed_signed_bytes",
        "not_an_object",
        "receipt_id_differs_from_signed_bytes",
        "signed_bytes_sha256_differs_from_signed_bytes",
        "alg_differs_from_signed_bytes",
    ]
    for (doc, keys), reason in zip(cases, expected_reasons, strict=True):
        reference = verify_portable(doc, keys)
        standalone = verify_portable_standalone(doc, keys)
        assert (standalone.valid, standalone.reason) == (reference.valid, reference.reason) == (reason is None, reason)
        assert (standalone.receipt_id, standalone.kid, standalone.outcome) == (
            reference.receipt_id,
            reference.kid,
            reference.outcome,
        )


# --- offline: retry and error-mapping rules through a mock transport -----------------------------------


def _rpc(body: dict[str, Any], rid: Any, **kwargs: Any) -> httpx.Response:
    return httpx.Response(200, json={"jsonrpc": "2.0", "id": rid, **body}, **kwargs)


def test_call_tool_retries_in_progress_and_unsent_requests_with_the_same_key():
    seen: list[dict[str, Any]] = []
    headers_seen: list[httpx.Headers] = []
    failures = {"connect": 1, "in_progress": 1}

    def handler(request: httpx.Request) -> httpx.Response:
        if failures["connect"]:
            failures["connect"] -= 1
            raise httpx.ConnectError("refused", request=request)
        message = json.loads(request.content)
        seen.append(message)
        headers_seen.append(request.headers)
        if failures["in_progress"]:
            failures["in_progress"] -= 1
            data = {"error": "idempotency_key_in_progress", "message": "busy", "retry_after_seconds": 0}
            return _rpc({"error": {"code": -32009, "message": "busy", "data": data}}, message["id"])
        result = {
            "content": [{"type": "text", "text": "ok"}],
            "structuredContent": {"ok": True},
            "isError": False,
            "_meta": {
                "io.tollgate/receipt-id": "rcpt_1",
                "io.tollgate/action-id": "act_1",
                "io.tollgate/outcome": "success",
                "io.tollgate/credits-charged": "0.50000000",
                "io.tollgate/replayed": False,
            },
        }
        return _rpc({"result": result}, message["id"])

    with TollgateClient("http://gw.test", "tg_k", transport=httpx.MockTransport(handler), max_retry_wait=0) as tg:
        result = tg.call_tool("notes.append", {"text": "hi"}, permit_id="pmt_1", quote_id="qt_1")
    assert result.ok
    assert result.credits_charged == Decimal("0.5")
    assert result.content == [{"type": "text", "text": "ok"}]
    assert len(seen) == 2
    keys = {m["params"]["_meta"]["idempotency_key"] for m in seen}
    assert keys == {result.idempotency_key}
    meta = seen[0]["params"]["_meta"]
    assert meta["permit_id"] == "pmt_1"
    assert meta["quote_id"] == "qt_1"
    assert seen[0]["method"] == "tools/call"
    for headers in headers_seen:
        assert headers["MCP-Protocol-Version"] == "2026-07-28"
        assert headers["Mcp-Method"] == "tools/call"
        assert headers["Mcp-Name"] == "notes.append"
        assert headers["X-API-Key"] == "tg_k"
        assert "Mcp-Session-Id" not in headers


def test_call_tool_does_not_resend_after_a_possibly_delivered_request():
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content)["params"]["_meta"]["idempotency_key"])
        raise httpx.ReadTimeout("no answer", request=request)

    with (
        TollgateClient("http://gw.test", "tg_k", transport=httpx.MockTransport(handler)) as tg,
        pytest.raises(TransportError) as err,
    ):
        tg.call_tool("notes.append", {"text": "hi"}, permit_id="pmt_1", idempotency_key="mine")
    assert calls == ["mine"]
    assert err.value.sent is True
    assert err.value.idempotency_key == "mine"


def test_call_tool_gives_up_on_in_progress_and_reports_outcomes_without_raising():
    def handler(request: httpx.Request) -> httpx.Response:
        message = json.loads(request.content)
        if message["params"]["name"] == "busy":
            data = {"error": "idempotency_key_in_progress", "message": "busy", "retry_after_seconds": 2}
            return _rpc({"error": {"code": -32009, "message": "busy", "data": data}}, message["id"])
        data = {
            "error": "delivery_uncertain",
            "outcome": "delivery_uncertain",
            "receipt_id": "rcpt_9",
            "action_id": "act_9",
            "replayed": True,
        }
        return _rpc({"error": {"code": -32005, "message": "uncertain", "data": data}}, message["id"])

    with TollgateClient(
        "http://gw.test", "tg_k", transport=httpx.MockTransport(handler), max_retries=1, max_retry_wait=0
    ) as tg:
        with pytest.raises(Conflict) as busy:
            tg.call_tool("busy", {}, permit_id="pmt_1")
        assert busy.value.status == 409
        assert busy.value.retry_after == 2
        uncertain = tg.call_tool("slow", {}, permit_id="pmt_1")
    assert uncertain.outcome == "delivery_uncertain"
    assert uncertain.replayed is True
    assert uncertain.reason_code == "delivery_uncertain"
    assert uncertain.result is None


def test_http_errors_map_to_the_exception_hierarchy():
    answers = {
        "/v1/receipts/rcpt_rl": httpx.Response(
            429,
            json={"detail": {"error": "rate_limited", "message": "slow down", "retry_after_seconds": 7}},
            headers={"Retry-After": "7"},
        ),
        "/v1/receipts/rcpt_500": httpx.Response(500, json={"detail": {"error": "internal_error", "message": "x"}}),
        "/v1/receipts/rcpt_502": httpx.Response(502, text="<html>bad gateway</html>"),
        "/v1/receipts/rcpt_409": httpx.Response(409, json={"detail": {"error": "conflict", "message": "c"}}),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        return answers[request.url.path]

    with TollgateClient("http://gw.test", "tg_k", transport=httpx.MockTransport(handler)) as tg:
        with pytest.raises(RateLimited) as limited:
            tg.receipts.get("rcpt_rl")
        assert limited.value.retry_after == 7
        with pytest.raises(ServerError) as internal:
            tg.receipts.get("rcpt_500")
        assert internal.value.code == "internal_error"
        with pytest.raises(ServerError) as proxy:
            tg.receipts.get("rcpt_502")
        assert proxy.value.status == 502
        with pytest.raises(Conflict):
            tg.receipts.get("rcpt_409")
