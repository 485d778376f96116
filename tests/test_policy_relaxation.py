"""Separation of duties for human approval (issue 27, item 7).

The shipped Operator group holds ``change_policybundle``, ``add_apikey`` and ``fund_wallet``: one
Operator could turn a tenant's human approval off, mint a sponsor key and issue the permits approval
was meant to gate. Now a change that relaxes human approval (``approval_relaxation``: turning
``human_approval_required`` off or disabling a policy that requires it, raising its credit limits or
widening its tools or categories) is a proposal; it takes effect
only when a second user holding ``permits.confirm_policy_relaxation`` confirms it in the console,
before it expires, while the policy is as it was proposed. The proposer (a superuser too) and a
console user who minted the proposing key cannot confirm it. Tightening applies at once.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test import Client
from django.utils import timezone

from access.services import api_key_create
from audit.models import AuditEvent
from common.ids import new_id
from permits import services
from permits.exceptions import (
    ApprovalRelaxationNeedsConfirmation,
    ConfirmationNotAllowed,
    OwnProposal,
    ProposalDecided,
    ProposalExpired,
    ProposalStale,
)
from permits.models import PolicyBundle, PolicyChangeProposal, ProposalStatus
from permits.services import approval_relaxation
from tests.conftest import Tenant, client_for, make_tenant

pytestmark = pytest.mark.django_db

APPROVAL_ON = {"enabled": True, "human_approval_required": True}


def _user(*, groups: tuple[str, ...] = (), permissions: tuple[str, ...] = (), superuser: bool = False) -> Any:
    users = get_user_model().objects
    make = users.create_superuser if superuser else users.create_user
    user = make(new_id("u"), password="pw-for-tests-only", is_staff=True)
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    for label in permissions:
        app_label, codename = label.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return users.get(pk=user.pk)


def _console(user: Any) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _actor(user: Any) -> str:
    return f"admin:{user.get_username()}"


def _approval_policy(tenant: Tenant, **rules: Any) -> PolicyBundle:
    """Human approval on the sponsor's line, set by the sponsor's key."""
    return services.policy_create(
        wallet=tenant.sponsor, actor_wallet_id=tenant.sponsor.wallet_id, human_approval_required=True, **rules
    )


def _self_issue(tenant: Tenant) -> Any:
    return tenant.agent_client.post(
        "/v1/permits",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["*"], "max_credits": "5"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )


def _form(policy: PolicyBundle, **fields: str) -> dict[str, str]:
    """The console's change form as saved with the policy's current rules, then ``fields``."""
    form = {
        "name": policy.name,
        "tools_mode": "any",  # the console's form: "any" or "only" the tools selected
        "max_credits_per_call": "",
        "max_daily_credits": "",
        "categories_mode": "any",
        "servers_mode": "any",
        **({"enabled": "on"} if policy.enabled else {}),
        **({"human_approval_required": "on"} if policy.human_approval_required else {}),
    }
    form.update(fields)
    return {k: v for k, v in form.items() if v != "off"}


def _action(client: Client, action: str, proposal_id: str) -> Any:
    return client.post(
        "/admin/permits/policychangeproposal/",
        {"action": action, "_selected_action": [proposal_id], "post": "yes"},
        follow=True,
    )


def _rules(policy_id: str) -> tuple[bool, bool, int]:
    policy = PolicyBundle.objects.get(policy_id=policy_id)
    return policy.enabled, policy.human_approval_required, policy.version


# --- What relaxes human approval -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "relaxed"),
    [
        (APPROVAL_ON, {"enabled": True, "human_approval_required": False}, ["human_approval_required"]),
        (APPROVAL_ON, {"enabled": False, "human_approval_required": True}, ["enabled"]),
        (APPROVAL_ON, {"enabled": False, "human_approval_required": False}, ["enabled", "human_approval_required"]),
        (APPROVAL_ON, {**APPROVAL_ON, "allowed_tools": ["*"], "max_credits_per_call": None}, []),
        ({"enabled": True, "human_approval_required": False}, APPROVAL_ON, []),
        ({"enabled": False, "human_approval_required": True}, APPROVAL_ON, []),
        # A disabled policy requires nothing: turning its flag off relaxes nothing.
        ({"enabled": False, "human_approval_required": True}, {"enabled": False, "human_approval_required": False}, []),
        (None, {"enabled": True, "human_approval_required": False}, []),
        # Raising an approval policy's threshold, or widening its tools or categories, relaxes it too.
        (
            {**APPROVAL_ON, "max_credits_per_call": "5"},
            {**APPROVAL_ON, "max_credits_per_call": "6"},
            ["max_credits_per_call"],
        ),
        ({**APPROVAL_ON, "max_daily_credits": "50"}, {**APPROVAL_ON, "max_daily_credits": None}, ["max_daily_credits"]),
        ({**APPROVAL_ON, "max_credits_per_call": "5"}, {**APPROVAL_ON, "max_credits_per_call": "4.5"}, []),
        ({**APPROVAL_ON, "allowed_tools": ["a"]}, {**APPROVAL_ON, "allowed_tools": ["a", "b"]}, ["allowed_tools"]),
        ({**APPROVAL_ON, "allowed_tools": ["a"]}, {**APPROVAL_ON, "allowed_tools": None}, ["allowed_tools"]),
        ({**APPROVAL_ON, "allowed_tools": ["a", "b"]}, {**APPROVAL_ON, "allowed_tools": ["b"]}, []),
        (
            {**APPROVAL_ON, "allowed_categories": ["x"]},
            {**APPROVAL_ON, "allowed_categories": None},
            ["allowed_categories"],
        ),
        ({**APPROVAL_ON, "denied_tools": ["a"]}, {**APPROVAL_ON, "denied_tools": []}, ["denied_tools"]),
        ({**APPROVAL_ON, "denied_tools": ["a"]}, {**APPROVAL_ON, "denied_tools": ["a", "b"]}, []),
        # A policy without approval relaxes nothing by loosening its limits.
        ({"enabled": True, "max_credits_per_call": "5"}, {"enabled": True, "max_credits_per_call": None}, []),
    ],
)
def test_approval_relaxation(before: dict[str, Any] | None, after: dict[str, Any], relaxed: list[str]) -> None:
    assert approval_relaxation(before, after) == relaxed


def test_the_service_that_applies_changes_refuses_a_relaxation(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    changes: list[dict[str, Any]] = [{"human_approval_required": False}, {"enabled": False}]
    for change in changes:
        with pytest.raises(ApprovalRelaxationNeedsConfirmation):
            services.policy_update(policy_id=policy.policy_id, **change)
    assert _rules(policy.policy_id) == (True, True, 1)


def test_a_policy_created_below_cannot_lift_one_above(tenant: Tenant) -> None:
    """Authority flows down: every enabled policy of the line binds, so a policy the agent creates on
    itself without approval leaves the sponsor's in force."""
    _approval_policy(tenant)
    r = tenant.agent_client.post(
        "/v1/policies", {"wallet_id": tenant.agent.wallet_id, "human_approval_required": False}, format="json"
    )
    assert r.status_code == 201, r.content
    assert _self_issue(tenant).json()["detail"]["error"] == "human_approval_required"


