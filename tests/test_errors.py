"""The error model of docs/architecture.md, "HTTP contract"."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.urls("tests.error_urls")
def test_unexpected_error_is_500_internal_error_without_traceback(anon_client):
    r = anon_client.get("/boom")
    assert r.status_code == 500
    body = r.json()
    assert body == {"detail": {"error": "internal_error", "message": body["detail"]["message"]}}
    assert "secret internal detail" not in r.content.decode()
    assert "Traceback" not in r.content.decode()


@pytest.mark.urls("tests.error_urls")
def test_unexpected_error_in_a_plain_view_is_json_500():
    client = Client(raise_request_exception=False)
    r = client.get("/plain-boom")
    assert r.status_code == 500
    assert r.json()["detail"]["error"] == "internal_error"
    assert "secret internal detail" not in r.content.decode()


def test_unknown_path_is_json_404(anon_client):
    r = anon_client.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["detail"]["error"] == "not_found"


def test_wrong_method_is_405_in_the_error_shape(tenant):
    r = tenant.sponsor_client.put("/v1/api-keys/rotate", {}, format="json")
    assert r.status_code == 405
    assert r.json()["detail"]["error"] == "method_not_allowed"


def test_missing_credentials_is_401_in_the_error_shape(anon_client, tenant):
    r = anon_client.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}")
    assert r.status_code == 401
    assert r.json()["detail"]["error"] == "not_authenticated"


def test_request_id_is_echoed_when_sane_and_generated_otherwise(anon_client):
    r = anon_client.get("/health", HTTP_X_REQUEST_ID="abc-123")
    assert r["X-Request-Id"] == "abc-123"
    r = anon_client.get("/health", HTTP_X_REQUEST_ID="bad id with spaces <script>")
    assert r["X-Request-Id"].startswith("req_")
