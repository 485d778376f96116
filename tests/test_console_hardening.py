"""Console hardening: what a staff user could do with a crafted request or a stock Django page.

Accounts and groups change only by superusers (a user admin could otherwise make themselves a
superuser or take over an approver); an approver's user is not deleted from under the approver;
"Save as new" never creates an object; an amount that overflows a balance is refused; the API
key's secret hash cannot be probed by filtering; a crafted filter is refused, not a 500.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.test import Client

from access.models import APIKey
from audit.models import AuditEvent
from billing import services
from billing.models import LedgerEntry, ServicePrice, Wallet
from common.errors import RequestValidationError
from permits.models import TenantApprover
from tests import factories
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db
_users = iter(range(1, 10_000))
# numeric(20,8): the largest balance a wallet can hold.
LARGEST = Decimal("999999999999.99999999")


def staff(*permissions: str, superuser: bool = False) -> tuple[Client, Any]:
    user = get_user_model().objects.create_user(
        f"staff{next(_users)}", password="pw-for-tests-only", is_staff=True, is_superuser=superuser
    )
    for label in permissions:
        app_label, codename = label.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client, user


def approver(tenant: Tenant, username: str = "alice") -> Any:
    user = get_user_model().objects.create_user(username, password="alice-pw-123456")
    TenantApprover.objects.create(user=user, tenant=tenant.sponsor)
    return user


def assert_bad_request(response: Any) -> None:
    """The project's answer to a malformed request (``common.errors.handler400``), never a 500."""
    assert response.status_code == 422, (response.status_code, response.content[:300])
    assert response.json()["detail"][0]["type"] == "bad_request"


# 1. Users and groups: only superusers change them.


def test_change_user_alone_cannot_make_oneself_superuser(tenant: Tenant) -> None:
    client, user = staff("auth.change_user")
    form = {
        "username": user.username,
        "is_active": "on",
        "is_staff": "on",
        "is_superuser": "on",
        "date_joined_0": "2024-01-01",
        "date_joined_1": "00:00:00",
    }
    assert client.post(f"/admin/auth/user/{quote(user.pk)}/change/", form).status_code == 403
    user.refresh_from_db()
    assert not user.is_superuser


def test_change_user_alone_cannot_reset_an_approvers_password(tenant: Tenant) -> None:
    alice = approver(tenant)
    client, _ = staff("auth.change_user")
    assert client.get(f"/admin/auth/user/{alice.pk}/password/").status_code == 403
    r = client.post(
        f"/admin/auth/user/{alice.pk}/password/",
        {"password1": "Mallory-owns-this-9", "password2": "Mallory-owns-this-9"},
    )
    assert r.status_code == 403
    alice.refresh_from_db()
    assert alice.check_password("alice-pw-123456")


def test_add_and_delete_user_alone_are_refused(tenant: Tenant) -> None:
    alice = approver(tenant)
    # delete_tenantapprover too: Django asks for the delete permission of every row a delete cascades to.
    client, _ = staff("auth.add_user", "auth.delete_user", "auth.view_user", "permits.delete_tenantapprover")
    r = client.post("/admin/auth/user/add/", {"username": "mallory2", "password1": "x", "password2": "x"})
    assert r.status_code == 403
    assert client.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"}).status_code == 403
    assert get_user_model().objects.filter(pk=alice.pk).exists()
    assert not get_user_model().objects.filter(username="mallory2").exists()


def test_change_group_alone_cannot_widen_a_group(tenant: Tenant) -> None:
    client, user = staff("auth.change_group")
    group = Group.objects.get(name="Read-only auditor")
    user.groups.add(group)
    extra = Permission.objects.get(content_type__app_label="access", codename="create_operator_key")
    form = {"name": group.name, "permissions": [p.pk for p in group.permissions.all()] + [extra.pk]}
    assert client.post(f"/admin/auth/group/{quote(group.pk)}/change/", form).status_code == 403
    assert client.post("/admin/auth/group/add/", {"name": "mine", "permissions": [extra.pk]}).status_code == 403
    assert not get_user_model().objects.get(pk=user.pk).has_perm("access.create_operator_key")
    assert not Group.objects.filter(name="mine").exists()


