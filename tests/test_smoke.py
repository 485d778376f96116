import pytest


@pytest.mark.django_db
def test_health_is_public(anon_client):
    r = anon_client.get("/health")
    assert r.status_code == 200
    assert r.json()["version"] == "1.3.0"
    assert r["X-Request-Id"]


@pytest.mark.django_db
def test_list_keys_of_own_wallet(tenant):
    r = tenant.sponsor_client.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["total"] == 1