# --- The API path: a key's relaxation is a proposal ------------------------------------------------


@pytest.mark.parametrize("change", [{"human_approval_required": False}, {"enabled": False}])
def test_a_sponsor_keys_relaxation_is_a_proposal_and_changes_nothing(tenant: Tenant, change: dict[str, Any]) -> None:
    policy = _approval_policy(tenant)
    r = tenant.sponsor_client.patch(f"/v1/policies/{policy.policy_id}", change, format="json")
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["proposal_id"].startswith("pcp_")
    assert body["policy_id"] == policy.policy_id
    assert body["status"] == "pending"
    assert body["relaxes"] == list(change)
    assert body["changes"] == change
    assert body["policy_version"] == 1
    assert body["expires_at"]
    assert _rules(policy.policy_id) == (True, True, 1)
    assert _self_issue(tenant).json()["detail"]["error"] == "human_approval_required"
    event = AuditEvent.objects.get(event="policy.relaxation_proposed")
    assert event.key_id == tenant.sponsor_key_id
    assert event.detail["proposal_id"] == body["proposal_id"]
    assert not AuditEvent.objects.filter(event="policy.updated").exists()
    # The same request again returns the pending proposal rather than a second one.
    again = tenant.sponsor_client.patch(f"/v1/policies/{policy.policy_id}", change, format="json")
    assert (again.status_code, again.json()["proposal_id"]) == (202, body["proposal_id"])
    assert PolicyChangeProposal.objects.count() == 1