def test_view_permissions_still_show_users_and_groups(tenant: Tenant) -> None:
    alice = approver(tenant)
    client, _ = staff("auth.view_user", "auth.view_group")
    assert client.get("/admin/auth/user/").status_code == 200
    page = client.get(f"/admin/auth/user/{quote(alice.pk)}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content  # read-only
    assert client.get("/admin/auth/group/").status_code == 200


def test_a_superuser_still_manages_users_and_groups(tenant: Tenant) -> None:
    client, _ = staff(superuser=True)
    r = client.post(
        "/admin/auth/user/add/",
        {
            "username": "bob",
            "password1": "Bob-pw-123456789",
            "password2": "Bob-pw-123456789",
            "usable_password": "true",
        },
    )
    assert r.status_code == 302, r.content[:500]
    bob = get_user_model().objects.get(username="bob")
    r = client.post(
        f"/admin/auth/user/{bob.pk}/password/", {"password1": "Bob-new-pw-98765", "password2": "Bob-new-pw-98765"}
    )
    assert r.status_code == 302
    bob.refresh_from_db()
    assert bob.check_password("Bob-new-pw-98765")
    assert client.post("/admin/auth/group/add/", {"name": "Night shift"}).status_code == 302
    assert client.post(f"/admin/auth/user/{bob.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not get_user_model().objects.filter(username="bob").exists()


def test_an_approvers_user_is_not_deleted_from_under_the_approver(tenant: Tenant) -> None:
    """Deleting the user of an approver is refused (PROTECT): the approver is removed first on its own
    page, which audits ``approver.removed``; then the user can go."""
    alice = approver(tenant)
    client, _ = staff(superuser=True)
    page = client.get(f"/admin/auth/user/{alice.pk}/delete/")
    assert page.status_code == 200
    assert b"Cannot delete user" in page.content
    row = TenantApprover.objects.get(user=alice)
    assert f'Tenant approver: <a href="/admin/permits/tenantapprover/{quote(row.pk)}/change/">'.encode() in page.content
    client.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"})
    assert get_user_model().objects.filter(pk=alice.pk).exists()
    bulk = {"action": "delete_selected", "_selected_action": [alice.pk], "post": "yes"}
    client.post("/admin/auth/user/", bulk)
    assert TenantApprover.objects.filter(user=alice, tenant=tenant.sponsor).exists()
    assert not AuditEvent.objects.filter(event="approver.removed").exists()

    assert client.post(f"/admin/permits/tenantapprover/{row.pk}/delete/", {"post": "yes"}).status_code == 302
    assert AuditEvent.objects.filter(event="approver.removed").exists()
    assert client.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not get_user_model().objects.filter(pk=alice.pk).exists()


# 2. "Save as new" never creates an object through the generic form.


def test_save_as_new_on_a_wallet_is_refused(tenant: Tenant) -> None:
    client, _ = staff("billing.view_wallet", "billing.add_wallet")
    before = Wallet.objects.count()
    for wallet in (tenant.agent, tenant.sponsor):
        r = client.post(f"/admin/billing/wallet/{quote(wallet.wallet_id)}/change/", {"_saveasnew": "1", "name": "copy"})
        assert r.status_code == 403
    assert Wallet.objects.count() == before


def test_save_as_new_is_refused_on_every_console_page(tenant: Tenant) -> None:
    price, _ = ServicePrice.objects.get_or_create(category="tooling", defaults={"credits_per_unit": 1})
    client, _ = staff(superuser=True)
    r = client.post("/admin/billing/serviceprice/tooling/change/", {"_saveasnew": "1", "credits_per_unit": "2"})
    assert r.status_code == 403
    assert ServicePrice.objects.get(category="tooling").credits_per_unit == price.credits_per_unit
    alice = approver(tenant)
    r = client.post(f"/admin/auth/user/{quote(alice.pk)}/change/", {"_saveasnew": "1", "username": "alice2"})
    assert r.status_code == 403
    assert not get_user_model().objects.filter(username="alice2").exists()


# 3. An amount that would overflow a balance (numeric(20,8)) is refused, not a 500.


def test_provisioning_past_the_largest_balance_is_refused(tenant: Tenant) -> None:
    client, _ = staff("billing.view_wallet", "billing.provision_credits")
    data = {
        "action": "provision_credits",
        "_selected_action": [tenant.sponsor.wallet_id],
        "apply": "1",
        "amount": str(LARGEST),
    }
    assert client.post("/admin/billing/wallet/", data).status_code == 302
    entries = LedgerEntry.objects.count()
    r = client.post("/admin/billing/wallet/", data, follow=True)
    assert r.status_code == 200
    assert b"the largest balance a wallet holds" in r.content
    assert Wallet.objects.get(pk=tenant.sponsor.wallet_id).balance == LARGEST
    assert LedgerEntry.objects.count() == entries


def test_funding_past_the_largest_balance_is_refused_by_the_service(tenant: Tenant) -> None:
    factories.top_up(tenant.sponsor, LARGEST)
    services.wallet_fund(source=tenant.sponsor, target=tenant.agent, amount=LARGEST)
    services.wallet_provision(wallet=tenant.sponsor, amount=Decimal(5))
    with pytest.raises(RequestValidationError) as refused:
        services.wallet_fund(source=tenant.sponsor, target=tenant.agent, amount=Decimal(5))
    assert refused.value.errors[0]["type"] == "balance_overflow"
    assert Wallet.objects.get(pk=tenant.agent.wallet_id).balance == LARGEST
    assert Wallet.objects.get(pk=tenant.sponsor.wallet_id).balance == 5


# 4. The secret hash cannot be probed by filtering.


def test_secret_hash_lookups_are_refused(tenant: Tenant) -> None:
    client, _ = staff("access.view_apikey")
    key = APIKey.objects.get(pk=tenant.agent_key_id)
    for query in (
        f"secret_hash__startswith={key.secret_hash[:6]}",
        f"secret_hash={key.secret_hash}",
        f"secret_hash__gt={key.secret_hash[:6]}",
    ):
        r = client.get(f"/admin/access/apikey/?{query}")
        assert_bad_request(r)
        assert key.key_id not in r.content.decode()
    assert key.key_id in client.get("/admin/access/apikey/?status=active").content.decode()


# 5. A crafted filter is refused, not a 500; normal filters, search and date hierarchy still work.


@pytest.mark.parametrize(
    "query",
    [
        "name__regex=(",
        "name__iregex=(",
        "parent__name__regex=x",
        "wallet_id=%00",
        "q=%00",
        "name__startswith=a%00b",
        "created_at__year=%00",
    ],
)
def test_crafted_changelist_filters_are_refused(tenant: Tenant, query: str) -> None:
    client, _ = staff("billing.view_wallet")
    assert_bad_request(client.get(f"/admin/billing/wallet/?{query}"))


def test_nul_in_a_form_value_is_refused(tenant: Tenant) -> None:
    client, _ = staff("billing.view_wallet", "billing.freeze_wallet")
    r = client.post("/admin/billing/wallet/", {"action": "unfreeze_wallets", "_selected_action": ["w\x00"]})
    assert_bad_request(r)


def test_a_lone_surrogate_is_refused(tenant: Tenant) -> None:
    # The request's charset decodes the query: raw_unicode_escape turns "\ud800" into a lone surrogate.
    client, _ = staff("billing.view_wallet")
    r = client.get("/admin/billing/wallet/?q=%5Cud800", CONTENT_TYPE="text/plain; charset=raw_unicode_escape")
    assert_bad_request(r)


def test_normal_filters_search_and_dates_still_work(tenant: Tenant) -> None:
    client, _ = staff("billing.view_wallet", "receipts.view_receipt", "billing.view_ledgerentry")
    wallet = tenant.agent
    year = wallet.created_at.year
    for query in (
        f"q={wallet.wallet_id}",
        "wallet_type__exact=agent&status__exact=active",
        f"parent__wallet_id__exact={tenant.sponsor.wallet_id}",
        f"created_at__year={year}&created_at__month={wallet.created_at.month}",
        "o=2",
        f"q=caf\u00e9&name__startswith={wallet.name[:3]}",
    ):
        r = client.get(f"/admin/billing/wallet/?{query}")
        assert r.status_code == 200, query
    assert wallet.wallet_id in client.get(f"/admin/billing/wallet/?q={wallet.wallet_id}").content.decode()
    assert client.get(f"/admin/receipts/receipt/?created_at__year={year}").status_code == 200
    assert client.get(f"/admin/billing/ledgerentry/?account={wallet.wallet_id}").status_code == 200
