"""Rate limits (spec, Limits): 120 per 60 s per key, shared anonymous bucket, rejected credentials x10."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from audit.models import AuditEvent
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True, params=["database", "cache"])
def backend(request: pytest.FixtureRequest, settings: Any) -> str:
    """Every rule below holds with the PostgreSQL windows (the default) and with a cache (Redis in production)."""
    settings.RATE_LIMIT_BACKEND = request.param
    return str(request.param)


def test_request_121_in_a_window_gets_429_with_headers(tenant):
    client = tenant.sponsor_client
    url = f"/v1/api-keys/{tenant.sponsor.wallet_id}"
    for i in range(120):
        r = client.get(url)
        assert r.status_code == 200, (i, r.content)
        assert r["X-RateLimit-Limit"] == "120"
        assert r["X-RateLimit-Remaining"] == str(119 - i)
        assert 1 <= int(r["X-RateLimit-Reset"]) <= 60
    r = client.get(url)
    assert r.status_code == 429
    assert r["X-RateLimit-Remaining"] == "0"
    assert 1 <= int(r["Retry-After"]) <= 60
    body = r.json()["detail"]
    assert body["error"] == "rate_limited"
    assert body["retry_after_seconds"] == int(r["Retry-After"])
    # Another key is not affected.
    assert tenant.agent_client.get(f"/v1/api-keys/{tenant.agent.wallet_id}").status_code == 200


def test_anonymous_requests_share_one_bucket():
    a, b = APIClient(REMOTE_ADDR="10.0.0.1"), APIClient(REMOTE_ADDR="10.0.0.2")
    for i in range(120):
        r = (a if i % 2 else b).get("/docs")
        assert r.status_code == 200
    assert a.get("/docs").status_code == 429
    assert b.get("/v1/api-keys/spn_x").status_code == 429


def test_no_client_can_make_readiness_answer_429_to_the_orchestrator(signing_key) -> None:
    """Readiness was charged to the shared anonymous bucket: any client's 120 anonymous requests made
    every instance answer its orchestrator's probe 429 (not ready). Now each address has a bucket."""
    greedy, orchestrator = APIClient(REMOTE_ADDR="10.0.0.1"), APIClient(REMOTE_ADDR="10.0.0.2")
    for _ in range(120):
        assert greedy.get("/docs").status_code == 200
    assert greedy.get("/docs").status_code == 429  # the shared anonymous bucket is full
    r = orchestrator.get("/health/ready")
    assert r.status_code == 200, r.content
    assert r["X-RateLimit-Remaining"] == "119"
    assert "ETag" not in r  # readiness is never made cacheable
    # Readiness is still limited, per address.
    statuses = [greedy.get("/health/ready").status_code for _ in range(121)]
    assert statuses == [200] * 120 + [429]
    assert orchestrator.get("/health/ready").status_code == 200


def test_health_is_not_metered():
    client = APIClient()
    for _ in range(130):
        assert client.get("/health").status_code == 200


def test_rejected_credentials_cost_ten_and_are_audited_until_the_limiter_refuses(tenant):
    bad = APIClient(REMOTE_ADDR="10.9.9.9")
    bad.credentials(HTTP_X_API_KEY="tg_key_" + "A" * 22 + "_" + "B" * 40)
    statuses = [bad.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}").status_code for _ in range(15)]
    assert statuses[:12] == [401] * 12
    assert statuses[12:] == [429] * 3
    # Only the requests the limiter let through are written to the audit log.
    assert AuditEvent.objects.filter(event="auth.credential_rejected").count() == 12
    # A valid key from the same address still works: it has its own bucket.
    good = APIClient(REMOTE_ADDR="10.9.9.9")
    good.credentials(HTTP_X_API_KEY=tenant.sponsor_secret)
    assert good.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}").status_code == 200
    # Another client address is not affected.
    other = APIClient(REMOTE_ADDR="10.9.9.10")
    other.credentials(HTTP_X_API_KEY="tg_key_" + "A" * 22 + "_" + "B" * 40)
    assert other.get(f"/v1/api-keys/{tenant.sponsor.wallet_id}").status_code == 401


