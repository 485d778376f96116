"""API keys: the six operations, storage, masking, revocation and scoping (spec "API keys")."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from audit.models import AuditEvent
from billing.models import APIKey
from tests import factories
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

SECRET_RE = re.compile(r"^tg_key_[0-9A-Za-z]{22}_[0-9A-Za-z]{32,}$")


def create_key(client, wallet_id, name="worker"):
    return client.post("/v1/api-keys", {"wallet_id": wallet_id, "name": name}, format="json")


def test_create_reveals_secret_once_and_stores_only_its_hash(tenant, caplog):
    caplog.set_level(logging.DEBUG)
    r = create_key(tenant.sponsor_client, tenant.sponsor.wallet_id)
    assert r.status_code == 201, r.content
    assert r["Cache-Control"] == "no-store"  # no cache may keep the one copy of the secret
    body = r.json()
    secret = body["secret"]
    assert SECRET_RE.match(secret)
    assert body["key_id"] in secret
    assert body["wallet_id"] == tenant.sponsor.wallet_id
    assert body["status"] == "active"

    # Stored value: SHA-256 of the secret, never the secret.
    with connection.cursor() as cur:
        cur.execute("SELECT * FROM billing_api_key WHERE key_id = %s", [body["key_id"]])
        row = cur.fetchone()
    assert row is not None
    assert not any(secret in str(col) for col in row)
    assert hashlib.sha256(secret.encode()).hexdigest() in row

    # Listing is masked.
    listing = tenant.sponsor_client.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}")
    assert listing.status_code == 200
    assert secret not in listing.content.decode()
    item = next(i for i in listing.json()["items"] if i["key_id"] == body["key_id"])
    assert "secret" not in item
    assert item["masked_key"].endswith(secret[-4:])
    assert "*" in item["masked_key"]

    # The new key works; its secret is never logged, nor stored in audit events.
    assert client_for(secret).get(f"/v1/api-keys/{tenant.sponsor.wallet_id}").status_code == 200
    assert secret not in caplog.text
    assert not AuditEvent.objects.filter(detail__icontains=secret[-20:]).exists()


@pytest.mark.parametrize("scheme", ["x-api-key", "bearer"])
def test_both_credential_headers_are_accepted(tenant, scheme):
    from rest_framework.test import APIClient

    client = APIClient()
    if scheme == "bearer":
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.sponsor_secret}")
    else:
        client.credentials(HTTP_X_API_KEY=tenant.sponsor_secret)
    assert client.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}").status_code == 200


@pytest.mark.parametrize(
    "credential",
    [
        None,
        "",
        "short",
        "tg_key_abc_def",
        "tg_key_" + "A" * 22 + "_" + "B" * 40,  # well-formed, unknown
        "not-a-tollgate-key-" + "x" * 60,
    ],
)
def test_bad_credentials_are_401(tenant, credential):
    from rest_framework.test import APIClient

    client = APIClient()
    if credential is not None:
        client.credentials(HTTP_X_API_KEY=credential)
    r = client.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}")
    assert r.status_code == 401
    assert r.json()["detail"]["error"] in {"not_authenticated", "invalid_api_key"}
    assert "WWW-Authenticate" in r


def test_wrong_secret_for_existing_key_id_is_401(tenant):
    key_id = tenant.sponsor_key_id
    forged = f"tg_{key_id}_" + "Z" * 40
    r = client_for(forged).get(f"/v1/api-keys/{tenant.sponsor.wallet_id}")
    assert r.status_code == 401


def test_non_bearer_authorization_scheme_is_401(tenant):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Basic {tenant.sponsor_secret}")
    assert client.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}").status_code == 401


def test_scoping_own_wallet_and_descendants_only(tenant, other_tenant):
    # Sponsor key reaches its agent.
    assert create_key(tenant.sponsor_client, tenant.agent.wallet_id).status_code == 201
    # Agent key does not reach its parent sponsor.
    r = create_key(tenant.agent_client, tenant.sponsor.wallet_id)
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "wallet_access_denied"
    # Nor another tenant's wallets.
    for client in (tenant.sponsor_client, tenant.agent_client):
        assert create_key(client, other_tenant.sponsor.wallet_id).status_code == 403
        assert client.get(f"/v1/api-keys/{other_tenant.agent.wallet_id}").status_code == 403
        assert client.get(f"/v1/api-keys/{other_tenant.agent.wallet_id}/logs").status_code == 403
    # Sibling agent.
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    assert create_key(tenant.agent_client, sibling.wallet_id).status_code == 403
    # Unknown wallet: wallet keys cannot tell it from a foreign one.
    assert create_key(tenant.sponsor_client, "agt_doesnotexist").status_code == 403


def test_operator_reaches_every_wallet_and_gets_404_for_unknown(tenant, other_tenant, operator_client):
    assert create_key(operator_client, other_tenant.agent.wallet_id).status_code == 201
    r = create_key(operator_client, "agt_doesnotexist")
    assert r.status_code == 404
    assert r.json()["detail"]["error"] == "not_found"


def test_revoked_key_is_refused_on_the_very_next_request(tenant):
    victim = create_key(tenant.sponsor_client, tenant.agent.wallet_id).json()
    victim_client = client_for(victim["secret"])
    assert victim_client.get(f"/v1/api-keys/{tenant.agent.wallet_id}").status_code == 200

    r = tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/{victim['key_id']}")
    assert r.status_code == 204
    assert r.content == b""

    refused = victim_client.get(f"/v1/api-keys/{tenant.agent.wallet_id}")
    assert refused.status_code == 401
    key = APIKey.objects.get(key_id=victim["key_id"])
    assert key.status == "revoked"
    assert key.revoke_reason == "user_request"
    # Revoking again is harmless; unknown key ids are 404.
    assert tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/{victim['key_id']}").status_code == 204
    assert tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/key_nope").status_code == 404


def test_revoke_records_the_reason(tenant):
    victim = create_key(tenant.sponsor_client, tenant.agent.wallet_id).json()
    r = tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/{victim['key_id']}?reason=compromised")
    assert r.status_code == 204
    assert APIKey.objects.get(key_id=victim["key_id"]).revoke_reason == "compromised"
    logs = tenant.sponsor_client.get(f"/v1/api-keys/{tenant.agent.wallet_id}/logs").json()
    assert {"action": "revoked", "key_id": victim["key_id"], "reason": "compromised"}.items() <= logs[0].items()


def test_key_of_one_wallet_cannot_be_revoked_through_another(tenant):
    # The agent's key addressed under the sponsor's wallet id: not found there.
    r = tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.sponsor.wallet_id}/{tenant.agent_key_id}")
    assert r.status_code == 404
    assert APIKey.objects.get(key_id=tenant.agent_key_id).status == "active"


def test_rotation_revokes_old_key_by_default(tenant):
    r = tenant.sponsor_client.post(
        "/v1/api-keys/rotate", {"wallet_id": tenant.agent.wallet_id, "key_id": tenant.agent_key_id}, format="json"
    )
    assert r.status_code == 200, r.content
    assert r["Cache-Control"] == "no-store"
    body = r.json()
    assert body["old_key_revoked"] is True
    new_secret = body["new_key"]["secret"]
    assert SECRET_RE.match(new_secret)
    assert body["new_key"]["rotated_from"] == tenant.agent_key_id
    assert tenant.agent_client.get(f"/v1/api-keys/{tenant.agent.wallet_id}").status_code == 401
    assert client_for(new_secret).get(f"/v1/api-keys/{tenant.agent.wallet_id}").status_code == 200
    # A revoked key cannot be rotated.
    again = tenant.sponsor_client.post(
        "/v1/api-keys/rotate", {"wallet_id": tenant.agent.wallet_id, "key_id": tenant.agent_key_id}, format="json"
    )
    assert again.status_code == 409


def test_rotation_can_keep_the_old_key(tenant):
    r = tenant.agent_client.post(
        "/v1/api-keys/rotate",
        {"wallet_id": tenant.agent.wallet_id, "key_id": tenant.agent_key_id, "revoke_old": False},
        format="json",
    )
    assert r.status_code == 200
    assert r.json()["old_key_revoked"] is False
    assert tenant.agent_client.get(f"/v1/api-keys/{tenant.agent.wallet_id}").status_code == 200
    assert client_for(r.json()["new_key"]["secret"]).get(f"/v1/api-keys/{tenant.agent.wallet_id}").status_code == 200
    logs = tenant.agent_client.get(f"/v1/api-keys/{tenant.agent.wallet_id}/logs").json()
    assert logs[0]["action"] == "rotated"
    assert logs[0]["new_key_id"] == r.json()["new_key"]["key_id"]


def test_emergency_revocation_refuses_every_key_of_the_wallet_and_no_other(tenant, other_tenant):
    extra = [create_key(tenant.sponsor_client, tenant.agent.wallet_id).json()["secret"] for _ in range(3)]
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    sibling_secret = factories.make_key(sibling).secret

    r = tenant.sponsor_client.post(
        "/v1/api-keys/emergency-revoke", {"wallet_id": tenant.agent.wallet_id, "reason": "leak"}, format="json"
    )
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["revoked_count"] == 4
    assert set(body["revoked_key_ids"]) >= {tenant.agent_key_id}

    for secret in [tenant.agent_secret, *extra]:
        assert client_for(secret).get(f"/v1/api-keys/{tenant.agent.wallet_id}").status_code == 401
    # Untouched: the sponsor, a sibling, another tenant.
    assert tenant.sponsor_client.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}").status_code == 200
    assert client_for(sibling_secret).get(f"/v1/api-keys/{sibling.wallet_id}").status_code == 200
    assert other_tenant.agent_client.get(f"/v1/api-keys/{other_tenant.agent.wallet_id}").status_code == 200
    logs = tenant.sponsor_client.get(f"/v1/api-keys/{tenant.agent.wallet_id}/logs").json()
    assert sum(1 for e in logs if e["action"] == "emergency_revoked") == 4


def test_emergency_revocation_of_own_wallet_revokes_the_caller_too(tenant):
    r = tenant.agent_client.post("/v1/api-keys/emergency-revoke", {"wallet_id": tenant.agent.wallet_id}, format="json")
    assert r.status_code == 200
    assert tenant.agent_client.get(f"/v1/api-keys/{tenant.agent.wallet_id}").status_code == 401


def test_logs_limit_and_validation(tenant):
    for _ in range(3):
        create_key(tenant.sponsor_client, tenant.agent.wallet_id)
    url = f"/v1/api-keys/{tenant.agent.wallet_id}/logs"
    assert len(tenant.sponsor_client.get(url).json()) == 4  # the fixture's key + 3
    assert len(tenant.sponsor_client.get(url + "?limit=2").json()) == 2
    for bad in ("0", "201", "abc"):
        r = tenant.sponsor_client.get(url + f"?limit={bad}")
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["query", "limit"]


def test_list_pagination_bounds(tenant):
    url = f"/v1/api-keys/{tenant.sponsor.wallet_id}"
    for query in ("limit=0", "limit=201", "offset=-1", "limit=x"):
        r = tenant.sponsor_client.get(f"{url}?{query}")
        assert r.status_code == 422, query
        detail = r.json()["detail"]
        assert isinstance(detail, list)
        assert {"loc", "msg", "type"} <= detail[0].keys()
        assert detail[0]["loc"][0] == "query"
    body = tenant.sponsor_client.get(f"{url}?limit=200&offset=0").json()
    assert body["limit"] == 200
    assert body["offset"] == 0


def test_create_validation_errors_have_the_http_validation_error_shape(tenant):
    r = tenant.sponsor_client.post("/v1/api-keys", {}, format="json")
    assert r.status_code == 422
    assert r.json()["detail"] == [{"loc": ["body", "wallet_id"], "msg": "This field is required.", "type": "required"}]
    r = tenant.sponsor_client.post("/v1/api-keys", "[1, 2]", content_type="application/json")
    assert r.status_code == 422
    r = tenant.sponsor_client.post("/v1/api-keys", "{not json", content_type="application/json")
    assert r.status_code == 422
    assert r.json()["detail"][0]["type"] == "json_invalid"


def test_every_key_operation_is_audited(tenant):
    wallet_id = tenant.agent.wallet_id
    new = create_key(tenant.sponsor_client, wallet_id).json()
    tenant.sponsor_client.post("/v1/api-keys/rotate", {"wallet_id": wallet_id, "key_id": new["key_id"]}, format="json")
    tenant.sponsor_client.delete(f"/v1/api-keys/{wallet_id}/{tenant.agent_key_id}")
    tenant.sponsor_client.post("/v1/api-keys/emergency-revoke", {"wallet_id": wallet_id}, format="json")
    events = list(
        AuditEvent.objects.filter(wallet_id=wallet_id, event__startswith="api_key.").values_list("event", flat=True)
    )
    for name in ("api_key.created", "api_key.rotated", "api_key.revoked", "api_key.emergency_revoked"):
        assert name in events
    rotated = AuditEvent.objects.get(event="api_key.rotated", wallet_id=wallet_id)
    assert rotated.key_id == tenant.sponsor_key_id
    assert rotated.tenant_id == tenant.sponsor.tenant_id
    assert rotated.request_id


def test_a_key_revoked_while_its_statement_runs_is_401_not_500(tenant, monkeypatch, settings) -> None:
    """The key's row is read with the statement's snapshot, the window's charge (a function) reads the key
    afresh: a revocation that commits between the two reads the key active but charges nothing. The
    request is then answered as the key now reads (401, the rejection audited), never a 500."""
    settings.RATE_LIMIT_BACKEND = "database"  # production's default: the key and its window in one statement
    from billing import selectors, services
    from billing.ratelimit import bucket_charge
    from common import fastsql

    real = fastsql.fetch_row
    key_id = tenant.agent_key_id

    def revoked_meanwhile(sql: str, params: list[object]) -> tuple[object, ...] | None:
        if sql != selectors._key_charge_sql() or params[0] != key_id:
            return real(sql, params)
        before = real(selectors._key_with_wallet_sql(), [key_id])  # the row as the snapshot read it: active
        assert before is not None
        services.api_key_revoke(wallet=tenant.agent, key_id=key_id)  # ... then the revocation commits
        after = real(sql, params)
        assert after is not None
        assert after[-1] is None  # the function refused: nothing charged
        return (*before, after[-1])

    monkeypatch.setattr(fastsql, "fetch_row", revoked_meanwhile)
    r = client_for(tenant.agent_secret).get("/v1/me/permits")
    assert r.status_code == 401, r.content
    assert r.json()["detail"]["error"] == "invalid_api_key"
    assert "revoked" in r.json()["detail"]["message"]
    event = AuditEvent.objects.filter(event="auth.credential_rejected").latest("created_at")
    assert event.key_id == key_id
    assert bucket_charge(f"key:{key_id}", 0, 60)[0] == 0


def race_a_new_key(monkeypatch: Any, create: Callable[[], Any], revoke: Callable[[], Any]) -> tuple[Any, Any]:
    """Run ``create`` (it writes a key) with its transaction held open just after the key's row, then ``revoke``
    in another thread until it waits for a lock; let ``create`` commit; both results."""
    import threading

    from django.db import connections

    from billing.services import api_keys as keys_service
    from tests.test_billing_charge_fn import wait_for_a_lock_wait

    written, release = threading.Event(), threading.Event()
    new_key = keys_service._new_key
    results: dict[str, Any] = {}

    def held_new_key(**kwargs: Any) -> Any:
        issued = new_key(**kwargs)
        written.set()
        assert release.wait(30)  # the creating transaction, holding its key rows' locks, stays open
        return issued

    monkeypatch.setattr(keys_service, "_new_key", held_new_key)

    def run(name: str, work: Callable[[], Any]) -> None:
        try:
            results[name] = work()
        finally:
            connections.close_all()

    creator = threading.Thread(target=run, args=("created", create))
    creator.start()
    assert written.wait(30)
    revoker = threading.Thread(target=run, args=("revoked", revoke))
    revoker.start()
    wait_for_a_lock_wait()  # the revocation read the keys (not the uncommitted one) and waits for a lock
    release.set()
    creator.join(30)
    revoker.join(30)
    return results["created"], results["revoked"]


@pytest.mark.django_db(transaction=True)
def test_a_key_minted_while_an_ancestor_key_is_revoked_is_revoked_too(tenant, monkeypatch) -> None:
    """Revoking K0 reads K0's lineage, then locks each key of it. A mint by K1 (minted by K0) in flight at
    that moment holds K1's row and commits its new key after the lineage was read: the revocation reads the
    lineage again once it holds the locks, and the new key is revoked with the rest."""
    from billing.services import api_keys as keys_service

    agent = tenant.agent
    k1 = keys_service.api_key_create(wallet=agent, name="k1", actor_key_id=tenant.agent_key_id).key
    late, _ = race_a_new_key(
        monkeypatch,
        lambda: keys_service.api_key_create(wallet=agent, name="late", actor_key_id=k1.key_id).key,
        lambda: keys_service.api_key_revoke(wallet=agent, key_id=tenant.agent_key_id),
    )
    statuses = dict(APIKey.objects.filter(wallet=agent).values_list("key_id", "status"))
    assert statuses[tenant.agent_key_id] == "revoked"
    assert statuses[k1.key_id] == "revoked"
    assert statuses[late.key_id] == "revoked"


@pytest.mark.django_db(transaction=True)
def test_a_key_rotated_during_an_emergency_revocation_does_not_survive_it(tenant, monkeypatch) -> None:
    """The emergency revocation locks the subtree's active keys. A rotation in flight (revoking the old key)
    commits while it waits: the old key is then skipped as revoked, and its successor, not in that read,
    is caught by the next pass."""
    from billing.services import api_keys as keys_service

    agent = tenant.agent
    successor, revoked = race_a_new_key(
        monkeypatch,
        lambda: keys_service.api_key_rotate(wallet=agent, key_id=tenant.agent_key_id).key,
        lambda: keys_service.api_key_emergency_revoke(wallet=agent),
    )
    assert APIKey.objects.get(pk=successor.pk).status == "revoked"
    assert successor.key_id in revoked
    assert not APIKey.objects.filter(wallet=agent, status="active").exists()


# -- API_KEYS_PER_WALLET (issue 27, item 3) --------------------------------------------------------


def test_a_wallet_holds_at_most_api_keys_per_wallet_active_keys(tenant, settings) -> None:
    """The agent mints keys for itself up to the cap; the next is 409 and audited; revoking one makes room."""
    settings.API_KEYS_PER_WALLET = 3
    agent = tenant.agent_client
    minted = [create_key(agent, tenant.agent.wallet_id, name=f"k{i}") for i in range(2)]
    assert [r.status_code for r in minted] == [201, 201]
    r = create_key(agent, tenant.agent.wallet_id, name="one-too-many")
    assert r.status_code == 409, r.content
    detail = r.json()["detail"]
    assert (detail["error"], detail["limit"], detail["active_keys"]) == ("api_key_limit_reached", 3, 3)
    assert APIKey.objects.filter(wallet=tenant.agent, status="active").count() == 3
    event = AuditEvent.objects.get(event="api_key.limit_reached")
    assert (event.ok, event.wallet_id, event.key_id) == (False, tenant.agent.wallet_id, tenant.agent_key_id)
    assert event.detail["limit"] == 3
    # The sponsor's wallet has its own count; the sponsor may not exceed the agent's cap for it either.
    assert create_key(tenant.sponsor_client, tenant.sponsor.wallet_id).status_code == 201
    assert create_key(tenant.sponsor_client, tenant.agent.wallet_id).status_code == 409
    # A revoked key frees its place.
    revoked = minted[0].json()["key_id"]
    assert agent.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/{revoked}").status_code in (200, 204)
    assert create_key(agent, tenant.agent.wallet_id).status_code == 201


def test_rotation_that_revokes_the_old_key_works_at_the_cap_and_one_that_keeps_it_does_not(tenant, settings) -> None:
    settings.API_KEYS_PER_WALLET = 2
    assert create_key(tenant.sponsor_client, tenant.agent.wallet_id).status_code == 201  # not in the old key's lineage
    url = "/v1/api-keys/rotate"
    body = {"wallet_id": tenant.agent.wallet_id, "key_id": tenant.agent_key_id, "revoke_old": False}
    r = tenant.sponsor_client.post(url, body, format="json")
    assert r.status_code == 409, r.content
    assert r.json()["detail"]["error"] == "api_key_limit_reached"
    assert AuditEvent.objects.filter(event="api_key.limit_reached", endpoint=url).count() == 1
    r = tenant.sponsor_client.post(url, {**body, "revoke_old": True}, format="json")
    assert r.status_code == 200, r.content
    assert APIKey.objects.filter(wallet=tenant.agent, status="active").count() == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_creations_never_pass_the_cap(tenant, settings) -> None:
    """Eight creations at once for a wallet with room for two: exactly two keys, six refusals, each audited."""
    from concurrent.futures import ThreadPoolExecutor

    from billing.exceptions import APIKeyLimitReached
    from billing.services import api_key_create

    settings.API_KEYS_PER_WALLET = 3  # the tenant's agent already has one

    def create(i: int) -> str:
        try:
            api_key_create(wallet=tenant.agent, name=f"race{i}", actor_key_id=tenant.agent_key_id)
            return "created"
        except APIKeyLimitReached:
            return "refused"
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(create, range(8)))
    assert sorted(outcomes) == ["created"] * 2 + ["refused"] * 6
    assert APIKey.objects.filter(wallet=tenant.agent, status="active").count() == 3
    assert AuditEvent.objects.filter(event="api_key.limit_reached").count() == 6


def test_the_console_obeys_the_cap_and_says_why(tenant, settings) -> None:
    """A staff user allowed to add keys hits the same cap through the console: no key, no 500, the reason
    shown, the refusal audited as ``admin:<username>``."""
    from tests.test_permits_hardening import staff_client

    settings.API_KEYS_PER_WALLET = 1
    console = staff_client("billing.add_apikey", "billing.fund_wallet", "billing.view_apikey")
    r = console.post("/admin/billing/apikey/add/", {"wallet": tenant.agent.pk, "name": "console"})
    assert r.status_code == 302, r.content[:300]
    assert r["Location"] == "/admin/billing/apikey/add/"
    page = console.get(r["Location"])
    assert any("api_key_limit_reached" in str(m) for m in page.context["messages"])
    assert not APIKey.objects.filter(wallet=tenant.agent, name="console").exists()
    event = AuditEvent.objects.get(event="api_key.limit_reached")
    assert event.detail["actor"] == "admin:policy-admin"
