"""/health/dependencies: dependency truth for the selected tool; 503 whenever something is down."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone

from audit import keystore
from audit.models import SigningKey, SigningKeyState
from audit.services import signing_key_ensure
from mcpgateway.upstream.client import UpstreamError
from publicsite import health
from tests.upstream_server import free_port, running_demo_upstream

pytestmark = pytest.mark.django_db

URL = "/health/dependencies"


@pytest.fixture
def signing_key() -> SigningKey:
    return signing_key_ensure()


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/mcp"


def test_healthy_with_a_live_upstream(anon_client, signing_key):
    with running_demo_upstream() as demo, override_settings(UPSTREAM_MCP_URL=demo.url):
        r = anon_client.get(URL, {"tool": "notes.append"})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["status"] == "healthy"
    assert body["version"] == "1.3.0"
    assert body["tool"] == "notes.append"
    assert body["tool_scope"] == "upstream"
    deps = body["dependencies"]
    assert {name: d["status"] for name, d in deps.items()} == {
        "database": "ok",
        "signing_key": "ok",
        "cache": "ok",
        "upstream": "ok",
    }
    assert deps["signing_key"]["key_id"] == signing_key.key_id
    assert deps["database"]["latency_ms"] >= 0
    assert deps["upstream"]["latency_ms"] > 0
    assert "HTTP 200 alone does not mean" in body["notice"]
    assert r["Cache-Control"] == "no-store"


def test_down_upstream_is_503_degraded_and_the_url_stays_private(anon_client, signing_key):
    url = closed_port_url()
    with override_settings(UPSTREAM_MCP_URL=url, HEALTH_UPSTREAM_TIMEOUT=1.0):
        r = anon_client.get(URL, {"tool": "notes.append"})
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "degraded"
    upstream = body["dependencies"]["upstream"]
    assert upstream["status"] == "down"
    assert upstream["error"]
    assert "Connect" in upstream["error"] or "connect" in upstream["error"]
    assert url not in r.content.decode()
    assert body["dependencies"]["database"]["status"] == "ok"


def test_no_tool_checks_the_configured_upstream(anon_client, signing_key):
    with override_settings(UPSTREAM_MCP_URL=closed_port_url(), HEALTH_UPSTREAM_TIMEOUT=1.0):
        r = anon_client.get(URL)
    assert r.status_code == 503
    assert r.json()["tool"] is None
    assert r.json()["dependencies"]["upstream"]["status"] == "down"


def test_unconfigured_upstream_is_degraded(anon_client, signing_key):
    with override_settings(UPSTREAM_MCP_URL=""):
        r = anon_client.get(URL)
    assert r.status_code == 503
    assert r.json()["dependencies"]["upstream"]["status"] == "not_configured"


@pytest.mark.parametrize("dogfood", [True, False])
def test_local_tool_skips_the_upstream(anon_client, signing_key, dogfood):
    with override_settings(UPSTREAM_MCP_URL=closed_port_url(), ENABLE_DOGFOOD_TOOL=dogfood):
        r = anon_client.get(URL, {"tool": "partner.notes.write"})
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "healthy"
    assert body["tool_scope"] == "local"
    upstream = body["dependencies"]["upstream"]
    assert upstream["status"] == "skipped"
    assert "local tool" in upstream["reason"]
    assert ("disabled here" in upstream["reason"]) is (not dogfood)


def test_no_active_signing_key_is_degraded(anon_client):
    assert not SigningKey.objects.filter(state=SigningKeyState.ACTIVE).exists()
    with override_settings(UPSTREAM_MCP_URL=""):
        r = anon_client.get(URL, {"tool": "partner.notes.write"})
    assert r.status_code == 503
    check = r.json()["dependencies"]["signing_key"]
    assert check["status"] == "down"
    assert "no active signing key" in check["error"]
    # Health observes; it does not activate a key.
    assert not SigningKey.objects.exists()


def test_active_key_without_private_part_is_degraded(anon_client):
    now = timezone.now()
    SigningKey.objects.create(
        key_id="sig_notHere0000000000000000000000",
        public_key="A" * 43,
        state=SigningKeyState.ACTIVE,
        created_at=now,
        activated_at=now,
    )
    r = anon_client.get(URL, {"tool": "partner.notes.write"})
    assert r.status_code == 503
    check = r.json()["dependencies"]["signing_key"]
    assert check["status"] == "down"
    assert check["key_id"] == "sig_notHere0000000000000000000000"
    assert "not available on this server" in check["error"]


def test_signing_key_material_never_appears(anon_client, signing_key):
    import base64

    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    private = keystore.private_key_for(signing_key.key_id)
    assert private is not None
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    encoded = base64.urlsafe_b64encode(seed).decode().rstrip("=")
    text = anon_client.get(URL, {"tool": "partner.notes.write"}).content.decode()
    assert signing_key.key_id in text
    assert encoded not in text
    assert str(keystore.key_file_path()) not in text


def test_cache_that_forgets_is_degraded(anon_client, signing_key):
    with override_settings(CACHES={"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}):
        r = anon_client.get(URL, {"tool": "partner.notes.write"})
    assert r.status_code == 503
    assert r.json()["dependencies"]["cache"]["status"] == "down"


def test_database_failure_is_reported_not_raised(monkeypatch):
    class BrokenConnection:
        def cursor(self):
            raise OperationalError("connection refused at db.internal:5432")

    monkeypatch.setattr(health, "connection", BrokenConnection())
    check = health.check_database()
    assert check["status"] == "down"
    assert check["error"] == "database check failed: OperationalError"  # no host names leak


@override_settings(RATE_LIMIT_REQUESTS=2)
def test_health_dependencies_is_rate_limited_as_anonymous(anon_client, signing_key):
    with override_settings(UPSTREAM_MCP_URL=""):
        statuses = [anon_client.get(URL, {"tool": "partner.notes.write"}).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    # /health (liveness) stays exempt.
    assert anon_client.get("/health").status_code == 200


def test_bad_query_and_bad_key(anon_client):
    assert anon_client.get(URL, {"tool": "x" * 300}).status_code == 422
    from tests.conftest import client_for

    assert client_for("tg_key_bogus_0123456789abcdefghijklmnopqrstuvwxyz").get(URL).status_code == 401


def test_schema_describes_health(anon_client):
    paths = anon_client.get("/openapi.json").json()["paths"]
    op = paths["/health/dependencies"]["get"]
    assert op["operationId"] == "health_dependencies"
    assert {"200", "503"} <= set(op["responses"])
    assert op["responses"]["503"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "HealthDependenciesResponse"
    )
    assert paths["/health"]["get"]["operationId"] == "health"


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (
            UpstreamError("ping: JSON-RPC error -32000: db.internal.corp:5432 refused", error={"code": -32000}),
            "ping: JSON-RPC error -32000",
        ),
        (UpstreamError("ping: SSLError: hostname 'db.internal.corp' doesn't match"), "ping: the upstream's answer"),
        (UpstreamError("ping: HTTP 502 from db.internal.corp", status_code=502), "ping: HTTP 502"),
    ],
)
def test_an_upstream_failure_is_reported_without_its_free_text(
    anon_client, signing_key, monkeypatch, caplog, error, shown
):
    """Anonymous callers learn which request failed and how (class, HTTP status, JSON-RPC code), not the
    exception's or the upstream's text, which can name internal hosts; the log keeps the full reason."""
    from mcpgateway.upstream.client import UpstreamClient

    def fails(self):
        raise error

    monkeypatch.setattr(UpstreamClient, "ping", fails)
    with override_settings(UPSTREAM_MCP_URL=closed_port_url()), caplog.at_level("WARNING", "tollgate.health"):
        r = anon_client.get(URL, {"tool": "notes.append"})
    assert r.status_code == 503
    assert r.json()["dependencies"]["upstream"]["error"].startswith(shown)
    assert "internal.corp" not in r.content.decode()
    assert "internal.corp" in caplog.text


def test_a_transport_failure_is_reported_by_its_class(anon_client, signing_key, monkeypatch):
    from mcpgateway.upstream.client import UpstreamClient

    def fails(self):
        try:
            raise ConnectionError("[Errno -2] db.internal.corp: Name or service not known")
        except ConnectionError as exc:
            raise UpstreamError(f"ping: ConnectionError: {exc}") from exc

    monkeypatch.setattr(UpstreamClient, "ping", fails)
    with override_settings(UPSTREAM_MCP_URL=closed_port_url()):
        r = anon_client.get(URL, {"tool": "notes.append"})
    assert r.json()["dependencies"]["upstream"]["error"] == "ping: ConnectionError"


# --- /health/ready: each enabled upstream server --------------------------------------------------------


@override_settings(UPSTREAM_STATE_READINESS_INTERVAL=0)  # every call probes (the bound is tested below)
def test_ready_reports_each_enabled_server_and_waits_only_for_the_required_ones(anon_client, signing_key):
    from mcpgateway.services.upstreams import (
        upstream_credential_set,
        upstream_server_create,
        upstream_server_sync,
        upstream_server_update,
    )
    from tests.upstream_server import running_sdk_upstream

    with running_demo_upstream() as demo, running_sdk_upstream("pay", tokens={"ready-token"}) as pay:
        open_server = upstream_server_create(slug="demo", name="Demo", url=demo.url, required=True, actor="test")
        upstream_server_sync(server=open_server, actor="test")
        paid = upstream_server_create(slug="pay", name="Pay", url=pay.url, tool_prefix="pay", actor="test")
        down = upstream_server_create(slug="down", name="Down", url=closed_port_url(), tool_prefix="d", actor="test")
        upstream_server_create(slug="off", name="Off", url=closed_port_url(), tool_prefix="o", enabled=False, actor="t")

        r = anon_client.get("/health/ready")
        assert r.status_code == 200, r.content  # pay and down are not required
        servers = {s["slug"]: s for s in r.json()["upstream_servers"]}
        assert set(servers) == {"demo", "pay", "down"}  # only the enabled ones
        assert servers["demo"]["reachable"] is True
        assert servers["demo"]["protocol_version"]
        assert servers["demo"]["last_synced_at"] is not None
        assert (servers["pay"]["reachable"], servers["pay"]["error"]) == (False, "auth_refused")
        assert (servers["down"]["reachable"], servers["down"]["error"]) == (False, "unreachable")
        assert demo.url not in r.content.decode()
        assert pay.url not in r.content.decode()

        upstream_credential_set(
            server_id=paid.server_id, tenant_id=None, kind="bearer", secret={"token": "ready-token"}, actor="test"
        )
        upstream_server_update(server_id=down.server_id, required=True, actor="test")
        r = anon_client.get("/health/ready")
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "not_ready"
        assert {s["slug"]: s["reachable"] for s in body["upstream_servers"]} == {
            "demo": True,
            "pay": True,
            "down": False,
        }


def test_ready_probes_and_keeps_a_server_at_most_once_per_interval(anon_client, signing_key, monkeypatch):
    """An anonymous flood of readiness calls is neither a flood of authenticated probes of the upstream nor
    of writes: within the interval the kept state answers; the console's probe runs and is kept at once."""
    from mcpgateway.models import UpstreamProbeSource, UpstreamServerState
    from mcpgateway.services import upstreams
    from mcpgateway.services.upstreams import upstream_server_create

    server = upstream_server_create(slug="flood", name="Flood", url=closed_port_url(), tool_prefix="f", actor="test")
    answers = iter([True, False, True])
    probed = []

    def probe(s, timeout=None):
        probed.append(s.slug)
        reachable = next(answers)
        return {"reachable": reachable, "protocol_version": "2025-06-18" if reachable else None,
                "error": None if reachable else "unreachable"}  # fmt: skip

    monkeypatch.setattr(upstreams, "upstream_probe", probe)
    writes: list[dict[str, Any]] = []
    record = upstreams.upstream_server_state_record

    def counted(**kwargs: Any) -> None:
        writes.append(kwargs)
        record(**kwargs)

    monkeypatch.setattr(upstreams, "upstream_server_state_record", counted)

    with override_settings(UPSTREAM_STATE_READINESS_INTERVAL=3600):
        first = anon_client.get("/health/ready").json()["upstream_servers"]
        kept = UpstreamServerState.objects.get(server_id=server.server_id)
        for _ in range(3):
            assert anon_client.get("/health/ready").json()["upstream_servers"] == first
        assert (probed, len(writes)) == (["flood"], 1)
        assert UpstreamServerState.objects.get(server_id=server.server_id).checked_at == kept.checked_at
        # The console's "Test connection" probes and is kept at once; readiness then answers what it found.
        upstreams.upstream_server_check(server=server, checked_by=UpstreamProbeSource.CONSOLE)
        state = UpstreamServerState.objects.get(server_id=server.server_id)
        assert (state.checked_by, state.reachable) == (UpstreamProbeSource.CONSOLE, False)
        r = anon_client.get("/health/ready").json()["upstream_servers"][0]
        assert (r["reachable"], r["protocol_version"], r["error"]) == (False, None, "unreachable")
        assert len(probed) == 2
    with override_settings(UPSTREAM_STATE_READINESS_INTERVAL=0):
        assert anon_client.get("/health/ready").json()["upstream_servers"][0]["reachable"] is True
        state = UpstreamServerState.objects.get(server_id=server.server_id)
        assert (state.checked_by, state.reachable) == (UpstreamProbeSource.READINESS, True)
        assert len(probed) == 3