def test_revoked_key_counts_as_rejected_credentials(tenant):
    tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/{tenant.agent_key_id}")
    r = client_for(tenant.agent_secret).get(f"/v1/api-keys/{tenant.agent.wallet_id}")
    assert r.status_code == 401
    event = AuditEvent.objects.filter(event="auth.credential_rejected").latest("created_at")
    assert event.key_id == tenant.agent_key_id
    assert event.ok is False


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_limits_hold_across_workers_and_instances_with_no_extra_service(tmp_path: Path, backend: str) -> None:
    """Two gunicorn instances of two workers each, PostgreSQL only: request 121 of a window is refused."""
    if backend != "database":
        pytest.skip("the shared-cache case is tests/test_scale_out.py (Redis)")
    import time

    from access.ratelimit import bucket_charge
    from tests.conftest import make_tenant
    from tests.live import running_gateway

    tenant = make_tenant("limits")
    env = {"RATE_LIMIT_BACKEND": "database", "RATE_LIMIT_WINDOW_SECONDS": "60"}
    with (
        running_gateway(tmp_path, workers=2, threads=4, extra_env=env) as a,
        running_gateway(tmp_path, workers=2, threads=4, extra_env=env) as b,
    ):
        url = f"/v1/api-keys/{tenant.sponsor.wallet_id}"
        # Start early in a window, once both instances are up (starting them can take a while on a
        # busy host), so that all 150 requests land in one.
        if 60 - time.time() % 60 < 40:
            time.sleep(60 - time.time() % 60 + 0.5)

        def get(i: int) -> int:
            base = (a, b)[i % 2].url
            headers = {"X-API-Key": tenant.sponsor_secret, "Connection": "close"}
            return httpx.get(base + url, headers=headers, timeout=30).status_code

        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(get, range(150)))
        assert statuses.count(200) == 120, statuses
        assert statuses.count(429) == 30

        bad = {"X-API-Key": "tg_key_" + "A" * 22 + "_" + "B" * 40, "Connection": "close"}
        rejected = [httpx.get((a, b)[i % 2].url + url, headers=bad, timeout=30).status_code for i in range(20)]
        assert rejected.count(401) == 12, rejected
        assert rejected.count(429) == 8
    # The counters are rows every process shares (read at the gunicorn instances' clock, not the
    # in-process one tests pin).
    count, _ = bucket_charge(f"key:{tenant.sponsor_key_id}", 0, 60, now=time.time())
    assert count == 150


def test_windows_are_fixed_and_reset_at_their_boundary(backend: str) -> None:
    """A window counts from its start to its end; the next one starts at zero (both backends)."""
    from access.ratelimit import bucket_charge

    start = 1_800_000_000 // 60 * 60  # the start of some minute
    assert bucket_charge("edge", 5, 60, now=start + 0.5) == (5, 60)
    assert bucket_charge("edge", 5, 60, now=start + 59.2) == (10, 1)  # reset rounds up to a whole second
    assert bucket_charge("edge", 1, 60, now=start + 60) == (1, 60)  # the next window
    assert bucket_charge("edge", 0, 60, now=start + 30) == (10, 30)  # the first one kept its count


def test_a_guessed_secret_never_spends_the_keys_allowance(tenant, backend: str) -> None:
    """Right key id, wrong secret: refused, charged to the caller's address, never to the key's window."""
    from access.ratelimit import bucket_charge

    key_id = tenant.sponsor_key_id
    forged = tenant.sponsor_secret[:-4] + ("AAAA" if not tenant.sponsor_secret.endswith("AAAA") else "BBBB")
    guesser = APIClient(REMOTE_ADDR="10.7.7.7")
    guesser.credentials(HTTP_X_API_KEY=forged)
    assert [guesser.get("/v1/me/permits").status_code for _ in range(13)] == [401] * 12 + [429]
    assert bucket_charge(f"key:{key_id}", 0, 60)[0] == 0
    assert bucket_charge("client:10.7.7.7", 0, 60)[0] == 130
    # The key's owner still has the whole allowance.
    r = tenant.sponsor_client.get("/v1/me/permits")
    assert r.status_code == 200
    assert r["X-RateLimit-Remaining"] == "119"


