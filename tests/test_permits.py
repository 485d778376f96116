# mypy: disable-error-code="union-attr"
"""Permits, allowance reservations, quotes, policies and /v1/me (spec "Permits, permit requests, quotes")."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from audit.models import AuditEvent
from audit.signing import sign_statement
from billing import services as billing_services
from billing.models import LedgerEntry, Wallet
from permits import services
from permits.exceptions import PermitExhausted, QuoteUnavailable
from permits.models import Permit, Quote
from permits.services import permits as permit_module
from tests import factories
from tests.conftest import client_for, make_tenant

pytestmark = pytest.mark.django_db

IDEM = "HTTP_IDEMPOTENCY_KEY"


def issue(client, wallet_id, key="k1", **extra):
    body = {"wallet_id": wallet_id, "allowed_tools": ["demo.echo"], "max_credits": "10", **extra}
    return client.post("/v1/permits", body, format="json", **{IDEM: key})


# --- Issuing ----------------------------------------------------------------------------


def test_sponsor_issues_a_signed_permit_for_its_agent(tenant):
    r = issue(tenant.sponsor_client, tenant.agent.wallet_id, max_calls=3)
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["permit_id"].startswith("pmt_")
    assert body["wallet_id"] == tenant.agent.wallet_id
    assert body["issuer_wallet_id"] == tenant.sponsor.wallet_id
    assert body["status"] == "active"
    assert body["max_credits"] == "10.00000000"
    assert body["spent_credits"] == "0.00000000"
    assert body["max_calls"] == 3
    statement = body["signed_statement"]
    assert statement["type"] == "permit"
    assert statement["permit_id"] == body["permit_id"]
    assert statement["kid"] == body["key_id"]
    v = tenant.sponsor_client.post(
        "/v1/permits/verify", {"permit": statement, "signature": body["signature"]}, format="json"
    )
    assert v.json() == {
        "valid": True,
        "permit_id": body["permit_id"],
        "status": "active",
        "signature_valid": True,
        "key_id": body["key_id"],
        "reasons": [],
    }
    assert AuditEvent.objects.filter(event="permit.issued", wallet_id=tenant.agent.wallet_id).count() == 1


def test_idempotency_key_is_required_and_validated(tenant):
    body = {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["a"], "max_credits": "1"}
    r = tenant.sponsor_client.post("/v1/permits", body, format="json")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    r = tenant.sponsor_client.post("/v1/permits", body, format="json", **{IDEM: "x" * 256})
    assert r.status_code == 422
    assert not Permit.objects.exists()


def test_replay_returns_the_same_permit_and_other_input_is_a_conflict(tenant):
    first = issue(tenant.sponsor_client, tenant.agent.wallet_id, key="same")
    again = issue(tenant.sponsor_client, tenant.agent.wallet_id, key="same")
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["permit_id"] == first.json()["permit_id"]
    other = issue(tenant.sponsor_client, tenant.agent.wallet_id, key="same", max_credits="11")
    assert other.status_code == 422
    assert other.json()["detail"][0]["type"] == "idempotency_key_reused"
    assert Permit.objects.count() == 1


def test_concurrent_issues_with_one_key_mint_one_permit(transactional_db):
    t = make_tenant("race")
    results: list[int] = []

    def worker():
        try:
            results.append(issue(t.sponsor_client, t.agent.wallet_id, key="race-key").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == [201] * 8
    assert Permit.objects.filter(wallet=t.agent).count() == 1


def test_hierarchy_rule(tenant, other_tenant):
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    child = factories.make_wallet(tenant.agent, "child")
    # Agent for itself and its child: allowed.
    assert issue(tenant.agent_client, tenant.agent.wallet_id, key="a").status_code == 201
    assert issue(tenant.agent_client, child.wallet_id, key="b").status_code == 201
    # Agent for its parent or a sibling: refused.
    for target in (tenant.sponsor.wallet_id, sibling.wallet_id, other_tenant.agent.wallet_id):
        r = issue(tenant.agent_client, target, key=f"x-{target}")
        assert r.status_code == 403, target
        assert r.json()["detail"]["error"] == "wallet_access_denied"


def test_subject_key_binding_must_name_a_key_of_the_subject(tenant):
    r = issue(tenant.sponsor_client, tenant.agent.wallet_id, key="bind", subject_key_id=tenant.sponsor_key_id)
    assert r.status_code == 422
    ok = issue(tenant.sponsor_client, tenant.agent.wallet_id, key="bind2", subject_key_id=tenant.agent_key_id)
    assert ok.status_code == 201
    assert ok.json()["subject_key_id"] == tenant.agent_key_id


def test_validation_errors(tenant):
    bad: dict[str, Any]
    for bad in (
        {"allowed_tools": []},
        {"max_credits": "0"},
        {"max_credits": "-1"},
        {"expires_in_seconds": 10},
        {"max_calls": 0},
    ):
        r = issue(tenant.sponsor_client, tenant.agent.wallet_id, key=f"v{bad}", **bad)
        assert r.status_code == 422, bad


def test_human_approval_policy_blocks_direct_minting_by_wallet_keys(tenant, operator_client):
    services.policy_create(wallet=tenant.sponsor, human_approval_required=True)
    r = issue(tenant.sponsor_client, tenant.agent.wallet_id, key="h1")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "human_approval_required"
    assert issue(operator_client, tenant.agent.wallet_id, key="h2").status_code == 201


# --- Reading, revoking, verifying -----------------------------------------------------


def test_list_filters_and_tenant_isolation(tenant, other_tenant):
    a = issue(tenant.sponsor_client, tenant.agent.wallet_id, key="l1").json()
    issue(tenant.sponsor_client, tenant.sponsor.wallet_id, key="l2")
    issue(other_tenant.sponsor_client, other_tenant.agent.wallet_id, key="l3")
    c = tenant.sponsor_client
    assert c.get("/v1/permits").json()["total"] == 2
    assert c.get(f"/v1/permits?wallet_id={tenant.agent.wallet_id}").json()["total"] == 1
    assert tenant.agent_client.get("/v1/permits").json()["total"] == 1
    assert c.get("/v1/permits?status=revoked").json()["total"] == 0
    c.post(f"/v1/permits/{a['permit_id']}/revoke")
    assert c.get("/v1/permits?status=revoked").json()["total"] == 1
    assert c.get("/v1/permits?status=active").json()["total"] == 1
    future = (timezone.now() + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    assert c.get("/v1/permits", {"created_after": future}).json()["total"] == 0
    assert c.get("/v1/permits", {"expires_before": future}).json()["total"] == 2
    assert c.get("/v1/permits?created_after=yesterday").status_code == 422
    assert c.get("/v1/permits?status=bogus").status_code == 422
    # Another tenant's permit is invisible.
    assert other_tenant.sponsor_client.get(f"/v1/permits/{a['permit_id']}").status_code == 404
    assert other_tenant.sponsor_client.post(f"/v1/permits/{a['permit_id']}/revoke").status_code == 404


def test_revoke_returns_the_permit_and_verify_reports_it(tenant):
    p = issue(tenant.sponsor_client, tenant.agent.wallet_id).json()
    r = tenant.sponsor_client.post(f"/v1/permits/{p['permit_id']}/revoke")
    assert r.status_code == 200
    assert r.json()["status"] == "revoked"
    v = tenant.sponsor_client.post("/v1/permits/verify", {"permit_id": p["permit_id"]}, format="json").json()
    assert v["valid"] is False
    assert v["signature_valid"] is True
    assert v["reasons"] == ["revoked"]
    assert AuditEvent.objects.filter(event="permit.revoked").count() == 1


def test_tampered_permit_fails_verify(tenant):
    p = issue(tenant.sponsor_client, tenant.agent.wallet_id).json()
    forged = dict(p["signed_statement"], max_credits="1000000.00000000")
    v = tenant.sponsor_client.post("/v1/permits/verify", {"permit": forged, "signature": p["signature"]}, format="json")
    assert v.json()["valid"] is False
    assert "bad_signature" in v.json()["reasons"]
    unknown = dict(p["signed_statement"], kid="sig_unknown")
    v = tenant.sponsor_client.post(
        "/v1/permits/verify", {"permit": unknown, "signature": p["signature"]}, format="json"
    )
    assert "unknown_key" in v.json()["reasons"]
    v = tenant.sponsor_client.post("/v1/permits/verify", {"permit_id": "pmt_nope"}, format="json")
    assert v.json()["reasons"] == ["unknown_permit"]
    assert tenant.sponsor_client.post("/v1/permits/verify", {}, format="json").status_code == 422


@pytest.mark.parametrize("text", ["\ud800", "pmt_\x00", "sig_\udfff"])
def test_verifying_a_permit_document_with_text_that_cannot_be_stored_is_invalid_not_500(tenant, text):
    """NUL or a lone surrogate names no permit and no key: never queried, never echoed."""
    p = issue(tenant.sponsor_client, tenant.agent.wallet_id).json()
    for document in (
        {"type": "permit", "permit_id": text, "kid": text},
        {**p["signed_statement"], "permit_id": text},
        {**p["signed_statement"], "kid": text},
    ):
        body = json.dumps({"permit": document, "signature": p["signature"]})  # \u escapes the client cannot write
        v = tenant.sponsor_client.post("/v1/permits/verify", data=body, content_type="application/json")
        assert v.status_code == 200, v.content
        assert v.json()["valid"] is False
        assert v.json()["signature_valid"] is False
        assert v.json()["permit_id"] in (None, p["permit_id"])
        assert v.json()["key_id"] in (None, p["signed_statement"]["kid"])


def test_expired_and_exhausted_permits(tenant):
    p = issue(tenant.sponsor_client, tenant.agent.wallet_id, max_credits="2").json()
    permit = Permit.objects.get(permit_id=p["permit_id"])
    services.permit_reserve(permit=permit, amount=Decimal("2"))
    v = tenant.sponsor_client.post("/v1/permits/verify", {"permit_id": p["permit_id"]}, format="json").json()
    assert v["reasons"] == ["exhausted"]
    assert tenant.sponsor_client.get("/v1/permits?status=exhausted").json()["total"] == 1
    # Expired for real: the expiry column and the signed statement agree (re-signed as issued).
    Permit.objects.filter(pk=permit.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    permit.refresh_from_db()
    signed = sign_statement(permit_module._permit_statement(permit))
    Permit.objects.filter(pk=permit.pk).update(signed_statement=signed.statement, signature=signed.signature)
    v = tenant.sponsor_client.post("/v1/permits/verify", {"permit_id": p["permit_id"]}, format="json").json()
    assert v["reasons"] == ["expired"]
    # The expiry column moved without the statement is tampering: refused at use, reported here.
    Permit.objects.filter(pk=permit.pk).update(expires_at=timezone.now() + timedelta(days=30))
    v = tenant.sponsor_client.post("/v1/permits/verify", {"permit_id": p["permit_id"]}, format="json").json()
    assert "bad_signature" in v["reasons"]


# --- Allowance reservation --------------------------------------------------------------


def test_reserve_and_release(tenant):
    p = issue(tenant.sponsor_client, tenant.agent.wallet_id, max_credits="5", max_calls=2).json()
    permit = Permit.objects.get(permit_id=p["permit_id"])
    services.permit_reserve(permit=permit, amount=Decimal("3"))
    with pytest.raises(PermitExhausted):
        services.permit_reserve(permit=permit, amount=Decimal("3"))
    services.permit_reserve(permit=permit, amount=Decimal("2"))
    with pytest.raises(PermitExhausted):  # calls exhausted too
        services.permit_reserve(permit=permit, amount=Decimal("0"))
    services.permit_release(permit_id=permit.permit_id, amount=Decimal("3"))
    permit.refresh_from_db()
    assert permit.spent_credits == Decimal("2")
    assert permit.calls_used == 1


def test_concurrent_reservations_never_exceed_max_credits(transactional_db):
    t = make_tenant("burst")
    p = issue(t.sponsor_client, t.agent.wallet_id, max_credits="10").json()
    permit = Permit.objects.get(permit_id=p["permit_id"])
    ok: list[bool] = []
    barrier = threading.Barrier(20)

    def worker():
        barrier.wait()
        try:
            from django.db import transaction

            with transaction.atomic():
                services.permit_reserve(permit=permit, amount=Decimal("1"))
            ok.append(True)
        except PermitExhausted:
            ok.append(False)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    permit.refresh_from_db()
    assert ok.count(True) == 10
    assert permit.spent_credits == Decimal("10")
    assert permit.calls_used == 10


# --- Quotes -----------------------------------------------------------------------------


def test_quote_freezes_price_with_no_side_effect(tenant):
    billing_services.tool_price_set(tool="demo.echo", credits=Decimal("0.25"))
    before_balance = Wallet.objects.get(pk=tenant.agent.pk).balance
    before_entries = LedgerEntry.objects.count()
    r = tenant.agent_client.post(
        "/v1/quotes", {"wallet_id": tenant.agent.wallet_id, "tool": "demo.echo"}, format="json"
    )
    assert r.status_code == 201, r.content
    q = r.json()
    assert q["quoted_credits"] == "0.25000000"
    assert q["status"] == "active"
    assert q["signed_statement"]["type"] == "quote"
    # Changing the price later does not change the quote.
    billing_services.tool_price_set(tool="demo.echo", credits=Decimal("9"))
    assert tenant.agent_client.get(f"/v1/quotes/{q['quote_id']}").json()["quoted_credits"] == "0.25000000"
    assert Wallet.objects.get(pk=tenant.agent.pk).balance == before_balance
    assert LedgerEntry.objects.count() == before_entries
    active = tenant.agent_client.get("/v1/me/quotes?status=active").json()
    assert [i["quote_id"] for i in active["items"]] == [q["quote_id"]]
    assert tenant.agent_client.get("/v1/me/quotes?status=consumed").json()["total"] == 0


def test_unpriced_tool_cannot_be_quoted(tenant):
    r = tenant.agent_client.post("/v1/quotes", {"wallet_id": tenant.agent.wallet_id, "tool": "nope"}, format="json")
    assert r.status_code == 422
    assert r.json()["detail"][0]["type"] == "tool_price_not_set"
    assert not Quote.objects.exists()


def test_quote_for_a_wallet_the_caller_does_not_own(tenant, other_tenant):
    billing_services.tool_price_set(tool="demo.echo", credits=Decimal("1"))
    r = tenant.agent_client.post(
        "/v1/quotes", {"wallet_id": tenant.sponsor.wallet_id, "tool": "demo.echo"}, format="json"
    )
    assert r.status_code == 403
    q = tenant.agent_client.post(
        "/v1/quotes", {"wallet_id": tenant.agent.wallet_id, "tool": "demo.echo"}, format="json"
    )
    assert other_tenant.sponsor_client.get(f"/v1/quotes/{q.json()['quote_id']}").status_code == 404


def test_quote_is_consumed_at_most_once(transactional_db):
    t = make_tenant("q")
    billing_services.tool_price_set(tool="demo.echo", credits=Decimal("1"))
    quote = services.quote_create(wallet=t.agent, tool="demo.echo")
    wins: list[str] = []

    def worker(i):
        try:
            from django.db import transaction

            with transaction.atomic():
                services.quote_consume(quote_id=quote.quote_id, wallet=t.agent, tool="demo.echo", action_id=f"act_{i}")
            wins.append(f"act_{i}")
        except QuoteUnavailable:
            pass
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(10)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(wins) == 1
    quote.refresh_from_db()
    assert quote.status == "consumed"
    assert quote.consumed_by == wins[0]
    with pytest.raises(QuoteUnavailable):
        services.quote_consume(quote_id=quote.quote_id, wallet=t.agent, tool="other", action_id="x")


# --- Policies and authorize -----------------------------------------------------------


def test_policy_crud_and_audit(tenant, other_tenant):
    c = tenant.sponsor_client
    r = c.post(
        "/v1/policies",
        {
            "wallet_id": tenant.agent.wallet_id,
            "name": "tight",
            "denied_tools": ["danger.*"],
            "max_credits_per_call": "2",
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    pol = r.json()
    assert pol["policy_id"].startswith("pol_")
    assert pol["max_credits_per_call"] == "2.00000000"
    assert c.get(f"/v1/policies?wallet_id={tenant.agent.wallet_id}").json()["total"] == 1
    assert c.get(f"/v1/policies/{pol['policy_id']}").json()["name"] == "tight"
    p = c.patch(f"/v1/policies/{pol['policy_id']}", {"human_approval_required": True}, format="json")
    assert p.status_code == 200
    assert p.json()["human_approval_required"] is True
    assert p.json()["version"] == 2
    assert p.json()["denied_tools"] == ["danger.*"]
    assert c.patch(f"/v1/policies/{pol['policy_id']}", {"max_daily_credits": "-1"}, format="json").status_code == 422
    # The agent may read the policy on its wallet; another tenant may not.
    assert tenant.agent_client.get(f"/v1/policies/{pol['policy_id']}").status_code == 200
    assert other_tenant.sponsor_client.get(f"/v1/policies/{pol['policy_id']}").status_code == 404
    assert other_tenant.sponsor_client.patch(f"/v1/policies/{pol['policy_id']}", {}, format="json").status_code == 404
    assert other_tenant.sponsor_client.get("/v1/policies").json()["total"] == 0
    events = set(AuditEvent.objects.filter(event__startswith="policy.").values_list("event", flat=True))
    assert events == {"policy.created", "policy.updated"}


def _permit(tenant, tools=("demo.echo",), max_credits="10"):
    r = issue(
        tenant.sponsor_client,
        tenant.agent.wallet_id,
        key=f"p{tools}{max_credits}",
        allowed_tools=list(tools),
        max_credits=max_credits,
    )
    return Permit.objects.get(permit_id=r.json()["permit_id"])


def test_authorize_evaluates_permit_and_policies(tenant):
    permit = _permit(tenant, tools=("demo.*", "danger.drop"))
    kw = {"permit": permit, "wallet": tenant.agent, "key_id": tenant.agent_key_id}
    d = services.authorize(**kw, tool="demo.echo", price=Decimal("1"))
    assert d.allowed
    assert d.policy_decision_id.startswith("pdec_")
    assert services.authorize(**kw, tool="other.tool", price=Decimal("1")).refusal.code == "tool_not_permitted"
    assert services.authorize(**kw, tool="demo.echo", price=Decimal("11")).refusal.code == "permit_exhausted"
    services.policy_create(wallet=tenant.sponsor, denied_tools=["danger.drop"])
    d = services.authorize(**kw, tool="danger.drop", price=Decimal("1"))
    assert d.refusal.code == "policy_denied"
    assert d.refusal.extra["rule"] == "denied_tools"
    services.policy_create(wallet=tenant.agent, max_credits_per_call=Decimal("0.5"))
    assert (
        services.authorize(**kw, tool="demo.echo", price=Decimal("1")).refusal.extra["rule"] == "max_credits_per_call"
    )
    assert services.authorize(**kw, tool="demo.echo", price=Decimal("0.5")).allowed
    services.policy_create(wallet=tenant.agent, allowed_categories=["search"])
    d = services.authorize(**kw, tool="demo.echo", price=Decimal("0.5"), category="compute")
    assert d.refusal.extra["rule"] == "allowed_categories"
    # A permit bound to another key.
    bound = Permit.objects.get(
        permit_id=issue(
            tenant.sponsor_client, tenant.agent.wallet_id, key="bound", subject_key_id=tenant.agent_key_id
        ).json()["permit_id"]
    )
    d = services.authorize(permit=bound, wallet=tenant.agent, key_id="key_other", tool="demo.echo", price=Decimal(0))
    assert d.refusal.code == "permit_key_mismatch"
    # A tampered permit row fails the signature check.
    Permit.objects.filter(pk=permit.pk).update(allowed_tools=["*"])
    permit.refresh_from_db()
    forged_statement = dict(permit.signed_statement, allowed_tools=["*"])
    Permit.objects.filter(pk=permit.pk).update(signed_statement=forged_statement)
    permit.refresh_from_db()
    assert services.authorize(
        **{**kw, "permit": permit}, tool="x.y", price=Decimal(0), category="search"
    ).refusal.code == ("permit_signature_invalid")


def test_daily_credit_policy(tenant):
    """``authorize`` hands each daily cap of the line to the claim, with the wallet whose spend it caps: the
    claim checks them after its debit under the wallets' locks (tests/test_charge_policies.py refuses calls
    over a cap, through the governed call)."""
    permit = _permit(tenant, max_credits="100")
    on_agent = services.policy_create(wallet=tenant.agent, max_daily_credits=Decimal("5"))
    on_sponsor = services.policy_create(wallet=tenant.sponsor, max_daily_credits=Decimal("7"))
    sibling = factories.make_wallet(tenant.sponsor, "sibling", 20)
    kw = {"permit": permit, "wallet": tenant.agent, "key_id": tenant.agent_key_id, "tool": "demo.echo"}
    decision = services.authorize(**kw, price=Decimal("50"))
    assert decision.allowed  # the spend today is read only under the claim's locks
    assert [(cap.policy_id, cap.wallet_id, cap.limit) for cap in decision.daily_caps] == [
        (on_agent.policy_id, tenant.agent.wallet_id, Decimal("5")),
        # A cap on the sponsor counts the agent line the call comes from.
        (on_sponsor.policy_id, tenant.agent.wallet_id, Decimal("7")),
    ]
    allowed = services.authorize(
        permit=_permit_for(tenant, sibling), wallet=sibling, key_id="", tool="demo.echo", price=Decimal("3")
    )
    assert [(cap.policy_id, cap.wallet_id) for cap in allowed.daily_caps] == [(on_sponsor.policy_id, sibling.wallet_id)]


def _permit_for(tenant, wallet):
    r = issue(
        tenant.sponsor_client, wallet.wallet_id, key=f"p-{wallet.wallet_id}", allowed_tools=["*"], max_credits="100"
    )
    assert r.status_code == 201, r.content
    return Permit.objects.get(permit_id=r.json()["permit_id"])


# --- /v1/me -----------------------------------------------------------------------------


def test_me_authority(tenant, operator_client, anon_client):
    factories.top_up(tenant.agent, 7)
    # An operator's permit: one a wallet key issued would be revoked by the approval policy.
    issue(operator_client, tenant.agent.wallet_id, key="m1")
    services.policy_create(wallet=tenant.sponsor, human_approval_required=True, name="humans")
    r = tenant.agent_client.get("/v1/me/authority")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["wallet_id"] == tenant.agent.wallet_id
    assert body["balance"] == "7.00000000"
    assert body["daily_spend"] == "0.00000000"
    assert body["human_approval_required"] is True
    assert [p["name"] for p in body["policies"]] == ["humans"]
    assert len(body["active_permits"]) == 1
    assert body["pending_permit_requests"] == []

    assert anon_client.get("/v1/me/authority").status_code == 401
    r = operator_client.get("/v1/me/authority")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "wallet_key_required"


def test_me_authority_wallet_gone(transactional_db):
    t = make_tenant("gone")
    agent = Wallet.objects.get(pk=t.agent.pk)
    billing_services.wallet_close(wallet=agent)
    r = t.agent_client.get("/v1/me/authority")
    if r.status_code == 401:
        pytest.skip("closing a wallet revokes its keys")
    assert r.status_code == 404
    assert r.json()["detail"]["error"] == "wallet_not_found"


def test_me_permits_and_operator_refusals(tenant, operator_client):
    issue(tenant.sponsor_client, tenant.agent.wallet_id, key="mp1")
    issue(tenant.sponsor_client, tenant.sponsor.wallet_id, key="mp2")
    assert tenant.agent_client.get("/v1/me/permits").json()["total"] == 1
    assert tenant.sponsor_client.get("/v1/me/permits").json()["total"] == 1
    assert tenant.agent_client.get("/v1/me/permits?status=active").json()["total"] == 1
    for path in ("/v1/me/permits", "/v1/me/quotes", "/v1/me/permit-requests"):
        r = operator_client.get(path)
        assert r.status_code == 403
        assert r.json()["detail"]["error"] == "wallet_key_required"
    assert tenant.agent_client.get("/v1/me/permits?limit=0").status_code == 422


def test_listing_queries_are_bounded(tenant, django_assert_max_num_queries):
    for i in range(15):
        issue(tenant.sponsor_client, tenant.agent.wallet_id, key=f"q{i}")
    client = client_for(tenant.sponsor_secret)
    with django_assert_max_num_queries(6):
        r = client.get("/v1/permits?limit=50")
    assert r.json()["total"] == 15
    connections.close_all()