@pytest.mark.parametrize(
    ("rules", "change", "relaxes"),
    [
        ({"max_credits_per_call": Decimal(5)}, {"max_credits_per_call": "500"}, ["max_credits_per_call"]),
        ({"allowed_tools": ["notes.append"]}, {"allowed_tools": None}, ["allowed_tools"]),
        ({"allowed_categories": ["tooling"]}, {"allowed_categories": ["tooling", "payments"]}, ["allowed_categories"]),
    ],
)
def test_loosening_an_approval_policys_limits_is_a_proposal(
    tenant: Tenant, rules: dict[str, Any], change: dict[str, Any], relaxes: list[str]
) -> None:
    """The limits of a policy that requires approval bound what even approved permits do: raising its
    threshold or widening its tools or categories waits for a second person; narrowing applies at once."""
    policy = _approval_policy(tenant, **rules)
    r = tenant.sponsor_client.patch(f"/v1/policies/{policy.policy_id}", change, format="json")
    assert r.status_code == 202, r.content
    assert r.json()["relaxes"] == relaxes
    policy.refresh_from_db()
    assert policy.version == 1
    assert {name: getattr(policy, name) for name in rules} == {
        name: (value if not name.startswith("max_") else Decimal(value)) for name, value in rules.items()
    }


def test_a_patch_mixing_tightening_and_relaxing_waits_whole(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    r = tenant.sponsor_client.patch(
        f"/v1/policies/{policy.policy_id}",
        {"human_approval_required": False, "denied_tools": ["math.add"], "name": ""},
        format="json",
    )
    assert r.status_code == 202, r.content
    assert r.json()["changes"] == {"human_approval_required": False, "denied_tools": ["math.add"]}
    policy.refresh_from_db()
    assert (policy.human_approval_required, policy.denied_tools, policy.version) == (True, [], 1)


def test_tightening_and_neutral_changes_apply_at_once(tenant: Tenant) -> None:
    policy = services.policy_create(wallet=tenant.sponsor, actor_wallet_id=tenant.sponsor.wallet_id)
    own = _self_issue(tenant).json()["permit_id"]
    r = tenant.sponsor_client.patch(
        f"/v1/policies/{policy.policy_id}", {"human_approval_required": True}, format="json"
    )
    assert r.status_code == 200, r.content
    assert r.json()["human_approval_required"] is True
    # Starting to require approval still revokes the permits no human approved.
    assert AuditEvent.objects.get(event="policy.updated").detail["permits_revoked"] == [own]
    r = tenant.sponsor_client.patch(
        f"/v1/policies/{policy.policy_id}", {"name": "tight", "denied_tools": ["math.add"]}, format="json"
    )
    assert r.status_code == 200, r.content
    assert _rules(policy.policy_id) == (True, True, 3)
    assert not PolicyChangeProposal.objects.exists()


def test_a_key_below_the_level_gets_403_not_a_proposal(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    r = tenant.agent_client.patch(f"/v1/policies/{policy.policy_id}", {"enabled": False}, format="json")
    assert r.status_code == 404  # a policy on the parent is out of the agent's reach
    on_agent = services.policy_create(
        wallet=tenant.agent, actor_wallet_id=tenant.sponsor.wallet_id, human_approval_required=True
    )
    r = tenant.agent_client.patch(f"/v1/policies/{on_agent.policy_id}", {"enabled": False}, format="json")
    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] == "policy_read_only"
    assert not PolicyChangeProposal.objects.exists()


def test_a_console_user_confirms_the_keys_proposal_and_it_applies(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    proposal_id = tenant.sponsor_client.patch(
        f"/v1/policies/{policy.policy_id}", {"human_approval_required": False}, format="json"
    ).json()["proposal_id"]
    confirmer = _user(groups=("Approver admin",))
    r = _action(_console(confirmer), "confirm_selected", proposal_id)
    assert r.status_code == 200
    assert "Confirmed 1 proposal(s)." in r.content.decode()
    assert _rules(policy.policy_id) == (True, False, 2)
    policy.refresh_from_db()
    assert policy.authority_wallet_id == tenant.sponsor.wallet_id  # the sponsor's change, at its level
    assert _self_issue(tenant).status_code == 201
    updated = AuditEvent.objects.get(event="policy.updated")
    assert (updated.key_id, updated.detail["actor"], updated.detail["proposal_id"]) == (
        tenant.sponsor_key_id,
        _actor(confirmer),
        proposal_id,
    )
    confirmed = AuditEvent.objects.get(event="policy.relaxation_confirmed")
    assert confirmed.detail["actor"] == _actor(confirmer)
    proposal = PolicyChangeProposal.objects.get()
    assert (proposal.status, proposal.decided_by_id) == (ProposalStatus.CONFIRMED, confirmer.pk)


def test_the_console_user_who_minted_the_proposing_key_cannot_confirm(tenant: Tenant) -> None:
    """The attack of the issue: an Operator mints a sponsor key in the console and proposes through
    it. Even holding the confirmation permission, they are not a second person for that key."""
    operator = _user(groups=("Operator", "Approver admin"))
    issued = api_key_create(wallet=tenant.sponsor, name="side door", actor=_actor(operator))
    minted = client_for(issued.secret)
    # And a key that key mints: still the Operator's line.
    below = minted.post("/v1/api-keys", {"wallet_id": tenant.sponsor.wallet_id}, format="json")
    assert below.status_code == 201, below.content
    policy = _approval_policy(tenant)
    for client in (minted, client_for(below.json()["secret"])):
        r = client.patch(f"/v1/policies/{policy.policy_id}", {"enabled": False}, format="json")
        assert r.status_code == 202, r.content
        proposal_id = r.json()["proposal_id"]
        assert PolicyChangeProposal.objects.get(pk=proposal_id).excluded_confirmers == [operator.get_username()]
        with pytest.raises(OwnProposal):
            services.policy_proposal_confirm(proposal_id=proposal_id, user=operator, actor=_actor(operator))
        r = _action(_console(operator), "confirm_selected", proposal_id)
        assert "second person" in r.content.decode()
    assert _rules(policy.policy_id) == (True, True, 1)
    assert _self_issue(tenant).json()["detail"]["error"] == "human_approval_required"


def test_the_proposal_is_documented_in_the_schema(anon_client: Any) -> None:
    schema = anon_client.get("/openapi.json").json()
    responses = schema["paths"]["/v1/policies/{policy_id}"]["patch"]["responses"]
    assert responses["202"]["content"]["application/json"]["schema"]["$ref"].endswith("/PolicyChangeProposalResponse")
    fields = schema["components"]["schemas"]["PolicyChangeProposalResponse"]["properties"]
    assert {"proposal_id", "status", "expires_at", "relaxes", "changes"} <= set(fields)


# --- The console path -------------------------------------------------------------------------------


def test_an_operator_alone_cannot_disable_approval_in_the_console(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    operator = _user(groups=("Operator",))
    console = _console(operator)
    for fields in ({"human_approval_required": "off"}, {"enabled": "off"}):
        r = console.post(f"/admin/permits/policybundle/{quote(policy.policy_id)}/change/", _form(policy, **fields))
        assert r.status_code == 302, r.content
        page = console.get(r["Location"]).content.decode()
        assert "Nothing changed yet" in page
        assert _rules(policy.policy_id) == (True, True, 1)
    assert PolicyChangeProposal.objects.filter(proposed_by_user=operator).count() == 2
    assert not LogEntry.objects.exists()
    proposed = AuditEvent.objects.filter(event="policy.relaxation_proposed")
    assert {e.detail["actor"] for e in proposed} == {_actor(operator)}
    # The Operator group cannot confirm: the action is not theirs.
    proposal = PolicyChangeProposal.objects.order_by("created_at").first()
    assert proposal is not None
    _action(console, "confirm_selected", proposal.proposal_id)
    assert _rules(policy.policy_id) == (True, True, 1)
    assert not operator.has_perm("permits.confirm_policy_relaxation")
    # Nor can they mint a sponsor key and issue through it.
    key = api_key_create(wallet=tenant.sponsor, actor=_actor(operator))
    issued = client_for(key.secret).post(
        "/v1/permits",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["*"], "max_credits": "5"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )
    assert issued.json()["detail"]["error"] == "human_approval_required"


def test_a_second_user_confirms_in_the_console_and_it_applies(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    proposer = _user(groups=("Operator",))
    r = _console(proposer).post(
        f"/admin/permits/policybundle/{quote(policy.policy_id)}/change/",
        _form(policy, human_approval_required="off", name="relaxed"),
    )
    assert r.status_code == 302
    proposal = PolicyChangeProposal.objects.get()
    assert proposal.changes == {"human_approval_required": False, "name": "relaxed"}
    confirmer = _user(groups=("Approver admin",))
    console = _console(confirmer)
    listing = console.get("/admin/permits/policychangeproposal/?status__exact=pending").content.decode()
    assert proposal.proposal_id in listing
    detail = console.get(f"/admin/permits/policychangeproposal/{quote(proposal.proposal_id)}/change/")
    assert detail.status_code == 200
    assert _actor(proposer) in detail.content.decode()
    page = console.post(
        "/admin/permits/policychangeproposal/",
        {"action": "confirm_selected", "_selected_action": [proposal.proposal_id]},
    )
    assert "human_approval_required: True → False" in page.content.decode()  # what they confirm
    assert _rules(policy.policy_id) == (True, True, 1)
    _action(console, "confirm_selected", proposal.proposal_id)
    assert _rules(policy.policy_id) == (True, False, 2)
    policy.refresh_from_db()
    assert (policy.name, policy.authority_wallet_id) == ("relaxed", "")
    assert AuditEvent.objects.get(event="policy.relaxation_proposed").detail["actor"] == _actor(proposer)
    assert AuditEvent.objects.get(event="policy.relaxation_confirmed").detail["actor"] == _actor(confirmer)
    assert AuditEvent.objects.get(event="policy.updated").detail["proposed_by"] == _actor(proposer)


def test_the_proposer_cannot_confirm_their_own_not_even_a_superuser(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    root = _user(superuser=True)
    console = _console(root)
    console.post(f"/admin/permits/policybundle/{quote(policy.policy_id)}/change/", _form(policy, enabled="off"))
    proposal = PolicyChangeProposal.objects.get()
    r = _action(console, "confirm_selected", proposal.proposal_id)
    assert "second person" in r.content.decode()
    with pytest.raises(OwnProposal):
        services.policy_proposal_confirm(proposal_id=proposal.proposal_id, user=root, actor=_actor(root))
    assert _rules(policy.policy_id) == (True, True, 1)
    # Another superuser may.
    other = _user(superuser=True)
    services.policy_proposal_confirm(proposal_id=proposal.proposal_id, user=other, actor=_actor(other))
    assert _rules(policy.policy_id) == (False, True, 2)


def test_a_staff_user_without_the_permission_cannot_confirm_or_reject(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    proposal = services.policy_change(
        policy_id=policy.policy_id, actor_key_id=tenant.sponsor_key_id, actor_wallet_id=tenant.sponsor.wallet_id,
        enabled=False,
    ).proposal  # fmt: skip
    assert proposal is not None
    viewer = _user(permissions=("permits.view_policychangeproposal", "permits.change_policybundle"))
    for action in ("confirm_selected", "reject_selected"):
        _action(_console(viewer), action, proposal.proposal_id)
    with pytest.raises(ConfirmationNotAllowed):
        services.policy_proposal_confirm(proposal_id=proposal.proposal_id, user=viewer, actor=_actor(viewer))
    with pytest.raises(ConfirmationNotAllowed):
        services.policy_proposal_reject(proposal_id=proposal.proposal_id, user=viewer, actor=_actor(viewer))
    assert PolicyChangeProposal.objects.get().status == ProposalStatus.PENDING
    assert _rules(policy.policy_id) == (True, True, 1)


def test_an_expired_proposal_cannot_be_confirmed(tenant: Tenant, settings: Any) -> None:
    settings.POLICY_PROPOSAL_TTL_HOURS = 2
    policy = _approval_policy(tenant)
    proposal_id = tenant.sponsor_client.patch(
        f"/v1/policies/{policy.policy_id}", {"enabled": False}, format="json"
    ).json()["proposal_id"]
    proposal = PolicyChangeProposal.objects.get()
    assert proposal.expires_at - proposal.created_at == timedelta(hours=2)
    PolicyChangeProposal.objects.filter(pk=proposal_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    confirmer = _user(groups=("Approver admin",))
    with pytest.raises(ProposalExpired):
        services.policy_proposal_confirm(proposal_id=proposal_id, user=confirmer, actor=_actor(confirmer))
    r = _action(_console(confirmer), "confirm_selected", proposal_id)
    assert [(m.level_tag, m.message) for m in r.context["messages"]] == [
        (
            "error",
            f"{proposal_id}: This proposal has expired and can no longer be confirmed: propose the change again.",
        ),
        ("warning", "Confirmed 0 proposal(s)."),
    ]
    assert _rules(policy.policy_id) == (True, True, 1)
    proposal.refresh_from_db()
    assert proposal.effective_status(timezone.now()) == ProposalStatus.EXPIRED


def test_a_proposal_whose_policy_changed_since_cannot_be_confirmed(tenant: Tenant, operator_client: Any) -> None:
    policy = _approval_policy(tenant)
    confirmer = _user(groups=("Approver admin",))

    def propose() -> str:
        r = tenant.sponsor_client.patch(f"/v1/policies/{policy.policy_id}", {"enabled": False}, format="json")
        assert r.status_code == 202, r.content
        return str(r.json()["proposal_id"])

    # A later change supersedes it (the confirmer would confirm against rules they were not shown).
    first = propose()
    assert (
        tenant.sponsor_client.patch(f"/v1/policies/{policy.policy_id}", {"name": "x"}, format="json").status_code == 200
    )
    assert PolicyChangeProposal.objects.get(pk=first).status == ProposalStatus.SUPERSEDED
    assert AuditEvent.objects.filter(event="policy.updated").latest("seq").detail["proposals_superseded"] == [first]
    with pytest.raises(ProposalDecided):
        services.policy_proposal_confirm(proposal_id=first, user=confirmer, actor=_actor(confirmer))
    # A version moved behind the services' back: the version check refuses it too.
    second = propose()
    PolicyBundle.objects.filter(pk=policy.policy_id).update(version=9)
    with pytest.raises(ProposalStale):
        services.policy_proposal_confirm(proposal_id=second, user=confirmer, actor=_actor(confirmer))
    assert _rules(policy.policy_id) == (True, True, 9)


def test_rejecting_keeps_the_policy_and_ends_the_proposal(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    proposer = _user(groups=("Operator",))
    _console(proposer).post(
        f"/admin/permits/policybundle/{quote(policy.policy_id)}/change/", _form(policy, enabled="off")
    )
    proposal = PolicyChangeProposal.objects.get()
    confirmer = _user(groups=("Approver admin",))
    _action(_console(confirmer), "reject_selected", proposal.proposal_id)
    proposal.refresh_from_db()
    assert (proposal.status, proposal.decided_by_id) == (ProposalStatus.REJECTED, confirmer.pk)
    assert AuditEvent.objects.get(event="policy.relaxation_rejected").detail["actor"] == _actor(confirmer)
    with pytest.raises(ProposalDecided):
        services.policy_proposal_confirm(proposal_id=proposal.proposal_id, user=confirmer, actor=_actor(confirmer))
    assert _rules(policy.policy_id) == (True, True, 1)
    # The proposer may withdraw their own (it relaxes nothing).
    _console(proposer).post(
        f"/admin/permits/policybundle/{quote(policy.policy_id)}/change/", _form(policy, enabled="off")
    )
    mine = PolicyChangeProposal.objects.get(status=ProposalStatus.PENDING)
    services.policy_proposal_reject(proposal_id=mine.proposal_id, user=proposer, actor=_actor(proposer))
    assert PolicyChangeProposal.objects.get(pk=mine.pk).status == ProposalStatus.REJECTED


def test_a_decision_on_a_proposal_is_audited_on_the_policy_s_wallet_with_the_proposal_named(tenant: Tenant) -> None:
    policy = _approval_policy(tenant)
    proposer = _user(groups=("Operator",))
    confirmer = _user(permissions=("permits.confirm_policy_relaxation",))

    def propose(**changes: Any) -> PolicyChangeProposal:
        change = services.policy_change(policy_id=policy.policy_id, user=proposer, actor=_actor(proposer), **changes)
        assert change.proposal is not None
        return change.proposal

    rejected = propose(enabled=False)
    services.policy_proposal_reject(proposal_id=rejected.proposal_id, user=confirmer, actor=_actor(confirmer))
    confirmed = propose(human_approval_required=False)
    services.policy_proposal_confirm(proposal_id=confirmed.proposal_id, user=confirmer, actor=_actor(confirmer))
    names = {"policy_id": policy.policy_id, "proposed_by": _actor(proposer)}
    expected = {
        "policy.relaxation_rejected": {**names, "proposal_id": rejected.proposal_id, "actor": _actor(confirmer)},
        "policy.relaxation_confirmed": {
            **names,
            "proposal_id": confirmed.proposal_id,
            "relaxes": ["human_approval_required"],
            "changes": {"human_approval_required": False},
            "actor": _actor(confirmer),
        },
    }
    for event, detail in expected.items():
        audited = AuditEvent.objects.get(event=event)
        assert (audited.tenant_id, audited.wallet_id, audited.key_id) == (policy.tenant_id, policy.wallet_id, None)
        assert audited.endpoint == "/admin/permits/policychangeproposal/"
        assert audited.detail == detail


def test_the_confirmation_permission_ships_to_approver_admins_not_operators() -> None:
    def perms(name: str) -> set[str]:
        group = Group.objects.get(name=name)
        return {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}

    assert "permits.confirm_policy_relaxation" in perms("Approver admin")
    assert "permits.view_policychangeproposal" in perms("Approver admin")
    for name in ("Operator", "Finance", "Read-only auditor"):
        assert "permits.confirm_policy_relaxation" not in perms(name)
    assert "permits.view_policychangeproposal" in perms("Operator")
    # Approver admins propose nothing: they cannot change policies.
    assert "permits.change_policybundle" not in perms("Approver admin")


@pytest.mark.django_db(transaction=True)
def test_two_confirmations_racing_apply_the_change_once() -> None:
    tenant = make_tenant("race")
    policy = _approval_policy(tenant)
    proposal = services.policy_change(
        policy_id=policy.policy_id, actor_key_id=tenant.sponsor_key_id, actor_wallet_id=tenant.sponsor.wallet_id,
        human_approval_required=False,
    ).proposal  # fmt: skip
    assert proposal is not None
    # A transactional test may follow a flush, which keeps permissions (re-created) but not the groups.
    confirmers = [_user(permissions=("permits.confirm_policy_relaxation",)) for _ in range(2)]
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def confirm(user: Any) -> None:
        barrier.wait()
        try:
            services.policy_proposal_confirm(proposal_id=proposal.proposal_id, user=user, actor=_actor(user))
            outcomes.append("confirmed")
        except ProposalDecided:
            outcomes.append("decided")
        finally:
            connection.close()

    threads = [threading.Thread(target=confirm, args=(user,)) for user in confirmers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["confirmed", "decided"]
    assert _rules(policy.policy_id) == (True, False, 2)
    assert AuditEvent.objects.filter(event="policy.relaxation_confirmed").count() == 1