def test_a_revoked_key_is_not_charged_to_its_own_window(tenant, backend: str) -> None:
    from access.ratelimit import bucket_charge

    assert tenant.agent_client.get("/v1/me/permits").status_code == 200
    tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/{tenant.agent_key_id}")
    assert client_for(tenant.agent_secret).get("/v1/me/permits").status_code == 401
    assert bucket_charge(f"key:{tenant.agent_key_id}", 0, 60)[0] == 1


def test_database_windows_authenticate_and_charge_in_one_statement(tenant, backend: str) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        r = tenant.agent_client.get("/v1/me/permits")
    assert r.status_code == 200
    assert r["X-RateLimit-Remaining"] == "119"
    touching_keys = [q["sql"] for q in queries.captured_queries if "billing_api_key" in q["sql"]]
    window_writes = [
        q["sql"]
        for q in queries.captured_queries
        # the table, or the function that charges it (billing/sql/billing_rate_limit_key_charge.sql)
        if "billing_rate_limit_window" in q["sql"] or "billing_rate_limit_key_charge" in q["sql"]
    ]
    if backend == "database":
        assert len(touching_keys) == 1
        assert touching_keys == window_writes
    else:
        assert len(touching_keys) == 1
        assert window_writes == []


# -- per wallet line (issue 27, item 3) ------------------------------------------------------------


def test_an_agent_minting_keys_for_itself_does_not_multiply_its_limit(tenant) -> None:
    """Two keys of one wallet share the wallet's 120: before, they got 239 requests in a window."""
    r = tenant.agent_client.post("/v1/api-keys", {"wallet_id": tenant.agent.wallet_id, "name": "twin"}, format="json")
    assert r.status_code == 201, r.content  # 1
    twin = client_for(r.json()["secret"])
    clients = (tenant.agent_client, twin)
    statuses = [clients[i % 2].get("/v1/me/permits").status_code for i in range(130)]
    assert statuses.count(200) == 119, statuses
    assert statuses[119:] == [429] * 11
    r = twin.get("/v1/me/permits")
    assert r.status_code == 429
    assert r["X-RateLimit-Remaining"] == "0"
    # Another wallet line of the tenant, and the sponsor's own key, keep their allowance.
    assert tenant.sponsor_client.get("/v1/me/permits")["X-RateLimit-Remaining"] == "119"


def test_child_wallets_with_keys_share_their_agents_limit(tenant) -> None:
    """An agent cannot multiply its limit through child wallets: a child's keys count against the agent's line;
    a sibling agent's line is its own."""
    from access.ratelimit import bucket_charge
    from tests import factories

    child_a = factories.make_wallet(tenant.agent, "child-a")
    child_b = factories.make_wallet(tenant.agent, "child-b")
    clients = [tenant.agent_client] + [client_for(factories.make_key(w).secret) for w in (child_a, child_b)]
    statuses = [clients[i % 3].get("/v1/me/permits").status_code for i in range(150)]
    assert statuses.count(200) == 120, statuses
    assert statuses[120:] == [429] * 30
    assert bucket_charge(f"wallet:{tenant.agent.wallet_id}", 0, 60)[0] == 150
    assert bucket_charge(f"wallet:{child_a.wallet_id}", 0, 60)[0] == 0  # the line is the agent's
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    r = client_for(factories.make_key(sibling).secret).get("/v1/me/permits")
    assert r.status_code == 200
    assert r["X-RateLimit-Remaining"] == "119"


def test_the_wallet_bucket_refuses_a_fresh_key_of_a_full_wallet(tenant) -> None:
    """The refusal applies when either bucket is over: a key with its own window empty is refused too."""
    from tests import factories

    for _ in range(120):
        assert tenant.agent_client.get("/v1/me/permits").status_code == 200
    fresh = client_for(factories.make_key(tenant.agent).secret)
    r = fresh.get("/v1/me/permits")
    assert r.status_code == 429
    assert r.json()["detail"]["error"] == "rate_limited"


