"""allowed_servers: policies and permits name the upstream servers whose tools they cover (null: any).

A tool call to a server outside a permit's list is refused before any debit (403 ``server_not_permitted``),
one outside a bundle's list too (``policy_denied``, rule ``allowed_servers``; the bundle binds its wallet's
subtree); a tool of no server is in no list. The permit's signed statement carries its list: a statement
edited to add a server no longer verifies, and permits signed before the list existed still do. Widening
the list of a bundle that requires human approval is a relaxation a second person confirms, from the API
and from the console's policy form alike. A permit request carries its list to the approver and the
approved permit has exactly it. Each rule is attacked as the agent it governs, its sibling and its child,
and as a staff user with one permission.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.test import Client

from audit.evidence_core import permit_terms_digest
from audit.models import AuditEvent
from audit.signing import sign_statement
from billing.models import Wallet
from common.cache import clear_all
from common.ids import new_id
from mcpgateway.models import Tool, UpstreamServer
from mcpgateway.services.upstreams import upstream_server_create
from permits.exceptions import ApprovalRelaxationNeedsConfirmation
from permits.models import (
    Permit,
    PermitApproval,
    PermitRequest,
    PolicyBundle,
    PolicyChangeProposal,
    TenantApprover,
)
from permits.services import permit_approval_standing, permit_statement_problem, policy_create, policy_update
from permits.services.notifications import webhook_body
from tests import factories
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import tools_call_body
from tests.test_permits_hardening import admin_form, staff_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def servers(fault: Any) -> dict[str, UpstreamServer]:
    """Two upstream servers (both the scripted upstream): ``echo`` is alpha's tool, ``sse_echo`` beta's;
    ``rpc_error`` stays a tool of no server."""
    found = {}
    for slug, tool in (("alpha", "echo"), ("beta", "sse_echo")):
        server = upstream_server_create(slug=slug, name=slug, url=fault.url, tool_prefix=slug, actor="test")
        Tool.objects.filter(service_id=tool).update(server=server, remote_name=tool)
        found[slug] = server
    clear_all()  # the tool registry's cache reads the rows afresh
    return found


def permit_for(tenant: Tenant, wallet: Wallet, **fields: Any) -> str:
    r = tenant.sponsor_client.post(
        "/v1/permits",
        {"wallet_id": wallet.wallet_id, "allowed_tools": ["*"], "max_credits": "50", **fields},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )
    assert r.status_code == 201, r.content
    return str(r.json()["permit_id"])


def call(wallet: Wallet, permit_id: str, tool: str) -> dict[str, Any]:
    client = client_for(factories.make_key(wallet).secret)
    answer: dict[str, Any] = client.post(
        "/mcp/messages", tools_call_body(tool, permit_id=permit_id), format="json"
    ).json()
    return answer


def ok(answer: dict[str, Any]) -> bool:
    return bool(answer.get("result", {}).get("_meta", {}).get("io.tollgate/outcome") == "success")


def refusal(answer: dict[str, Any]) -> dict[str, Any]:
    assert "error" in answer, answer
    data: dict[str, Any] = answer["error"]["data"]
    assert data["outcome"] == "denied"
    return data


def test_a_permit_naming_server_a_cannot_call_server_bs_tool(
    fault: Any, servers: dict[str, UpstreamServer], tenant: Tenant
) -> None:
    factories.top_up(tenant.agent, 20)
    permit_id = permit_for(tenant, tenant.agent, allowed_servers=["alpha"])
    permit = Permit.objects.get(pk=permit_id)
    assert permit.allowed_servers == ["alpha"]
    assert permit.signed_statement["allowed_servers"] == ["alpha"]
    assert ok(call(tenant.agent, permit_id, "echo"))
    before = Wallet.objects.get(pk=tenant.agent.pk).balance
    data = refusal(call(tenant.agent, permit_id, "sse_echo"))
    assert (data["error"], data["permit_id"], data["tool"], data["server"]) == (
        "server_not_permitted",
        permit_id,
        "sse_echo",
        "beta",
    )
    assert refusal(call(tenant.agent, permit_id, "rpc_error"))["error"] == "server_not_permitted"  # no server
    assert Wallet.objects.get(pk=tenant.agent.pk).balance == before  # refused before any debit
    assert fault.count("tools/call") == 1
    # Through the REST path the refusal is a 403 with the same code.
    r = client_for(factories.make_key(tenant.agent).secret).post(
        "/mcp/tools/sse_echo/invoke",
        {"arguments": {}, "permit_id": permit_id, "idempotency_key": new_id("k")},
        format="json",
    )
    assert r.status_code == 403, r.content
    assert "server_not_permitted" in r.content.decode()
    # Without a list a permit covers every server.
    assert ok(call(tenant.agent, permit_for(tenant, tenant.agent), "sse_echo"))


def test_a_permit_whose_statement_was_edited_to_add_a_server_is_invalid(
    fault: Any, servers: dict[str, UpstreamServer], tenant: Tenant
) -> None:
    factories.top_up(tenant.agent, 20)
    permit_id = permit_for(tenant, tenant.agent, allowed_servers=["alpha"])
    permit = Permit.objects.get(pk=permit_id)
    widened = {**permit.signed_statement, "allowed_servers": ["alpha", "beta"]}
    Permit.objects.filter(pk=permit_id).update(allowed_servers=["alpha", "beta"], signed_statement=widened)
    clear_all()
    data = refusal(call(tenant.agent, permit_id, "sse_echo"))
    assert data["error"] == "permit_signature_invalid"
    # The column alone widened (or cleared: any server) is a mismatch with what was signed.
    Permit.objects.filter(pk=permit_id).update(allowed_servers=None, signed_statement=permit.signed_statement)
    clear_all()
    assert refusal(call(tenant.agent, permit_id, "sse_echo"))["error"] == "permit_signature_invalid"
    assert permit_statement_problem(Permit.objects.get(pk=permit_id)) == "statement_mismatch:allowed_servers"
    assert fault.count("tools/call") == 0


def test_a_permit_signed_before_the_list_existed_still_verifies(tenant: Tenant) -> None:
    permit = Permit.objects.get(pk=permit_for(tenant, tenant.agent))
    old = {k: v for k, v in permit.signed_statement.items() if k != "allowed_servers"}
    signed = sign_statement(old)
    Permit.objects.filter(pk=permit.pk).update(signed_statement=signed.statement, signature=signed.signature)
    legacy = Permit.objects.get(pk=permit.pk)
    assert "allowed_servers" not in legacy.signed_statement
    assert permit_statement_problem(legacy) is None


def test_a_policy_on_the_sponsor_binds_the_agent_and_its_child_not_another_line(
    fault: Any, servers: dict[str, UpstreamServer], tenant: Tenant
) -> None:
    factories.top_up(tenant.agent, 20)
    child = factories.make_wallet(tenant.agent, "kid", 10)
    sibling = factories.make_wallet(tenant.sponsor, "sibling", 10)
    on_sponsor = policy_create(wallet=tenant.sponsor, allowed_servers=["alpha"])
    for wallet in (tenant.agent, child):
        permit_id = permit_for(tenant, wallet)  # its permit names no server: the bundle still binds
        data = refusal(call(wallet, permit_id, "sse_echo"))
        assert (data["error"], data["rule"], data["policy_id"], data["server"]) == (
            "policy_denied",
            "allowed_servers",
            on_sponsor.policy_id,
            "beta",
        )
        assert ok(call(wallet, permit_id, "echo"))
    # A bundle the agent sets on its own wallet binds its line, not its sibling's.
    policy_update(policy_id=on_sponsor.policy_id, enabled=False)
    policy_create(wallet=tenant.agent, allowed_servers=["beta"])
    assert refusal(call(child, permit_for(tenant, child), "echo"))["rule"] == "allowed_servers"
    assert ok(call(sibling, permit_for(tenant, sibling), "echo"))
    # The agent cannot lift the sponsor's bundle (set above its level).
    on_sponsor_again = policy_create(wallet=tenant.sponsor, allowed_servers=["alpha"])
    r = tenant.agent_client.patch(
        f"/v1/policies/{on_sponsor_again.policy_id}", {"allowed_servers": None}, format="json"
    )
    assert r.status_code == 404, r.content  # above its reach
    assert PolicyBundle.objects.get(pk=on_sponsor_again.pk).allowed_servers == ["alpha"]


def test_widening_the_servers_of_an_approval_policy_needs_a_second_person(tenant: Tenant) -> None:
    created = tenant.sponsor_client.post(
        "/v1/policies",
        {"wallet_id": tenant.agent.wallet_id, "allowed_servers": ["alpha"], "human_approval_required": True},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["allowed_servers"] == ["alpha"]
    policy_id = created.json()["policy_id"]
    for widened in (["alpha", "beta"], None):
        r = tenant.sponsor_client.patch(f"/v1/policies/{policy_id}", {"allowed_servers": widened}, format="json")
        assert r.status_code == 202, r.content  # a proposal for a second person, nothing changed
        assert (r.json()["status"], r.json()["relaxes"]) == ("pending", ["allowed_servers"])
        assert PolicyBundle.objects.get(pk=policy_id).allowed_servers == ["alpha"]
    with pytest.raises(ApprovalRelaxationNeedsConfirmation):
        policy_update(policy_id=policy_id, allowed_servers=["alpha", "beta"])
    narrowed = tenant.sponsor_client.patch(f"/v1/policies/{policy_id}", {"allowed_servers": []}, format="json")
    assert narrowed.status_code == 200, narrowed.content
    assert narrowed.json()["allowed_servers"] == []


def test_the_lists_are_checked(tenant: Tenant) -> None:
    r = tenant.sponsor_client.post(
        "/v1/policies", {"wallet_id": tenant.agent.wallet_id, "allowed_servers": ["not a slug"]}, format="json"
    )
    assert r.status_code == 422, r.content
    r = tenant.sponsor_client.post(
        "/v1/permits",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["*"], "max_credits": "1", "allowed_servers": ["a b"]},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )
    assert r.status_code == 422, r.content
    assert Permit.objects.count() == 0


def console_servers() -> None:
    """Two upstream servers the console's form offers (no tool of theirs is called here)."""
    for slug in ("alpha", "beta"):
        upstream_server_create(slug=slug, name=slug, url="http://127.0.0.1:9/mcp", tool_prefix=slug, actor="test")


