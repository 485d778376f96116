"""The scraper's own rate-limit bucket, and the active signing key's metadata served from its row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.utils import timezone
from rest_framework.test import APIClient

from audit import keystore, services
from audit.exceptions import SigningKeyUnavailable
from audit.models import AuditEvent, SigningKey, SigningKeyState
from common import metrics

pytestmark = pytest.mark.django_db

TOKEN = "scrape-" + "t" * 40


def scraper(token: str = TOKEN) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def refusals(kind: str) -> float:
    return metrics.REGISTRY.get_sample_value("tollgate_rate_limit_refusals_total", {"kind": kind}) or 0.0


# --- The scraper's bucket ---------------------------------------------------------------------------


@pytest.fixture(params=["database", "cache"])
def limited(request: pytest.FixtureRequest, settings: Any) -> int:
    """Both limiter backends, the scrape token configured, and a small limit so a window fills fast."""
    settings.RATE_LIMIT_BACKEND = request.param
    settings.METRICS_SCRAPE_TOKEN = TOKEN
    settings.RATE_LIMIT_REQUESTS = 3
    return 3


def test_an_anonymous_flood_does_not_lock_out_the_scraper(limited):
    anon = APIClient(REMOTE_ADDR="203.0.113.7")
    for _ in range(limited):
        assert anon.get("/docs").status_code == 200
    assert anon.get("/docs").status_code == 429  # the anonymous bucket is full

    r = scraper().get("/metrics")
    assert r.status_code == 200, r.content[:200]
    assert r["X-RateLimit-Remaining"] == str(limited - 1)  # a window of its own


def test_scrapes_do_not_spend_the_anonymous_bucket_and_are_limited_in_their_own(limited):
    for _ in range(limited):
        assert scraper().get("/metrics").status_code == 200
    anon = APIClient()
    for _ in range(limited):
        assert anon.get("/docs").status_code == 200

    # A leaked token still cannot run the scrape's aggregate queries without limit.
    before = refusals("scrape")
    r = scraper().get("/metrics")
    assert r.status_code == 429
    assert r.json()["detail"]["error"] == "rate_limited"
    assert refusals("scrape") == before + 1


def test_a_wrong_token_stays_a_rejected_credential_and_the_right_one_is_unaffected(settings):
    settings.METRICS_SCRAPE_TOKEN = TOKEN
    guesser = scraper("scrape-" + "x" * 40)
    statuses = [guesser.get("/metrics").status_code for _ in range(13)]
    # Ten units a guess of the client's bucket: refused after 12, as a guessed API key is.
    assert statuses == [401] * 12 + [429]
    assert AuditEvent.objects.filter(event="auth.credential_rejected").count() == 12
    assert scraper().get("/metrics").status_code == 200


def test_metrics_without_the_token_is_metered_as_anonymous(limited):
    anon = APIClient()
    for _ in range(limited):
        anon.get("/docs")
    assert anon.get("/metrics").status_code == 429


# --- GET /v1/signing-keys/active --------------------------------------------------------------------


@pytest.fixture
def key_file(tmp_path: Path, settings: Any) -> Path:
    """A private key file for this test only; the environment key is unset."""
    path = tmp_path / "keys" / "signing-keys.json"
    settings.SIGNING_KEY_FILE = str(path)
    settings.SIGNING_KEY_PRIVATE = ""
    return path


def _activate_elsewhere() -> SigningKey:
    """An active key whose private part is on another instance (neither this key file nor the environment)."""
    m = keystore.material(Ed25519PrivateKey.generate())
    SigningKey.objects.filter(state=SigningKeyState.ACTIVE).update(
        state=SigningKeyState.RETIRED, retired_at=timezone.now()
    )
    now = timezone.now()
    return SigningKey.objects.create(
        key_id=m.kid, public_key=m.public_key, state=SigningKeyState.ACTIVE, created_at=now, activated_at=now
    )


def test_active_key_metadata_is_served_without_its_private_part(key_file):
    key = _activate_elsewhere()
    r = APIClient().get("/v1/signing-keys/active")
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["key_id"], body["public_key"], body["state"]) == (key.key_id, key.public_key, "active")
    # Publishing wrote nothing: no key generated, no rotation.
    assert not key_file.exists()
    assert list(SigningKey.objects.values_list("key_id", "state")) == [(key.key_id, "active")]


def test_fresh_install_activates_one_key_once_and_never_again(key_file):
    # Decision: with no active key the endpoint activates one, as the first signature would; once a key
    # is active the endpoint reads its row and writes nothing, whoever asks.
    assert not SigningKey.objects.exists()
    first = APIClient().get("/v1/signing-keys/active")
    assert first.status_code == 200, first.content
    written = key_file.read_bytes()
    for _ in range(3):
        assert APIClient().get("/v1/signing-keys/active").json()["key_id"] == first.json()["key_id"]
    assert key_file.read_bytes() == written
    assert SigningKey.objects.count() == 1


def test_a_key_activated_meanwhile_by_another_instance_is_served(key_file, monkeypatch):
    def raced() -> SigningKey:
        key = _activate_elsewhere()
        raise SigningKeyUnavailable(key_id=key.key_id)

    monkeypatch.setattr(services, "signing_key_ensure", raced)
    r = APIClient().get("/v1/signing-keys/active")
    assert r.status_code == 200, r.content
    assert r.json()["key_id"] == SigningKey.objects.get(state=SigningKeyState.ACTIVE).key_id