# -- public key material and catalogues (issue 27, item 6) ------------------------------------------

PUBLIC_GETS = ["/.well-known/jwks.json", "/v1/signing-keys/active", "/mcp/tools.json", "/.well-known/mcp/tools.json"]


def _ping_public(client: APIClient) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    return client.post("/mcp/public", data=body, content_type="application/json")


@pytest.fixture
def signing_key(tmp_path: Path, settings: Any) -> None:
    from audit.services import signing_key_ensure

    settings.SIGNING_KEY_FILE = str(tmp_path / "keys" / "signing-keys.json")
    settings.SIGNING_KEY_PRIVATE = ""
    signing_key_ensure()


def test_one_address_cannot_lock_others_out_of_public_key_material(signing_key) -> None:
    """125 requests from one address made the next client's JWKS request 429; now each address has a bucket."""
    from audit.models import SigningKey

    greedy, other = APIClient(REMOTE_ADDR="10.0.0.1"), APIClient(REMOTE_ADDR="10.0.0.2")
    statuses = [greedy.get("/.well-known/jwks.json").status_code for _ in range(125)]
    assert statuses == [200] * 120 + [429] * 5
    assert greedy.get("/v1/signing-keys/active").status_code == 429  # its own bucket, whatever it reads
    assert _ping_public(greedy).status_code == 429
    kid = SigningKey.objects.get().key_id
    for path in [*PUBLIC_GETS, f"/v1/signing-keys/{kid}"]:
        r = other.get(path)
        assert r.status_code == 200, (path, r.content)
        assert r["X-RateLimit-Remaining"] != "0"
    assert _ping_public(other).status_code == 200
    # Public documents do not spend the anonymous bucket, and other anonymous requests still share it.
    assert other.get("/docs").status_code == 200
    assert other.get("/docs")["X-RateLimit-Remaining"] == "118"


def test_a_key_on_a_public_document_is_still_charged_to_the_key(tenant, signing_key) -> None:
    from access.ratelimit import bucket_charge

    keyed = client_for(tenant.agent_secret)
    r = keyed.get("/.well-known/jwks.json")
    assert r.status_code == 200
    assert r["X-RateLimit-Remaining"] == "119"
    assert bucket_charge(f"key:{tenant.agent_key_id}", 0, 60)[0] == 1
    assert bucket_charge("public:127.0.0.1", 0, 60)[0] == 0
    assert r["Cache-Control"].startswith("private")  # a shared cache must not pass on what a key read


@pytest.mark.parametrize("path", PUBLIC_GETS)
def test_public_documents_carry_a_strong_etag_and_answer_if_none_match_with_304(signing_key, path: str) -> None:
    import hashlib

    client = APIClient(REMOTE_ADDR="10.0.0.3")
    r = client.get(path)
    assert r.status_code == 200
    assert r["ETag"] == f'"{hashlib.sha256(r.content).hexdigest()}"'
    assert r["Cache-Control"] == "public, max-age=300"
    again = client.get(path, HTTP_IF_NONE_MATCH=r["ETag"])
    assert again.status_code == 304
    assert again.content == b""
    assert again["ETag"] == r["ETag"]
    assert client.get(path, HTTP_IF_NONE_MATCH='"something-else"').status_code == 200


def test_the_public_mcp_endpoint_is_not_made_cacheable() -> None:
    r = _ping_public(APIClient(REMOTE_ADDR="10.0.0.4"))
    assert r.status_code == 200
    assert "ETag" not in r


@pytest.mark.django_db(transaction=True)
def test_tollgate_verify_issuer_keeps_working_while_another_address_floods_the_jwks(live_server, signing_key) -> None:
    """``tollgate-verify --issuer`` (``fetch_issuer_jwks``) from one address while another has used up its bucket."""
    from receipts.verify import fetch_issuer_jwks

    greedy = APIClient(REMOTE_ADDR="10.0.0.5")
    assert [greedy.get("/.well-known/jwks.json").status_code for _ in range(121)][-1] == 429
    jwks = fetch_issuer_jwks(live_server.url)
    assert [key["kty"] for key in jwks["keys"]] == ["OKP"]