def test_the_console_edits_a_policys_servers(tenant: Tenant) -> None:
    """A staff user with the one permission to change policies: the form shows the list as "only" these
    servers and edits it; "any" clears it; a slug that is no server is refused on the form."""
    console_servers()
    policy = policy_create(wallet=tenant.sponsor, allowed_servers=["alpha"], denied_tools=["math.add"])
    client = staff_client("permits.view_policybundle", "permits.change_policybundle")
    url = f"/admin/permits/policybundle/{quote(policy.policy_id)}/change/"
    page = client.get(url).content.decode()
    assert re.search(r'name="allowed_servers" value="alpha"[^>]*checked', page)
    assert not re.search(r'name="allowed_servers" value="beta"[^>]*checked', page)
    assert re.search(r'name="servers_mode" value="only"[^>]*checked', page)
    # Another rule saved: the list stays.
    r = client.post(
        url, admin_form(tenant.sponsor.wallet_id, name="renamed", servers_mode="only", allowed_servers="alpha")
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    policy.refresh_from_db()
    assert (policy.name, policy.allowed_servers) == ("renamed", ["alpha"])
    r = client.post(
        url, {**admin_form(tenant.sponsor.wallet_id, servers_mode="only"), "allowed_servers": ["alpha", "beta"]}
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    policy.refresh_from_db()
    assert policy.allowed_servers == ["alpha", "beta"]
    r = client.post(url, admin_form(tenant.sponsor.wallet_id, servers_mode="any"))
    assert r.status_code == 302, r.content.decode()[:2000]
    policy.refresh_from_db()
    assert policy.allowed_servers is None
    audited = [
        (e.detail["actor"], e.detail["before"]["allowed_servers"], e.detail["after"]["allowed_servers"])
        for e in AuditEvent.objects.filter(event="policy.updated")
    ]
    assert sorted(audited, key=repr) == sorted(
        [
            ("admin:policy-admin", ["alpha"], ["alpha"]),
            ("admin:policy-admin", ["alpha"], ["alpha", "beta"]),
            ("admin:policy-admin", ["alpha", "beta"], None),
        ],
        key=repr,
    )
    for bad in ("gamma", "not a slug"):
        r = client.post(url, admin_form(tenant.sponsor.wallet_id, servers_mode="only", allowed_servers=bad))
        assert r.status_code == 200  # the form again, with its error
        assert "Select a valid choice" in r.content.decode()
    policy.refresh_from_db()
    assert policy.allowed_servers is None
    # A staff user who may only view policies changes nothing.
    viewer = staff_client("permits.view_policybundle", username="policy-viewer")
    assert viewer.post(url, admin_form(tenant.sponsor.wallet_id, servers_mode="only")).status_code == 403
    policy.refresh_from_db()
    assert policy.allowed_servers is None


def test_widening_an_approval_policys_servers_from_the_console_is_a_proposal(tenant: Tenant) -> None:
    """A staff user holding change_policybundle (and even confirm_policy_relaxation) cannot widen the
    servers of a human-approval policy alone: the console records a proposal; the proposer cannot confirm
    it; narrowing applies at once."""
    console_servers()
    policy = policy_create(wallet=tenant.agent, allowed_servers=["alpha"], human_approval_required=True)
    proposer = staff_client(
        "permits.view_policybundle",
        "permits.change_policybundle",
        "permits.confirm_policy_relaxation",
        "permits.view_policychangeproposal",
    )
    url = f"/admin/permits/policybundle/{quote(policy.policy_id)}/change/"
    form = admin_form(tenant.agent.wallet_id, human_approval_required="on")
    for widened in ({"servers_mode": "only", "allowed_servers": ["alpha", "beta"]}, {"servers_mode": "any"}):
        r = proposer.post(url, {**form, **widened})
        assert (r.status_code, r["Location"]) == (302, url), r.content.decode()[:3000]
        assert "Nothing changed yet" in proposer.get(url).content.decode()
        policy.refresh_from_db()
        assert (policy.allowed_servers, policy.version) == (["alpha"], 1)
    proposals = PolicyChangeProposal.objects.filter(policy=policy)
    assert [p.relaxes for p in proposals] == [["allowed_servers"], ["allowed_servers"]]
    latest = proposals.order_by("-created_at").first()
    assert latest is not None
    r = proposer.post(
        "/admin/permits/policychangeproposal/",
        {"action": "confirm_selected", "_selected_action": [latest.proposal_id], "post": "yes"},
        follow=True,
    )
    assert "second person" in r.content.decode()
    policy.refresh_from_db()
    assert policy.allowed_servers == ["alpha"]  # the proposer cannot confirm its own proposal
    narrowed = proposer.post(url, {**form, "servers_mode": "only", "allowed_servers": []})
    assert narrowed.status_code == 302, narrowed.content.decode()[:2000]
    policy.refresh_from_db()
    assert policy.allowed_servers == []


# --- Permit requests and their approval -------------------------------------------------------------


def ask_for(tenant: Tenant, **fields: Any) -> dict[str, Any]:
    r = tenant.agent_client.post(
        "/v1/permit-requests",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["*"], "max_credits": "5", **fields},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("rq"),
    )
    assert r.status_code == 202, r.content
    body: dict[str, Any] = r.json()
    return body


def approver_browser(tenant: Tenant) -> Client:
    user = get_user_model().objects.create_user(username="approver", password="pw-for-tests-only")
    TenantApprover.objects.create(user=user, tenant=tenant.sponsor)
    browser = Client()
    browser.force_login(user)
    return browser


def shown_terms(page: str) -> str:
    found = re.search(r'name="terms" value="([0-9a-f]{64})"', page)
    assert found is not None
    return found[1]


def test_a_request_approved_for_server_a_mints_a_permit_that_refuses_server_b(
    fault: Any, servers: dict[str, UpstreamServer], tenant: Tenant
) -> None:
    """The agent asks for alpha's tools; the approver sees the servers on the page and approves; the permit
    names exactly alpha (signed, and covered by the approval's terms digest) and refuses beta's tool
    before any debit."""
    factories.top_up(tenant.agent, 20)
    preq = ask_for(tenant, allowed_servers=["alpha", "alpha"])
    assert preq["allowed_servers"] == ["alpha"]
    browser = approver_browser(tenant)
    page = browser.get(f"/approvals/{preq['request_id']}").content.decode()
    assert 'data-field="servers">only <code>alpha</code>' in page
    assert "only on alpha" in browser.get("/approvals/").content.decode()
    r = browser.post(f"/approvals/{preq['request_id']}/decide", {"decision": "approve", "terms": shown_terms(page)})
    assert r.status_code == 302
    polled = tenant.agent_client.get(f"/v1/permit-requests/{preq['request_id']}").json()
    assert (polled["status"], polled["allowed_servers"]) == ("approved", ["alpha"])
    assert polled["permit"]["allowed_servers"] == ["alpha"]
    permit = Permit.objects.get(pk=polled["permit"]["permit_id"])
    assert permit.signed_statement["allowed_servers"] == ["alpha"]
    approval = PermitApproval.objects.get(permit_request_id=preq["request_id"])
    assert approval.terms_digest == permit_terms_digest(permit.signed_statement)
    assert permit_approval_standing(permit) == "approved"
    assert ok(call(tenant.agent, permit.permit_id, "echo"))
    before = Wallet.objects.get(pk=tenant.agent.pk).balance
    data = refusal(call(tenant.agent, permit.permit_id, "sse_echo"))
    assert (data["error"], data["server"]) == ("server_not_permitted", "beta")
    assert Wallet.objects.get(pk=tenant.agent.pk).balance == before
    assert fault.count("tools/call") == 1
    # A request naming no server gives a permit for any, as before.
    open_request = ask_for(tenant)
    assert open_request["allowed_servers"] is None
    page = browser.get(f"/approvals/{open_request['request_id']}").content.decode()
    assert 'data-field="servers">any server' in page
    browser.post(f"/approvals/{open_request['request_id']}/decide", {"decision": "approve", "terms": shown_terms(page)})
    assert Permit.objects.get(issued_via_request_id=open_request["request_id"]).allowed_servers is None


def test_servers_widened_on_the_request_after_the_page_was_shown_mint_nothing(tenant: Tenant) -> None:
    """The approval page's terms digest covers the servers: a request row edited from [alpha] to any
    server (or to another) between the page and the click is refused, and the approver reviews again."""
    preq = ask_for(tenant, allowed_servers=["alpha"])
    browser = approver_browser(tenant)
    shown = shown_terms(browser.get(f"/approvals/{preq['request_id']}").content.decode())
    for edited in (None, ["beta"], ["alpha", "beta"]):
        PermitRequest.objects.filter(pk=preq["request_id"]).update(allowed_servers=edited)
        r = browser.post(
            f"/approvals/{preq['request_id']}/decide", {"decision": "approve", "terms": shown}, follow=True
        )
        assert "terms changed after the page was shown" in r.content.decode()
    assert not Permit.objects.exists()
    assert PermitRequest.objects.get(pk=preq["request_id"]).status == "pending"


def test_a_request_carries_its_servers_to_the_approvers_and_the_audit(
    tenant: Tenant, django_capture_on_commit_callbacks: Any
) -> None:
    from django.core import mail

    user = get_user_model().objects.create_user(username="mailme", email="mailme@example.test")
    TenantApprover.objects.create(user=user, tenant=tenant.sponsor)
    with django_capture_on_commit_callbacks(execute=True):
        preq = ask_for(tenant, allowed_servers=["beta", "alpha"])
    assert preq["allowed_servers"] == ["alpha", "beta"]
    assert "Servers: alpha, beta" in mail.outbox[0].body
    assert "<code>alpha</code>, <code>beta</code>" in mail.outbox[0].alternatives[0][0]  # type: ignore[attr-defined]
    created = AuditEvent.objects.get(event="permit_request.created")
    assert created.detail["allowed_servers"] == ["alpha", "beta"]
    body = json.loads(webhook_body(PermitRequest.objects.get(pk=preq["request_id"]), approval_url="https://x.test"))
    assert body["allowed_servers"] == ["alpha", "beta"]
    assert "only on alpha, beta" in body["text"]


@pytest.mark.parametrize(
    "servers",
    [["not a slug"], "alpha", [None], [""], ["a" * 65], ["x"] * 101, {"alpha": 1}],
    ids=lambda value: repr(value)[:30],
)
def test_a_requests_servers_are_checked(tenant: Tenant, servers: Any) -> None:
    r = tenant.agent_client.post(
        "/v1/permit-requests",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["*"], "max_credits": "5", "allowed_servers": servers},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("rq"),
    )
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["loc"][:2] == ["body", "allowed_servers"]
    assert not PermitRequest.objects.exists()


def test_a_request_replayed_with_other_servers_is_the_idempotency_conflict(tenant: Tenant) -> None:
    """The servers are part of what an idempotency key names: the agent cannot reuse the key of its
    [alpha] request to have it read as another list."""
    body = {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["*"], "max_credits": "5"}
    first = tenant.agent_client.post(
        "/v1/permit-requests", {**body, "allowed_servers": ["alpha"]}, format="json", HTTP_IDEMPOTENCY_KEY="same"
    )
    assert first.status_code == 202, first.content
    for other in (["beta"], None):
        again = tenant.agent_client.post(
            "/v1/permit-requests", {**body, "allowed_servers": other}, format="json", HTTP_IDEMPOTENCY_KEY="same"
        )
        assert again.status_code == 422, again.content
        assert again.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    replay = tenant.agent_client.post(
        "/v1/permit-requests", {**body, "allowed_servers": ["alpha"]}, format="json", HTTP_IDEMPOTENCY_KEY="same"
    )
    assert (replay.status_code, replay["Idempotent-Replayed"]) == (202, "true")
    assert PermitRequest.objects.get().allowed_servers == ["alpha"]
