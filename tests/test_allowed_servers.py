"""allowed_servers: policies and permits name the upstream servers whose tools they cover (null: any).

A tool call to a server outside a permit's list is refused before any debit (403 ``server_not_permitted``),
one outside a bundle's list too (``policy_denied``, rule ``allowed_servers``; the bundle binds its wallet's
subtree); a tool of no server is in no list. The permit's signed statement carries its list: a statement
edited to add a server no longer verifies, and permits signed before the list existed still do. Widening
the list of a bundle that requires human approval is a relaxation a second person confirms. Each rule is
attacked as the agent it governs, its sibling and its child.
"""

from __future__ import annotations

from typing import Any

import pytest

from audit.signing import sign_statement
from billing.models import Wallet
from common.cache import clear_all
from common.ids import new_id
from mcpgateway.models import Tool, UpstreamServer
from mcpgateway.services.upstreams import upstream_server_create
from permits.exceptions import ApprovalRelaxationNeedsConfirmation
from permits.models import Permit, PolicyBundle
from permits.services import permit_statement_problem, policy_create, policy_update
from tests import factories
from tests import test_gateway_governance as governance
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import tools_call_body

pytestmark = pytest.mark.django_db

fault_server = governance.fault_server
fault = governance.fault


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


def test_a_console_save_keeps_the_servers_and_shows_them(tenant: Tenant) -> None:
    """A staff user with the one permission to change policies: the console shows the list and its save
    (of another rule) keeps it; widening it goes through the API's two-person path."""
    from tests.test_permits_hardening import admin_form, staff_client

    policy = policy_create(wallet=tenant.sponsor, allowed_servers=["alpha"], denied_tools=["math.add"])
    client = staff_client("permits.view_policybundle", "permits.change_policybundle")
    page = client.get(f"/admin/permits/policybundle/{policy.policy_id}/change/")
    assert page.status_code == 200
    assert "alpha" in page.content.decode()
    r = client.post(
        f"/admin/permits/policybundle/{policy.policy_id}/change/",
        {**admin_form(tenant.sponsor.wallet_id, name="renamed"), "allowed_servers": "null"},
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    policy.refresh_from_db()
    assert (policy.name, policy.allowed_servers) == ("renamed", ["alpha"])
