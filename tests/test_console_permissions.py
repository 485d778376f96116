"""Console permissions (issue: the operator console, item 1): Django model permissions, never is_staff alone.

Every admin action is tried by a staff user who can see the list but lacks the action's permission
(refused, nothing changed) and by one who holds it (done, audited with ``actor: admin:<username>``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.test import Client
from django.utils import timezone

from access.models import APIKey
from audit.models import AuditEvent, ChainVerificationRecord
from billing.models import Wallet
from billing.services import wallet_freeze
from common.ids import new_id
from mcpgateway.models import Action
from permits.models import Permit, TenantApprover
from receipts.models import Receipt, RefundReconciliation
from tests import factories
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db
_users = iter(range(1, 10_000))


def staff(*permissions: str) -> tuple[Client, Any]:
    user = get_user_model().objects.create_user(f"staff{next(_users)}", password="pw-for-tests-only", is_staff=True)
    for label in permissions:
        app_label, codename = label.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    client.force_login(user)
    return client, user


@dataclass
class World:
    tenant: Tenant
    permit_id: str
    receipt_id: str
    owed_receipt_id: str
    frozen_wallet_id: str
    action_id: str
    executed_receipt_id: str


def _world(tenant: Tenant) -> World:
    from tests.test_receipts import make_receipt

    factories.top_up(tenant.sponsor, 100)
    receipt = make_receipt(tenant, outcome="delivery_uncertain")
    owed = make_receipt(tenant, outcome="failed_unrefunded", owed=True)
    permit = Permit.objects.get(permit_id=receipt.permit_id)
    frozen = factories.make_wallet(tenant.sponsor, "frozen")
    wallet_freeze(wallet=frozen, reason="test")
    # A delivery_uncertain action (as the gateway leaves one) for the reconciliation actions.
    uncertain = make_receipt(tenant, outcome="delivery_uncertain")
    action = Action.objects.create(
        action_id=uncertain.action_id, tenant_id=tenant.agent.tenant_id, wallet=tenant.agent, api_key_id="",
        idempotency_key=new_id("k"), request_hash="0" * 64, tool=uncertain.tool, transport="mcp",
        state="delivery_uncertain", outcome="delivery_uncertain", receipt=uncertain, created_at=timezone.now(),
        claimed_at=timezone.now(), completed_at=timezone.now(),
    )  # fmt: skip
    return World(
        tenant, permit.permit_id, receipt.receipt_id, owed.receipt_id, frozen.wallet_id, action.action_id,
        uncertain.receipt_id,
    )  # fmt: skip


@dataclass
class Case:
    name: str
    changelist: str
    action: str
    permission: str
    selected: Callable[[World], list[str]]
    form: dict[str, str]
    state: Callable[[World], Any]  # what the action changes


CASES = [
    Case("provision", "/admin/billing/wallet/", "provision_credits", "billing.provision_credits",
         lambda w: [w.tenant.sponsor.wallet_id], {"apply": "1", "amount": "1000000"},
         lambda w: Wallet.objects.get(pk=w.tenant.sponsor.wallet_id).balance),
    Case("fund", "/admin/billing/wallet/", "fund_from_parent", "billing.fund_wallet",
         lambda w: [w.tenant.agent.wallet_id], {"apply": "1", "amount": "5"},
         lambda w: Wallet.objects.get(pk=w.tenant.agent.wallet_id).balance),
    Case("freeze", "/admin/billing/wallet/", "freeze_wallets", "billing.freeze_wallet",
         lambda w: [w.tenant.agent.wallet_id], {"apply": "1", "reason": "x"},
         lambda w: Wallet.objects.get(pk=w.tenant.agent.wallet_id).status),
    # The frozen wallet: the agent's calls await reconciliation, and such a wallet does not close.
    Case("close", "/admin/billing/wallet/", "close_wallets", "billing.close_wallet",
         lambda w: [w.frozen_wallet_id], {"apply": "1", "post": "yes"},
         lambda w: Wallet.objects.get(pk=w.frozen_wallet_id).status),
    Case("revoke key", "/admin/access/apikey/", "revoke_selected", "access.revoke_key",
         lambda w: [w.tenant.agent_key_id], {"apply": "1", "post": "yes", "reason": "leaked in a log"},
         lambda w: APIKey.objects.get(pk=w.tenant.agent_key_id).status),
    Case("revoke permit", "/admin/permits/permit/", "revoke_selected", "permits.revoke_permit",
         lambda w: [w.permit_id], {"apply": "1", "post": "yes", "reason": "task finished early"},
         lambda w: Permit.objects.get(pk=w.permit_id).status),
    Case("mark not executed", "/admin/receipts/receipt/", "mark_not_executed", "receipts.reconcile",
         lambda w: [w.receipt_id], {"apply": "1", "post": "yes"},
         lambda w: RefundReconciliation.objects.filter(receipt_id=w.receipt_id).count()),
    Case("unfreeze", "/admin/billing/wallet/", "unfreeze_wallets", "billing.freeze_wallet",
         lambda w: [w.frozen_wallet_id], {},
         lambda w: Wallet.objects.get(pk=w.frozen_wallet_id).status),
    Case("emergency revoke", "/admin/billing/wallet/", "emergency_revoke_keys", "access.revoke_key",
         lambda w: [w.tenant.agent.wallet_id], {"post": "yes", "reason": "compromised host"},
         lambda w: APIKey.objects.get(pk=w.tenant.agent_key_id).status),
    Case("reconciled executed", "/admin/mcpgateway/action/", "reconciled_executed", "receipts.reconcile",
         lambda w: [w.action_id], {"post": "yes"},
         lambda w: AuditEvent.objects.filter(event="reconciliation.marked_executed").count()),
    Case("reconciled not executed", "/admin/mcpgateway/action/", "reconciled_not_executed", "receipts.reconcile",
         lambda w: [w.action_id], {"post": "yes"},
         lambda w: RefundReconciliation.objects.filter(receipt_id=w.executed_receipt_id).count()),
    Case("retry refund", "/admin/receipts/refundreconciliation/", "retry_selected", "receipts.reconcile",
         lambda w: [str(RefundReconciliation.objects.get(receipt_id=w.owed_receipt_id).pk)],
         {"apply": "1", "post": "yes"},
         lambda w: RefundReconciliation.objects.get(receipt_id=w.owed_receipt_id).status),
    Case("verify chain", "/admin/audit/chainhead/", "verify_selected", "audit.verify_chain",
         lambda w: [w.tenant.sponsor.wallet_id], {},
         lambda w: ChainVerificationRecord.objects.filter(chain=w.tenant.sponsor.wallet_id).count()),
]  # fmt: skip


def _view_permission(changelist: str) -> str:
    app_label, model = changelist.strip("/").split("/")[1:3]
    return f"{app_label}.view_{model}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_an_action_needs_its_permission(tenant: Tenant, case: Case) -> None:
    world = _world(tenant)
    before = case.state(world)
    client, _ = staff(_view_permission(case.changelist))
    listing = client.get(case.changelist)
    assert listing.status_code == 200
    assert f'value="{case.action}"'.encode() not in listing.content  # not offered
    data = {"action": case.action, "_selected_action": case.selected(world), **case.form}
    client.post(case.changelist, data)
    assert case.state(world) == before, f"{case.name} ran without {case.permission}"

    allowed, user = staff(_view_permission(case.changelist), case.permission)
    assert f'value="{case.action}"'.encode() in allowed.get(case.changelist).content
    allowed.post(case.changelist, data)
    assert case.state(world) != before, f"{case.name} did not run with {case.permission}"
    actors = [e.detail.get("actor") for e in AuditEvent.objects.order_by("-created_at")[:5]]
    assert f"admin:{user.get_username()}" in actors, actors
    # Besides the audit event, Django's LogEntry: the object's History and the index's Recent actions.
    entries = LogEntry.objects.filter(user=user, action_flag=CHANGE)
    assert entries.exists(), f"{case.name} wrote no LogEntry"
    history = allowed.get(f"{case.changelist}{quote(entries[0].object_id or '')}/history/")
    assert history.status_code == 200
    assert entries[0].change_message.encode() in history.content


def test_view_wallet_alone_cannot_provision_the_exact_attack(tenant: Tenant) -> None:
    client, _ = staff("billing.view_wallet")
    client.post(
        "/admin/billing/wallet/",
        {
            "action": "provision_credits",
            "_selected_action": [tenant.sponsor.wallet_id],
            "apply": "1",
            "amount": "1000000",
        },
    )
    assert Wallet.objects.get(pk=tenant.sponsor.wallet_id).balance == 0


def test_staff_without_permissions_sees_no_tenant_data(tenant: Tenant) -> None:
    world = _world(tenant)
    client, _ = staff()
    for path in (
        "/admin/permits/permit/",
        "/admin/receipts/receipt/",
        "/admin/billing/wallet/",
        "/admin/access/apikey/",
        "/admin/mcpgateway/action/",
        "/admin/audit/auditevent/",
        f"/admin/receipts/receipt/{quote(world.receipt_id)}/change/",
    ):
        assert client.get(path).status_code == 403, path
    index = client.get("/admin/").content.decode()
    assert world.receipt_id not in index
    assert Receipt.objects.get(pk=world.receipt_id).outcome == "delivery_uncertain"


def test_a_wallet_key_moves_money_so_issuing_one_needs_fund_wallet(tenant: Tenant) -> None:
    """A sponsor key funds agents from the sponsor and charges any wallet of the tenant: a staff user
    with add_apikey alone gets no key (403), whichever wallet it names."""
    client, _ = staff("access.view_apikey", "access.add_apikey", "billing.view_wallet")
    for wallet in (tenant.sponsor, tenant.agent):
        assert client.get("/admin/access/apikey/add/").status_code == 403
        r = client.post("/admin/access/apikey/add/", {"wallet": wallet.wallet_id, "name": "mine"})
        assert r.status_code == 403
    assert not APIKey.objects.filter(name="mine").exists()
    allowed, _ = staff("access.view_apikey", "access.add_apikey", "billing.fund_wallet")
    r = allowed.post("/admin/access/apikey/add/", {"wallet": tenant.sponsor.wallet_id, "name": "mine"})
    assert r.status_code == 302, r.content
    assert APIKey.objects.filter(wallet_id=tenant.sponsor.wallet_id, name="mine").exists()


def test_operator_keys_need_their_own_permission(tenant: Tenant) -> None:
    client, _ = staff("access.view_apikey", "access.add_apikey", "billing.fund_wallet")
    before = APIKey.objects.filter(wallet_id__isnull=True).count()
    r = client.post("/admin/access/apikey/add/", {"wallet": "", "name": "root", "operator_key": "on",
                                                   "confirm_operator_key": "on"})  # fmt: skip
    assert r.status_code == 200
    assert b"needs a superuser" in r.content
    assert APIKey.objects.filter(wallet_id__isnull=True).count() == before
    # A wallet key is fine with add_apikey and fund_wallet.
    r = client.post("/admin/access/apikey/add/", {"wallet": tenant.agent.wallet_id, "name": "bot"})
    assert r.status_code in (200, 302)
    assert APIKey.objects.filter(wallet_id=tenant.agent.wallet_id, name="bot").exists()


def test_revoking_an_operator_key_in_the_console_is_audited(tenant: Tenant) -> None:
    operator = factories.make_operator_key()
    client, user = staff("access.view_apikey", "access.revoke_key", "access.create_operator_key")
    client.post("/admin/access/apikey/", {"action": "revoke_selected", "_selected_action": [operator.key.key_id],
                                           "apply": "1", "post": "yes", "reason": "rotating operators"})  # fmt: skip
    assert APIKey.objects.get(pk=operator.key.key_id).status == "revoked"
    event = AuditEvent.objects.get(event="api_key.operator_revoked")
    assert event.detail["actor"] == f"admin:{user.get_username()}"
    assert event.detail["reason"] == "rotating operators"
    assert event.detail["revoked_key_id"] == operator.key.key_id


def test_approver_changes_are_audited_with_the_console_user(tenant: Tenant) -> None:
    approver_user = get_user_model().objects.create_user("alice", password="pw-for-tests-only")
    client, user = staff("permits.view_tenantapprover", "permits.add_tenantapprover")
    r = client.post(
        "/admin/permits/tenantapprover/add/", {"user": approver_user.pk, "tenant": tenant.sponsor.wallet_id}
    )
    assert r.status_code == 302, r.content[:500]
    assert TenantApprover.objects.filter(user=approver_user, tenant=tenant.sponsor).exists()
    event = AuditEvent.objects.get(event="approver.added")
    assert event.detail == {"user": "alice", "actor": f"admin:{user.get_username()}"}


def test_an_approver_admin_cannot_make_themselves_an_approver(tenant: Tenant) -> None:
    """Approving stays a second person's decision: adding oneself is refused, nothing written; a
    superuser may."""
    client, user = staff("permits.view_tenantapprover", "permits.add_tenantapprover")
    r = client.post("/admin/permits/tenantapprover/add/", {"user": user.pk, "tenant": tenant.sponsor.wallet_id})
    assert r.status_code == 200
    assert b"You cannot make yourself an approver" in r.content
    assert not TenantApprover.objects.filter(user=user).exists()
    assert not AuditEvent.objects.filter(event="approver.added").exists()
    root = get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    admin_client = Client()
    admin_client.force_login(root)
    r = admin_client.post("/admin/permits/tenantapprover/add/", {"user": root.pk, "tenant": tenant.sponsor.wallet_id})
    assert r.status_code == 302, r.content[:500]
    assert TenantApprover.objects.filter(user=root, tenant=tenant.sponsor).exists()


def test_roles_ship_as_groups() -> None:
    groups = {
        g.name: {f"{p.content_type.app_label}.{p.codename}" for p in g.permissions.all()} for g in Group.objects.all()
    }
    assert {"Operator", "Finance", "Approver admin", "Read-only auditor"} <= set(groups)
    assert "billing.provision_credits" in groups["Operator"]
    assert "billing.provision_credits" in groups["Finance"]
    assert "billing.provision_credits" not in groups["Read-only auditor"]
    assert all(p.split(".")[1].startswith("view_") for p in groups["Read-only auditor"])
    assert "permits.add_tenantapprover" in groups["Approver admin"]
    assert not any("create_operator_key" in perms for perms in groups.values())


DESTRUCTIVE = [
    "close",
    "revoke key",
    "revoke permit",
    "mark not executed",
    "retry refund",
    "emergency revoke",
    "reconciled executed",
    "reconciled not executed",
]


@pytest.mark.parametrize("case", [c for c in CASES if c.name in DESTRUCTIVE], ids=DESTRUCTIVE)
def test_destructive_actions_confirm_first(tenant: Tenant, case: Case) -> None:
    world = _world(tenant)
    before = case.state(world)
    client, _ = staff(_view_permission(case.changelist), case.permission)
    form = {k: v for k, v in case.form.items() if k != "post"}
    page = client.post(case.changelist, {"action": case.action, "_selected_action": case.selected(world), **form})
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="confirm-action"' in text
    assert "No, take me back" in text
    assert all(obj_id in text for obj_id in case.selected(world) if not obj_id.isdigit())
    assert case.state(world) == before  # nothing happened on one click


def test_emergency_revocation_from_the_console_covers_the_subtree(tenant: Tenant) -> None:
    child = factories.make_wallet(tenant.agent, "kid")
    child_key = factories.make_key(child)
    client, user = staff("billing.view_wallet", "access.revoke_key")
    data = {"action": "emergency_revoke_keys", "_selected_action": [tenant.agent.wallet_id]}
    page = client.post("/admin/billing/wallet/", data)
    assert b"Revoke every API key" in page.content
    assert APIKey.objects.get(pk=tenant.agent_key_id).status == "active"
    client.post("/admin/billing/wallet/", {**data, "post": "yes"})  # no reason: asked again, nothing revoked
    assert APIKey.objects.get(pk=tenant.agent_key_id).status == "active"
    client.post("/admin/billing/wallet/", {**data, "post": "yes", "reason": "host compromised"})
    assert APIKey.objects.get(pk=tenant.agent_key_id).status == "revoked"
    assert APIKey.objects.get(pk=tenant.agent_key_id).revoke_reason == "host compromised"
    assert APIKey.objects.get(pk=child_key.key.key_id).status == "revoked"
    assert APIKey.objects.get(pk=tenant.sponsor_key_id).status == "active"
    event = AuditEvent.objects.get(event="api_key.emergency_revoked")
    assert event.detail["actor"] == f"admin:{user.get_username()}"


def test_removing_an_approver_is_audited(tenant: Tenant) -> None:
    alice = get_user_model().objects.create_user("alice", password="pw-for-tests-only")
    approver = TenantApprover.objects.create(user=alice, tenant=tenant.sponsor)
    client, user = staff("permits.view_tenantapprover", "permits.delete_tenantapprover")
    r = client.post(f"/admin/permits/tenantapprover/{approver.pk}/delete/", {"post": "yes"})
    assert r.status_code == 302, r.content[:300]
    assert not TenantApprover.objects.filter(pk=approver.pk).exists()
    event = AuditEvent.objects.get(event="approver.removed")
    assert event.detail == {"user": "alice", "actor": f"admin:{user.get_username()}"}


def test_the_index_shows_the_last_chain_verification(tenant: Tenant) -> None:
    client, _ = staff("audit.view_auditevent")
    assert "none yet" in client.get("/admin/").content.decode()
    r = tenant.sponsor_client.post("/v1/audit/verify-chain", {}, format="json")
    assert r.status_code == 200
    page = client.get("/admin/").content.decode()
    assert f"{tenant.sponsor.tenant_id}: valid" in page
    # A user without the audit permission sees no such figure.
    other, _ = staff("billing.view_wallet")
    assert "Last audit chain verification" not in other.get("/admin/").content.decode()
