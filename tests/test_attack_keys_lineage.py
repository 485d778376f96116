"""A key tries to outlive or take over the keys above it, or to mint keys where no key belongs (adversarial review).

Each test reproduces an attack that worked before the rule it exercises existed.
"""

from __future__ import annotations

from typing import Any

import pytest

from access import services as keys_service
from access.models import APIKey, KeyRotationLog
from billing.models import Wallet
from billing.services import wallet_close, wallet_freeze
from tests import factories
from tests.conftest import Tenant, client_for

pytestmark = pytest.mark.django_db


def _mint(client: Any, wallet_id: str) -> dict[str, Any]:
    r = client.post("/v1/api-keys", {"wallet_id": wallet_id, "name": "spare"}, format="json")
    assert r.status_code == 201, r.content
    return dict(r.json())


def _rotate(client: Any, wallet_id: str, key_id: str, **body: Any) -> Any:
    return client.post("/v1/api-keys/rotate", {"wallet_id": wallet_id, "key_id": key_id, **body}, format="json")


def _alive(secret: str, wallet_id: str) -> bool:
    return client_for(secret).get(f"/v1/billing/wallets/{wallet_id}").status_code == 200


def _active_keys(wallet: Wallet) -> set[str]:
    return set(APIKey.objects.filter(wallet_id=wallet.wallet_id, status="active").values_list("key_id", flat=True))


# --- A key cannot rotate a key it descends from ------------------------------------------------


@pytest.mark.parametrize("revoke_old", [True, False])
def test_a_delegate_cannot_rotate_away_the_key_that_minted_it(tenant: Tenant, revoke_old: bool) -> None:
    """The agent's key mints a delegate; the delegate rotates the agent's key. The rotation revoked the
    agent's key with its lineage (the delegate too) but spared the successor, minted by the delegate:
    the delegate locked out its minter and held a live key."""
    agent_id = tenant.agent.wallet_id
    delegate = _mint(tenant.agent_client, agent_id)
    assert delegate["created_by_key_id"] == tenant.agent_key_id
    before = _active_keys(tenant.agent)

    r = _rotate(client_for(delegate["secret"]), agent_id, tenant.agent_key_id, revoke_old=revoke_old)

    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] == "ancestor_key_rotation"
    assert r.json()["detail"]["key_id"] == tenant.agent_key_id
    assert _active_keys(tenant.agent) == before  # nothing minted, nothing revoked
    assert _alive(tenant.agent_secret, agent_id)
    assert _alive(delegate["secret"], agent_id)
    assert not KeyRotationLog.objects.filter(wallet_id=tenant.agent.wallet_id, action="rotated").exists()


def test_a_key_cannot_rotate_any_key_above_it_in_its_lineage(tenant: Tenant) -> None:
    """Two steps down (minted by a delegate), and through a rotation's copy (``rotated_from``)."""
    agent_id = tenant.agent.wallet_id
    delegate = _mint(tenant.agent_client, agent_id)
    grandchild = _mint(client_for(delegate["secret"]), agent_id)
    r = _rotate(client_for(grandchild["secret"]), agent_id, tenant.agent_key_id)
    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] == "ancestor_key_rotation"

    # The sponsor rotates the delegate keeping it (an overlap): the copy replaced a key of the agent key's lineage.
    copy = _rotate(tenant.sponsor_client, agent_id, delegate["key_id"], revoke_old=False).json()["new_key"]
    assert copy["created_by_key_id"] == tenant.sponsor_key_id
    r = _rotate(client_for(copy["secret"]), agent_id, tenant.agent_key_id)
    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] == "ancestor_key_rotation"
    assert {tenant.agent_key_id, delegate["key_id"], grandchild["key_id"], copy["key_id"]} <= _active_keys(tenant.agent)


def test_a_key_still_rotates_itself_what_it_minted_and_keys_of_its_wallet(tenant: Tenant) -> None:
    """The refusal is for keys the caller descends from only. A key rotates itself (its successor kept),
    a key it minted, and another key of a wallet in its reach that it did not mint (docs/architecture.md, the
    reach rule: a wallet key acts on its own wallet and its descendants, and may revoke that key as well)."""
    agent_id = tenant.agent.wallet_id
    delegate = _mint(tenant.agent_client, agent_id)
    r = _rotate(tenant.agent_client, agent_id, delegate["key_id"])
    assert r.status_code == 200, r.content
    assert not _alive(delegate["secret"], agent_id)
    assert _alive(r.json()["new_key"]["secret"], agent_id)

    by_sponsor = _mint(tenant.sponsor_client, agent_id)  # of the sponsor key's lineage, not the agent key's
    r = _rotate(tenant.agent_client, agent_id, by_sponsor["key_id"])
    assert r.status_code == 200, r.content
    assert not _alive(by_sponsor["secret"], agent_id)
    assert _alive(r.json()["new_key"]["secret"], agent_id)
    assert _alive(tenant.agent_secret, agent_id)

    r = _rotate(tenant.agent_client, agent_id, tenant.agent_key_id)
    assert r.status_code == 200, r.content
    assert not _alive(tenant.agent_secret, agent_id)
    assert _alive(r.json()["new_key"]["secret"], agent_id)


def test_a_successor_never_outlives_its_minters_revocation(tenant: Tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backstop behind the refusal: should the descent check miss (it reads once, before the locks), a
    rotation whose lineage revocation takes its own minter is refused and writes nothing."""
    agent_id = tenant.agent.wallet_id
    delegate = _mint(tenant.agent_client, agent_id)
    before = _active_keys(tenant.agent)
    monkeypatch.setattr(keys_service, "_descends_from", lambda key_id, ancestor_id: False)

    r = _rotate(client_for(delegate["secret"]), agent_id, tenant.agent_key_id)

    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] == "ancestor_key_rotation"
    assert _active_keys(tenant.agent) == before
    assert APIKey.objects.filter(wallet_id=tenant.agent.wallet_id).count() == len(before)


# --- No key is minted for a closed wallet -----------------------------------------------------


def test_no_key_is_minted_or_rotated_for_a_closed_wallet(tenant: Tenant) -> None:
    child = factories.make_wallet(tenant.agent, "kid")
    child_key = _mint(tenant.agent_client, child.wallet_id)
    wallet_close(wallet=Wallet.objects.get(pk=child.pk))

    r = tenant.agent_client.post("/v1/api-keys", {"wallet_id": child.wallet_id, "name": "late"}, format="json")
    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] == "wallet_closed"
    assert r.json()["detail"]["wallet_id"] == child.wallet_id

    r = _rotate(tenant.agent_client, child.wallet_id, child_key["key_id"])
    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] == "wallet_closed"
    assert _active_keys(child) == {child_key["key_id"]}

    # Its keys can still be revoked.
    assert tenant.agent_client.delete(f"/v1/api-keys/{child.wallet_id}/{child_key['key_id']}").status_code == 204
    assert _active_keys(child) == set()


def test_a_frozen_wallet_still_gets_keys(tenant: Tenant) -> None:
    """A freeze is a spend control (decisions.md, Money): a wallet frozen after a leaked key spent too fast
    must be able to rotate that key. Nothing the new key does can spend while the freeze holds."""
    wallet_freeze(wallet=tenant.agent, reason="investigation")
    agent_id = tenant.agent.wallet_id
    minted = _mint(tenant.sponsor_client, agent_id)
    assert _alive(minted["secret"], agent_id)
    r = _rotate(tenant.agent_client, agent_id, tenant.agent_key_id)
    assert r.status_code == 200, r.content
    assert not _alive(tenant.agent_secret, agent_id)
