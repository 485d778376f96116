"""Discovery: the agent manifest, llms.txt, /v1/discover, the documents and the proof-surface flag.

Every advertised path must be routed, and every path of the spec's endpoint tables
must be in /openapi.json and answer.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.test import override_settings
from django.urls import Resolver404, clear_url_caches, path, resolve
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from billing.authentication import AllowAnyone
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

PATH_TOKEN = re.compile(r"^/[^\s]*$")


# -- helpers -------------------------------------------------------------------------------------


def reload_urlconf() -> None:
    """Rebuild the URLconf from the current settings (the flags are read at import)."""
    import config.urls
    import mcpgateway.urls
    import publicsite.urls

    importlib.reload(publicsite.urls)
    importlib.reload(mcpgateway.urls)
    importlib.reload(config.urls)
    clear_url_caches()


@contextmanager
def urlconf_with(**flags: Any) -> Iterator[None]:
    try:
        with override_settings(**flags):
            reload_urlconf()
            yield
    finally:
        reload_urlconf()


def paths_in_json(value: Any) -> set[str]:
    """Every string in a JSON document that is a path (``/...`` without spaces), query stripped.

    ``base_path`` members are prefixes, not endpoints, and are skipped.
    """
    found: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if k != "base_path":
                found |= paths_in_json(v)
    elif isinstance(value, list):
        for v in value:
            found |= paths_in_json(v)
    elif isinstance(value, str) and PATH_TOKEN.match(value) and not value.startswith("//"):
        found.add(value.split("?", 1)[0])
    return found


def paths_in_text(text: str) -> set[str]:
    """Paths in backticks and markdown link targets."""
    candidates = re.findall(r"`(/[^`\s]*)`", text) + re.findall(r"\]\((/[^)\s]*)\)", text)
    return {c.split("?", 1)[0] for c in candidates}


def assert_answers(client, paths: set[str]) -> None:
    assert paths
    for p in sorted(paths):
        concrete = re.sub(r"{[^}]+}", "dummy-id", p)
        try:
            resolve(concrete)
        except Resolver404:
            pytest.fail(f"{p} is advertised but not routed")
        r = client.get(concrete)
        if "{" in p:
            # An unknown id may be a JSON 404 from the view; the route itself exists (resolved above).
            assert r.status_code != 404 or r.json()["detail"]["error"] == "not_found", (p, r.status_code)
        else:
            assert r.status_code != 404, (p, r.status_code)
        assert r.status_code != 500, (p, r.content[:300])


# -- the manifest --------------------------------------------------------------------------------


def test_manifest_members(anon_client):
    r = anon_client.get("/.well-known/agent.json")
    assert r.status_code == 200
    m = r.json()
    assert m["name"] == "Tollgate"
    assert m["version"] == "1.3.0"
    assert m["description"]
    assert set(m["agent_first"]) >= {
        "primary_audience",
        "design_principle",
        "positioning",
        "bootstrap_sequence",
        "human_observability",
        "proof_surfaces_enabled",
        "simulation_and_dependency_truth",
    }
    positioning = m["agent_first"]["positioning"]
    assert positioning["schema_version"] == "1.0"
    assert positioning["effective_date"] == "2026-08-28"
    assert positioning["legacy_aliases"] == ["governed_mcp_trust_plane"]
    assert positioning["supersedes"] == ["product_wedge", "product_loop"]
    assert m["positioning"] == positioning
    assert "product_wedge" in m
    assert "product_loop" in m
    assert m["agent_first"]["proof_surfaces_enabled"] is False
    bounds = m["surface_boundaries"]
    assert bounds["proof_surfaces_mounted"] is False
    assert bounds["core_trust"] == [
        "audit",
        "billing",
        "permits",
        "receipts",
        "evidence",
        "mcp",
        "api_keys",
        "signing_keys",
        "discover",
        "policies",
    ]
    assert bounds["dormant_trust"] == ["auth_jwt", "kyc", "planner", "billing_expansion"]
    assert "not one distributed ACID transaction" in bounds["claim_boundary"]
    assert "honors the forwarded idempotency key" in bounds["claim_boundary"]
    for name in ("agent_billing", "mcp_server"):
        service = m["services"][name]
        assert service["base_path"]
        assert service["description"]
        assert service["endpoints"]
    assert all(e["path"].startswith("/v1/") for e in m["services"]["agent_billing"]["endpoints"])
    assert all(e["path"].startswith(("/mcp", "/.well-known/mcp")) for e in m["services"]["mcp_server"]["endpoints"])
    limits = m["rate_limits"]
    assert (limits["requests_per_window"], limits["window_seconds"], limits["burst"]) == (120, 60, 0)
    assert limits["accounting"] == "fixed_window"
    assert m["auth"]["public_signup"] is False
    assert m["auth"]["schemes"][0]["name"] == "X-API-Key"
    assert m["docs"]["openapi"] == "/openapi.json"
    steps = [s["path"] for s in m["agent_first"]["bootstrap_sequence"]]
    assert steps[:2] == ["/.well-known/agent.json", "/llms.txt"]
    assert steps[-1] == "/openapi.json"


def test_manifest_lists_exactly_the_routed_paths(anon_client):
    """The endpoint lists are the live URLconf: every /v1 route is listed, nothing unrouted is."""
    from publicsite.discovery import routes

    m = anon_client.get("/.well-known/agent.json").json()
    listed = {e["path"] for e in m["services"]["agent_billing"]["endpoints"]}
    routed = {r.path for r in routes() if r.path.startswith("/v1/")}
    assert listed == routed
    assert "/v1/discover" in listed
    assert "/v1/launch/preflight" in listed
    discover = next(e for e in m["services"]["agent_billing"]["endpoints"] if e["path"] == "/v1/discover")
    assert discover == {
        "path": "/v1/discover",
        "methods": ["GET"],
        "auth": "optional",
        "summary": discover["summary"],
    }
    sponsor = next(e for e in m["services"]["agent_billing"]["endpoints"] if e["path"] == "/v1/billing/wallets/sponsor")
    assert sponsor["methods"] == ["POST"]
    assert sponsor["auth"] == "api_key"
    assert not any(p.startswith(("/admin", "/approvals")) for p in paths_in_json(m["services"]))


@api_view(["GET"])
@permission_classes([AllowAnyone])
def _extra_view(request):
    return Response({"ok": True})


def _extra_urlpatterns() -> list[Any]:
    import config.urls

    return [*config.urls.urlpatterns, path("v1/zz-extra/<str:thing_id>", _extra_view, name="zz-extra")]


class ExtraRoutes:
    """A URLconf with one more route, to show that documents follow routing."""

    @property
    def urlpatterns(self) -> list[Any]:
        return _extra_urlpatterns()


def test_documents_follow_the_urlconf(anon_client, settings):
    settings.ROOT_URLCONF = ExtraRoutes()
    clear_url_caches()
    try:
        m = anon_client.get("/.well-known/agent.json").json()
        extra = [e for e in m["services"]["agent_billing"]["endpoints"] if e["path"] == "/v1/zz-extra/{thing_id}"]
        assert extra
        assert extra[0]["methods"] == ["GET"]
        assert "`/v1/zz-extra/{thing_id}`" in anon_client.get("/llms.txt").content.decode()
    finally:
        clear_url_caches()


def test_streamable_http_listed_only_when_enabled(anon_client):
    with urlconf_with(ENABLE_MCP_STREAMABLE_HTTP=True):
        m = anon_client.get("/.well-known/agent.json").json()
        assert "/mcp" in {e["path"] for e in m["services"]["mcp_server"]["endpoints"]}
        assert m["services"]["mcp_server"]["streamable_http_enabled"] is True
    with urlconf_with(ENABLE_MCP_STREAMABLE_HTTP=False):
        m = anon_client.get("/.well-known/agent.json").json()
        assert "/mcp" not in {e["path"] for e in m["services"]["mcp_server"]["endpoints"]}
        assert "`/mcp`" not in anon_client.get("/llms.txt").content.decode()
    # The flag alone also hides it, even while a stale URLconf still routes it.
    with override_settings(ENABLE_MCP_STREAMABLE_HTTP=False):
        m = anon_client.get("/.well-known/agent.json").json()
        assert "/mcp" not in {e["path"] for e in m["services"]["mcp_server"]["endpoints"]}


def test_tool_catalog_auth_follows_the_setting(anon_client):
    with override_settings(TOOL_CATALOG_REQUIRES_KEY=False):
        m = anon_client.get("/.well-known/agent.json").json()
        catalog = {e["path"]: e for e in m["services"]["mcp_server"]["endpoints"]}
        assert m["auth"]["tool_catalog_requires_key"] is False
        if "/mcp/tools.json" in catalog:
            assert catalog["/mcp/tools.json"]["auth"] in ("none", "optional")  # no key needed
    with override_settings(TOOL_CATALOG_REQUIRES_KEY=True):
        m = anon_client.get("/.well-known/agent.json").json()
        catalog = {e["path"]: e for e in m["services"]["mcp_server"]["endpoints"]}
        assert m["auth"]["tool_catalog_requires_key"] is True
        if "/mcp/tools.json" in catalog:
            assert catalog["/mcp/tools.json"]["auth"] == "api_key"


def test_bad_key_on_public_manifest_is_401(anon_client):
    r = client_for("tg_key_bogus_0123456789abcdefghijklmnopqrstuvwxyz").get("/.well-known/agent.json")
    assert r.status_code == 401


# -- llms.txt, discover, documents ---------------------------------------------------------------


def test_llms_txt_and_alias(anon_client):
    r = anon_client.get("/llms.txt")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain")
    text = r.content.decode()
    assert text.startswith("# Tollgate 1.3.0")
    for needle in (
        "`/.well-known/agent.json`",
        "`/llms.txt`",
        "`/openapi.json`",
        "X-API-Key",
        "Bearer",
        "no public signup",
        "no burst allowance is promised",
        "idempotency_key_reused",
        "delivery_uncertain",
        "external reconciliation",
        "120 requests per 60 seconds",
    ):
        assert needle in text, needle
    order = [text.index(p) for p in ("`/.well-known/agent.json`", "`/llms.txt`", "`/openapi.json`")]
    assert order == sorted(order)
    stages = ["authorize", "reserve allowance", "debit", "claim dispatch", "linked receipt and audit"]
    positions = [text.index(f". {s}\n") for s in stages]
    assert positions == sorted(positions)
    alias = anon_client.get("/llm.txt")
    assert alias.status_code == 200
    assert alias.content == r.content


def test_discover_anonymous_wallet_operator_and_bad_key(anon_client, tenant, operator_client):
    anon = anon_client.get("/v1/discover")
    assert anon.status_code == 200
    body = anon.json()
    assert body["version"] == "1.3.0"
    assert body["caller"]["authenticated"] is False
    assert "available_operations" not in body["caller"]
    groups = {g["group"]: g for g in body["capabilities"]}
    assert {"audit", "billing", "permits", "receipts", "api_keys", "signing_keys", "discover"} <= set(groups)
    assert groups["billing"]["trust"] == "core"

    agent = tenant.agent_client.get("/v1/discover").json()["caller"]
    assert agent["authenticated"] is True
    assert agent["key_type"] == "wallet"
    assert agent["wallet_id"] == tenant.agent.wallet_id
    assert agent["key_id"] == tenant.agent_key_id
    ops = {(o["method"], o["path"]) for o in agent["available_operations"]}
    assert ("GET", "/v1/me/authority") in ops
    assert ("POST", "/v1/billing/wallets/sponsor") not in ops

    operator = operator_client.get("/v1/discover").json()["caller"]
    assert operator["key_type"] == "operator"
    assert operator["wallet_id"] is None
    ops = {(o["method"], o["path"]) for o in operator["available_operations"]}
    assert ("POST", "/v1/billing/wallets/sponsor") in ops
    assert not any(p.startswith("/v1/me/") for _, p in ops)

    bad = client_for("tg_key_bogus_0123456789abcdefghijklmnopqrstuvwxyz").get("/v1/discover")
    assert bad.status_code == 401
    assert bad.json()["detail"]["error"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        ("/WEDGE.md", ["transaction-integrity gateway", "delivery_uncertain", "no public signup"]),
        (
            "/SECURITY_LIMITATIONS.md",
            [
                "Not a distributed ACID transaction",
                "No proof of the downstream effect",
                "Exactly once only if the upstream cooperates",
                "needs external reconciliation",
                "A valid signature proves only a match with the key snapshot",
                "per process unless Redis",
                "Operator keys are all-powerful",
                "Single region",
            ],
        ),
    ],
)
def test_markdown_documents(anon_client, url, needles):
    r = anon_client.get(url)
    assert r.status_code == 200
    assert r["Content-Type"] == "text/markdown; charset=utf-8"
    text = r.content.decode()
    for needle in needles:
        assert needle in text, needle


# -- every advertised path answers ---------------------------------------------------------------


@override_settings(RATE_LIMIT_REQUESTS=100_000)
def test_every_advertised_path_is_routed_and_answers(anon_client, tenant):
    manifest = anon_client.get("/.well-known/agent.json").json()
    llms = anon_client.get("/llms.txt").content.decode()
    discover_anon = anon_client.get("/v1/discover").json()
    discover_key = tenant.agent_client.get("/v1/discover").json()
    advertised = paths_in_json(manifest) | paths_in_text(llms) | paths_in_json(discover_anon)
    advertised |= paths_in_json(discover_key)
    # Sanity: the walk covers the documents themselves and the /v1 surface.
    assert {"/.well-known/agent.json", "/llms.txt", "/openapi.json", "/v1/discover"} <= advertised
    assert len([p for p in advertised if p.startswith("/v1/")]) > 40
    assert_answers(anon_client, advertised)
    assert_answers(tenant.agent_client, {p for p in advertised if p.startswith("/v1/")})


# -- the spec's endpoint tables against /openapi.json --------------------------------------------


SPEC_ENDPOINTS = [
    ("GET", "/v1/audit/events"),
    ("GET", "/v1/audit/summary"),
    ("POST", "/v1/audit/verify-chain"),
    ("POST", "/v1/policies"),
    ("GET", "/v1/policies"),
    ("GET", "/v1/policies/{policy_id}"),
    ("PATCH", "/v1/policies/{policy_id}"),
    ("POST", "/v1/billing/wallets/sponsor"),
    ("POST", "/v1/billing/wallets/agent"),
    ("GET", "/v1/billing/wallets/{wallet_id}"),
    ("GET", "/v1/billing/wallets"),
    ("GET", "/v1/billing/ledger/{wallet_id}"),
    ("POST", "/v1/billing/charge"),
    ("GET", "/v1/billing/pricing"),
    ("GET", "/v1/permits"),
    ("POST", "/v1/permits"),
    ("GET", "/v1/permits/{permit_id}"),
    ("GET", "/v1/permits/{permit_id}/receipts"),
    ("POST", "/v1/permits/{permit_id}/revoke"),
    ("POST", "/v1/permits/verify"),
    ("POST", "/v1/permit-requests"),
    ("GET", "/v1/permit-requests/{request_id}"),
    ("GET", "/v1/permit-requests/{request_id}/card"),
    ("POST", "/v1/quotes"),
    ("GET", "/v1/quotes/{quote_id}"),
    ("GET", "/v1/receipts"),
    ("GET", "/v1/receipts/permit/{permit_id}"),
    ("GET", "/v1/receipts/reconciliation/refunds"),
    ("POST", "/v1/receipts/reconciliation/refunds/{receipt_id}/retry"),
    ("GET", "/v1/receipts/{receipt_id}"),
    ("GET", "/v1/receipts/{receipt_id}/evidence"),
    ("GET", "/v1/receipts/{receipt_id}/portable"),
    ("POST", "/v1/receipts/verify"),
    ("GET", "/v1/evidence/{receipt_id}"),
    ("POST", "/v1/launch/preflight"),
    ("GET", "/mcp/tools.json"),
    ("GET", "/.well-known/mcp/tools.json"),
    ("GET", "/mcp/tools"),
    ("GET", "/mcp/tools/{service_id}"),
    ("POST", "/mcp/messages"),
    ("POST", "/mcp/tools/{service_id}/invoke"),
    ("POST", "/mcp/public"),
    ("POST", "/mcp"),
    ("POST", "/v1/api-keys"),
    ("GET", "/v1/api-keys/{wallet_id}"),
    ("POST", "/v1/api-keys/rotate"),
    ("DELETE", "/v1/api-keys/{wallet_id}/{key_id}"),
    ("POST", "/v1/api-keys/emergency-revoke"),
    ("GET", "/v1/api-keys/{wallet_id}/logs"),
    ("GET", "/v1/signing-keys/active"),
    ("GET", "/v1/signing-keys/{key_id}"),
    ("GET", "/v1/me/alerts"),
    ("GET", "/v1/me/authority"),
    ("GET", "/v1/me/permits"),
    ("GET", "/v1/me/permit-requests"),
    ("GET", "/v1/me/quotes"),
    ("GET", "/v1/me/receipts"),
    ("GET", "/v1/me/audit/events"),
    ("GET", "/.well-known/agent.json"),
    ("GET", "/llms.txt"),
    ("GET", "/llm.txt"),
    ("GET", "/v1/discover"),
    ("GET", "/health"),
    ("GET", "/health/dependencies"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/redoc"),
    ("GET", "/dashboard"),
    ("GET", "/WEDGE.md"),
    ("GET", "/SECURITY_LIMITATIONS.md"),
]


@pytest.fixture(scope="module")
def openapi_paths(django_db_blocker) -> dict[str, Any]:
    from rest_framework.test import APIClient

    with django_db_blocker.unblock():
        r = APIClient().get("/openapi.json")
    assert r.status_code == 200
    return r.json()["paths"]


@pytest.mark.parametrize(("method", "spec_path"), SPEC_ENDPOINTS)
def test_spec_endpoint_is_described_and_answers(anon_client, openapi_paths, method, spec_path):
    assert spec_path in openapi_paths, f"{spec_path} missing from /openapi.json"
    assert method.lower() in openapi_paths[spec_path], f"{method} {spec_path} missing from /openapi.json"
    concrete = re.sub(r"{[^}]+}", "dummy-id", spec_path)
    resolve(concrete)  # the route exists (Resolver404 otherwise)
    r = anon_client.generic(method, concrete, data="", content_type="application/json")
    if "{" not in spec_path:
        assert r.status_code != 404, (method, spec_path, r.status_code)
    assert r.status_code != 500, (method, spec_path, r.content[:300])
    if r.status_code == 401:
        assert r.json()["detail"]["error"] == "not_authenticated"


# -- proof surfaces ------------------------------------------------------------------------------


def test_proof_surfaces_are_unmounted_by_default(anon_client):
    assert anon_client.get("/proof/").status_code == 404
    with pytest.raises(Resolver404):
        resolve("/proof/")


def test_proof_surfaces_flag_mounts_a_simulation_index(anon_client):
    with urlconf_with(ENABLE_PROOF_SURFACES=True):
        m = anon_client.get("/.well-known/agent.json").json()
        assert m["agent_first"]["proof_surfaces_enabled"] is True
        assert m["surface_boundaries"]["proof_surfaces_mounted"] is True
        assert m["docs"]["proof_surfaces"] == "/proof/"
        r = anon_client.get("/proof/")
        assert r.status_code == 200
        index = r.json()
        assert index["simulation"] is True
        names = [s["name"] for s in index["surfaces"]]
        assert names == [
            "agentic-web",
            "browser",
            "content",
            "oracle",
            "sandbox",
            "media",
            "iot",
            "red-team",
            "telemetry",
        ]
        assert all(s["simulation"] is True and s["classification"] == "SIMULATION" for s in index["surfaces"])
    # Back to the default URLconf: unmounted again, and the manifest says so.
    assert anon_client.get("/proof/").status_code == 404
    m = anon_client.get("/.well-known/agent.json").json()
    assert m["surface_boundaries"]["proof_surfaces_mounted"] is False
    assert "proof_surfaces" not in m["docs"]
