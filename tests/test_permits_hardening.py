"""Permits hardening: the approval form's text, /v1/me/authority's policies, and one check of
policy rules for the API, the console and the services."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from audit.models import AuditEvent
from common.errors import RequestValidationError
from permits import exceptions as exc
from permits import services
from permits.models import Permit, PermitRequest, PolicyBundle, TenantApprover
from tests import factories
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import issue_permit

pytestmark = pytest.mark.django_db


def ask(tenant: Tenant) -> str:
    r = tenant.agent_client.post(
        "/v1/permit-requests",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["demo.echo"], "max_credits": "5"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert r.status_code == 202, r.content
    return str(r.json()["request_id"])


def approver(tenant: Tenant) -> tuple[Any, Client]:
    user = get_user_model().objects.create_user(username="al", password="pw-correct-horse")
    TenantApprover.objects.create(user=user, tenant=tenant.sponsor)
    client = Client(raise_request_exception=False)
    assert client.login(username="al", password="pw-correct-horse")
    return user, client


# --- 1. The terms digest sent back with an approval ------------------------------------------


def test_non_ascii_terms_are_a_changed_request_not_a_500(tenant: Tenant) -> None:
    rid = ask(tenant)
    user, client = approver(tenant)
    r = client.post(f"/approvals/{rid}/decide", {"decision": "approve", "terms": "é"}, follow=True)
    assert r.status_code == 200
    assert "terms changed after the page was shown" in r.content.decode()
    assert PermitRequest.objects.get(request_id=rid).status == "pending"
    assert not Permit.objects.exists()
    with pytest.raises(exc.RequestTermsChanged):
        services.permit_request_decide(request_id=rid, user=user, approve=True, shown_terms="\u00e9" * 64)
    # The digest the page showed still approves.
    terms = services.permit_request_terms(PermitRequest.objects.get(request_id=rid))
    r = client.post(f"/approvals/{rid}/decide", {"decision": "approve", "terms": terms})
    assert r.status_code == 302
    assert PermitRequest.objects.get(request_id=rid).status == "approved"


# --- 2. Text PostgreSQL cannot store in the decision form -----------------------------------


@pytest.mark.parametrize("field", ["note", "terms"])
def test_nul_in_the_decision_form_is_a_400_on_the_page(tenant: Tenant, field: str) -> None:
    rid = ask(tenant)
    _, client = approver(tenant)
    form = {"decision": "reject", "note": "no", "terms": "", field: "no\x00"}
    r = client.post(f"/approvals/{rid}/decide", form)
    assert r.status_code == 400
    page = r.content.decode()
    assert "Null characters are not allowed." in page
    assert 'class="messages"' in page  # the page with its error,
    assert 'id="reject"' in page  # and the form again
    assert PermitRequest.objects.get(request_id=rid).status == "pending"
    assert not AuditEvent.objects.filter(event="permit_request.rejected").exists()
    # The same decision without the NUL goes through.
    r = client.post(f"/approvals/{rid}/decide", {"decision": "reject", "note": "no"})
    assert r.status_code == 302
    preq = PermitRequest.objects.get(request_id=rid)
    assert (preq.status, preq.decision_note) == ("rejected", "no")


def test_decide_service_refuses_an_unstorable_note(tenant: Tenant) -> None:
    rid = ask(tenant)
    user, _ = approver(tenant)
    for note in ("a\x00b", "a\ud800b"):
        with pytest.raises(RequestValidationError):
            services.permit_request_decide(request_id=rid, user=user, approve=False, note=note)
    assert PermitRequest.objects.get(request_id=rid).status == "pending"


# --- 3. /v1/me/authority shows what binds the caller and what it may read ------------------


def test_me_authority_shows_ancestors_enabled_policies_and_own_policies(tenant: Tenant) -> None:
    child = factories.make_wallet(tenant.agent, "kid")
    child_client = client_for(factories.make_key(child).secret)

    def create(client: Any, wallet_id: str, name: str, enabled: bool) -> str:
        r = client.post(
            "/v1/policies",
            {"wallet_id": wallet_id, "name": name, "enabled": enabled, "denied_tools": ["x.y"]},
            format="json",
        )
        assert r.status_code == 201, r.content
        return str(r.json()["policy_id"])

    hidden = create(tenant.agent_client, tenant.agent.wallet_id, "agent private plan", False)
    binding = create(tenant.agent_client, tenant.agent.wallet_id, "agent rule", True)
    own_off = create(tenant.agent_client, child.wallet_id, "child off", False)
    own_on = create(tenant.agent_client, child.wallet_id, "child on", True)

    body = child_client.get("/v1/me/authority").json()
    shown = [p["policy_id"] for p in body["policies"]]
    assert shown == [binding, own_off, own_on]
    assert child_client.get(f"/v1/policies/{hidden}").status_code == 404
    for policy_id in (own_off, own_on):  # the caller's own wallet's policies: readable there too
        assert child_client.get(f"/v1/policies/{policy_id}").status_code == 200
    # The agent sees both of its own, enabled or not, and none of its child's.
    agent_shown = [p["policy_id"] for p in tenant.agent_client.get("/v1/me/authority").json()["policies"]]
    assert agent_shown == [hidden, binding]


def test_me_authority_approval_flag_ignores_a_disabled_ancestor_policy(tenant: Tenant) -> None:
    policy = services.policy_create(wallet=tenant.sponsor, human_approval_required=True, enabled=False)
    body = tenant.agent_client.get("/v1/me/authority").json()
    assert body["human_approval_required"] is False
    assert policy.policy_id not in [p["policy_id"] for p in body["policies"]]


# --- 4. One check of policy rules: API, console and services --------------------------------

MALFORMED: list[dict[str, Any]] = [
    {"denied_tools": 5},
    {"denied_tools": None},
    {"allowed_tools": [1]},
    {"allowed_tools": "foo"},
    {"allowed_tools": {"a": 1}},
    {"allowed_tools": [""]},
    {"allowed_tools": ["x" * 201]},
    {"denied_tools": ["ok", ["nested"]]},
    {"allowed_categories": "search"},
    {"allowed_categories": ["nope"]},
    {"allowed_categories": [3]},
    {"max_credits_per_call": Decimal("-1")},
    {"max_daily_credits": Decimal("0.000000001")},
    {"max_daily_credits": 1.5},
    {"enabled": "yes"},
    {"name": 5},
]


def staff_client(*permissions: str, username: str = "policy-admin") -> Client:
    user = get_user_model().objects.create_user(username, password="pw-for-tests-only", is_staff=True)
    for label in permissions:
        app_label, codename = label.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def admin_form(wallet_id: str, **fields: str) -> dict[str, str]:
    form = {
        "wallet": wallet_id,
        "name": "x",
        "enabled": "on",
        "tools_mode": "any",  # the console's form: "any" or "only" the tools selected
        "max_credits_per_call": "",
        "max_daily_credits": "",
        "categories_mode": "any",
        "servers_mode": "any",
    }
    return {**form, **fields}


@pytest.mark.parametrize("rules", MALFORMED, ids=lambda rules: repr(rules)[:40])
def test_services_refuse_malformed_rules(tenant: Tenant, rules: dict[str, Any]) -> None:
    with pytest.raises(RequestValidationError) as err:
        services.policy_create(wallet=tenant.agent, **rules)
    assert err.value.errors[0]["loc"][:2] == ["body", next(iter(rules))]
    assert not PolicyBundle.objects.exists()
    policy = services.policy_create(wallet=tenant.agent, denied_tools=["math.add"])
    with pytest.raises(RequestValidationError):
        services.policy_update(policy_id=policy.policy_id, **rules)
    policy.refresh_from_db()
    assert (policy.version, policy.denied_tools) == (1, ["math.add"])


@pytest.mark.parametrize(
    "body",
    [
        {"allowed_tools": [1]},
        {"denied_tools": [True]},
        {"allowed_categories": ["nope"]},
        {"allowed_categories": [1]},
    ],
    ids=repr,
)
def test_api_refuses_what_the_console_refuses(tenant: Tenant, body: dict[str, Any]) -> None:
    (name,) = body
    r = tenant.sponsor_client.post("/v1/policies", {"wallet_id": tenant.agent.wallet_id, **body}, format="json")
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["loc"] == ["body", name, 0]
    policy = services.policy_create(
        wallet=tenant.agent, actor_wallet_id=tenant.sponsor.wallet_id, denied_tools=["math.add"]
    )
    r = tenant.sponsor_client.patch(f"/v1/policies/{policy.policy_id}", body, format="json")
    assert r.status_code == 422, r.content
    assert PolicyBundle.objects.get().version == 1


def test_api_accepts_known_categories_and_patterns(tenant: Tenant) -> None:
    r = tenant.sponsor_client.post(
        "/v1/policies",
        {
            "wallet_id": tenant.agent.wallet_id,
            "allowed_tools": ["*", "math.*", "clock.now"],
            "denied_tools": [],
            "allowed_categories": ["search", "tooling"],
            "max_credits_per_call": "0.5",
            "max_daily_credits": None,
        },
        format="json",
    )
    assert r.status_code == 201, r.content


@pytest.mark.parametrize(
    "fields",
    [
        {"denied_tools": "5"},
        {"allowed_tools": "[1]", "tools_mode": "only"},
        {"allowed_tools": '"foo"', "tools_mode": "only"},
        {"allowed_tools": '["a\\u0000"]', "tools_mode": "only"},
        {"allowed_tools": "notes.apend", "tools_mode": "only"},  # not a synced tool
        {"allowed_categories": '["nope"]', "categories_mode": "only"},
        {"allowed_categories": "nope", "categories_mode": "only"},
        {"max_daily_credits": "-1"},
    ],
    ids=repr,
)
def test_console_refuses_rules_the_api_refuses(tenant: Tenant, fields: dict[str, str]) -> None:
    permit_id = issue_permit(tenant, tools=["*"])
    client = staff_client("permits.view_policybundle", "permits.add_policybundle", "permits.change_policybundle")
    r = client.post("/admin/permits/policybundle/add/", admin_form(tenant.sponsor.wallet_id, **fields))
    assert r.status_code == 200  # the form again, with its errors
    assert "errornote" in r.content.decode()
    assert not PolicyBundle.objects.exists()

    policy = services.policy_create(wallet=tenant.sponsor, denied_tools=["math.add"])
    r = client.post(f"/admin/permits/policybundle/{quote(policy.policy_id)}/change/", admin_form("", **fields))
    assert r.status_code == 200
    assert "errornote" in r.content.decode()
    policy.refresh_from_db()
    assert (policy.version, policy.denied_tools) == (1, ["math.add"])

    # The tenant's API and its governed calls keep working.
    assert tenant.sponsor_client.get("/v1/policies").status_code == 200
    decision = services.authorize(
        permit=Permit.objects.get(pk=permit_id),
        wallet=tenant.agent,
        key_id=tenant.agent_key_id,
        tool="any",
        price=Decimal(1),
    )
    assert decision.allowed


def test_console_still_saves_valid_rules(tenant: Tenant) -> None:
    from mcpgateway.models import Tool

    for name in ("math.add", "clock.now", "notes.append"):
        Tool.objects.create(service_id=name)
    client = staff_client("permits.view_policybundle", "permits.add_policybundle")
    r = client.post(
        "/admin/permits/policybundle/add/",
        {
            **admin_form(tenant.sponsor.wallet_id, tools_mode="only", categories_mode="only", max_daily_credits="10"),
            "allowed_tools": ["math.*", "clock.now"],  # the synced tools and their namespaces
            "allowed_categories": ["tooling"],  # the checkboxes
        },
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    policy = PolicyBundle.objects.get()
    assert (policy.allowed_tools, policy.denied_tools, policy.allowed_categories) == (
        ["math.*", "clock.now"],
        [],
        ["tooling"],
    )
    assert policy.max_daily_credits == Decimal("10")


def test_console_reports_the_permits_a_new_approval_rule_revoked(tenant: Tenant) -> None:
    issue_permit(tenant, tools=["*"])  # issued by the sponsor's key: no human approved it
    client = staff_client("permits.view_policybundle", "permits.add_policybundle")
    r = client.post(
        "/admin/permits/policybundle/add/",
        admin_form(tenant.sponsor.wallet_id, human_approval_required="on"),
        follow=True,
    )
    assert r.status_code == 200
    assert "1 permit(s) issued without it below its wallet were revoked" in r.content.decode()
    assert not Permit.objects.filter(status="active").exists()
