"""POST /v1/launch/preflight: GO, and each NO-GO reason, with a fake fetcher (and the real one on loopback)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.core.management.utils import get_random_secret_key
from django.test import override_settings

from audit.models import AuditEvent
from billing.models import LedgerEntry
from publicsite import preflight
from publicsite.preflight import FetchRefused, HttpxFetcher, launch_preflight_run

pytestmark = pytest.mark.django_db

BASE = "https://gateway.tollgate-launch.dev"
CAMPAIGN = "https://cdn.tollgate-launch.dev/campaign.json"
DIRECTORY = "https://registry.agent-directory.dev/v1/register"
LIVE_KEY = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc9Zk2Lm"
GOOD_SETTINGS = {
    "SECRET_KEY": get_random_secret_key() + "Q7r",
    "PUBLIC_BASE_URL": BASE,
    "AGENT_DIRECTORY_URLS": [DIRECTORY],
    "CONTENT_SOURCE_URLS": [],
    "PAYMENT_SECRET_KEY": "",
}


class FakeFetcher:
    """Answers from a table; anything else fails like a refused connection. Records every URL."""

    def __init__(self, pages: dict[str, tuple[int, str]]) -> None:
        self.pages = dict(pages)
        self.calls: list[str] = []

    def __call__(self, url: str) -> tuple[int, str]:
        self.calls.append(url)
        if url not in self.pages:
            raise ConnectionRefusedError("connection refused")
        return self.pages[url]


@pytest.fixture
def published(anon_client) -> FakeFetcher:
    """A fake internet where BASE publishes this server's manifest, llms.txt and documents."""
    manifest = anon_client.get("/.well-known/agent.json").json()
    pages = {
        f"{BASE}/.well-known/agent.json": (200, json.dumps(manifest)),
        f"{BASE}/llms.txt": (200, anon_client.get("/llms.txt").content.decode()),
        CAMPAIGN: (200, '{"campaign": "launch"}'),
    }
    for path in manifest["docs"].values():
        pages.setdefault(f"{BASE}{path}", (200, "ok"))
    return FakeFetcher(pages)


def run(fetcher: FakeFetcher, **overrides: Any) -> preflight.PreflightReport:
    args: dict[str, Any] = {"base_url": "", "payment_secret_key": LIVE_KEY, "campaign_source_url": CAMPAIGN}
    args.update(overrides)
    with override_settings(**GOOD_SETTINGS):
        return launch_preflight_run(fetcher=fetcher, **args)


def check(report: preflight.PreflightReport, name: str) -> preflight.CheckResult:
    return next(c for c in report.checks if c.name == name)


def test_go_over_http_with_no_side_effects(operator_client, published, monkeypatch):
    monkeypatch.setattr(preflight, "default_fetcher", lambda: published)
    counts = (AuditEvent.objects.count(), LedgerEntry.objects.count())
    with override_settings(**GOOD_SETTINGS):
        r = operator_client.post(
            "/v1/launch/preflight",
            {"payment_secret_key": LIVE_KEY, "campaign_source_url": CAMPAIGN},
            format="json",
        )
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["verdict"] == "GO", body
    assert [c["name"] for c in body["checks"]] == ["KEYS", "DOMAIN", "ORACLE", "ASSETS"]
    assert all(c["status"] == "pass" for c in body["checks"]), body
    assert body["base_url"] == BASE
    assert LIVE_KEY not in r.content.decode()
    assert "payment_secret_key" not in body
    assert f"{BASE}/.well-known/agent.json" in published.calls
    assert CAMPAIGN in published.calls
    # Crawl targets: every document the published manifest lists.
    assert f"{BASE}/SECURITY_LIMITATIONS.md" in published.calls
    assert (AuditEvent.objects.count(), LedgerEntry.objects.count()) == counts


def test_empty_body_uses_the_settings(operator_client, published, monkeypatch):
    monkeypatch.setattr(preflight, "default_fetcher", lambda: published)
    with override_settings(**{**GOOD_SETTINGS, "PAYMENT_SECRET_KEY": LIVE_KEY, "CONTENT_SOURCE_URLS": [CAMPAIGN]}):
        r = operator_client.post("/v1/launch/preflight")
    assert r.status_code == 200, r.content
    assert r.json()["verdict"] == "GO", r.json()


def test_requires_a_key_and_validates(anon_client, tenant):
    assert anon_client.post("/v1/launch/preflight", {}, format="json").status_code == 401
    r = tenant.agent_client.post("/v1/launch/preflight", {"base_url": ["x"]}, format="json")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "base_url"]


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("", "none given"),
        ("sk_test_4eC39HqLyjWDarjtT1zdp7dc9Zk2Lm", "test-mode"),
        ("rk_test_4eC39HqLyjWDarjtT1zdp7dc9Zk2Lm", "test-mode"),
        ("pk_live_4eC39HqLyjWDarjtT1zdp7dc9Zk2Lm", "publishable"),
        ("changeme", "placeholder"),
        ("placeholder", "placeholder"),
        ("sk_live_xxxxxxxxxxxxxxxxxxxxxxxxxxxx", "placeholder"),
        ("sk_live_YOUR_KEY_HERE_000000000000000", "placeholder"),
        ("sk_live_<your-secret-key>", "placeholder"),
        ("sk_live_000000000000000000000000000", "placeholder"),
        ("sk_live_short123", "unrecognized format"),
        ("AKIAIOSFODNN7EXAMPL3QZ", "unrecognized format"),
        ("sk_live_4eC39HqLyjWDarjtT1zd-p7dc9Zk2Lm", "unrecognized format"),
    ],
)
def test_keys_rejects(published, key, reason):
    report = run(published, payment_secret_key=key)
    assert report.verdict == "NO-GO"
    keys = check(report, "KEYS")
    assert keys.status == "fail"
    assert any(reason in d for d in keys.details), keys.details
    if len(key) > 12:  # a bare placeholder word is named as the marker found; real key values never
        assert not any(key in d for d in keys.details), "a key value must never be echoed"


def test_keys_accepts_restricted_live_key(published):
    report = run(published, payment_secret_key="rk_live_" + "Zk2Lm4eC39HqLyjWDarjtT1zdp7dc9")
    assert check(report, "KEYS").status == "pass"
    assert report.verdict == "GO"


def test_keys_rejects_placeholder_django_secret(published):
    with override_settings(SECRET_KEY="dev-insecure-tollgate-secret-key-change-me-0123456789"):
        report = launch_preflight_run(
            base_url=BASE, payment_secret_key=LIVE_KEY, campaign_source_url=CAMPAIGN, fetcher=published
        )
    keys = check(report, "KEYS")
    assert keys.status == "fail"
    assert any(d.startswith("SECRET_KEY") for d in keys.details)


@pytest.mark.parametrize(
    ("base", "reason"),
    [
        ("http://gateway.tollgate-launch.dev", "is not https"),
        ("https://localhost:8443", "single-label"),
        ("https://127.0.0.1", "IP address"),
        ("https://[::1]", "IP address"),
        ("https://10.1.2.3", "IP address"),
        ("https://gateway", "single-label"),
        ("https://gateway.internal", "reserved"),
        ("https://app.localhost", "reserved"),
        ("https://user:pw@gateway.tollgate-launch.dev", "credentials"),
        ("https://exa mple.com", "not a valid domain"),
    ],
)
def test_domain_rejects_non_public_bases_without_fetching(published, base, reason):
    report = run(published, base_url=base)
    domain = check(report, "DOMAIN")
    assert report.verdict == "NO-GO"
    assert domain.status == "fail"
    assert any(reason in d for d in domain.details), domain.details
    assert not any(call.startswith(base) for call in published.calls)


@pytest.mark.parametrize(
    ("page", "answer", "reason"),
    [
        ("/.well-known/agent.json", (404, "{}"), "HTTP 404"),
        ("/.well-known/agent.json", (200, "<html>hi</html>"), "not an agent manifest"),
        ("/.well-known/agent.json", None, "ConnectionRefusedError"),
        ("/llms.txt", (500, "oops"), "HTTP 500"),
        ("/llms.txt", (200, "  \n"), "empty"),
    ],
)
def test_domain_requires_the_manifests_to_resolve(published, page, answer, reason):
    if answer is None:
        del published.pages[f"{BASE}{page}"]
    else:
        published.pages[f"{BASE}{page}"] = answer
    report = run(published)
    domain = check(report, "DOMAIN")
    assert report.verdict == "NO-GO"
    assert domain.status == "fail"
    assert any(reason in d for d in domain.details), domain.details


def test_domain_warns_on_a_stale_published_version(published):
    url = f"{BASE}/.well-known/agent.json"
    manifest = json.loads(published.pages[url][1])
    published.pages[url] = (200, json.dumps({**manifest, "version": "1.2.0"}))
    report = run(published)
    assert check(report, "DOMAIN").status == "warn"
    assert report.verdict == "GO"


@pytest.mark.parametrize(
    ("directories", "reason"),
    [
        ([], "no agent directory"),
        (["http://registry.agent-directory.dev/register"], "is not https"),
        (["https://192.168.1.10/register"], "IP address"),
        ([DIRECTORY, "not a url"], "is not https"),
    ],
)
def test_oracle_rejects(published, directories, reason):
    with override_settings(**{**GOOD_SETTINGS, "AGENT_DIRECTORY_URLS": directories}):
        report = launch_preflight_run(
            base_url="", payment_secret_key=LIVE_KEY, campaign_source_url=CAMPAIGN, fetcher=published
        )
    oracle = check(report, "ORACLE")
    assert report.verdict == "NO-GO"
    assert oracle.status == "fail"
    assert any(reason in d for d in oracle.details), oracle.details
    # Directories are never contacted: preflight registers nothing.
    assert not any("agent-directory" in call for call in published.calls)


@pytest.mark.parametrize(
    ("campaign", "answer", "reason"),
    [
        ("https://cdn.tollgate-launch.dev/missing.json", None, "unreachable"),
        ("https://cdn.tollgate-launch.dev/gone.json", (404, "no"), "HTTP 404"),
        ("https://cdn.tollgate-launch.dev/moved.json", (301, ""), "HTTP 301"),
        ("ftp://cdn.tollgate-launch.dev/campaign.json", (200, "x"), "is not https"),
        ("https://127.0.0.1/campaign.json", (200, "x"), "IP address"),
    ],
)
def test_assets_rejects_bad_content_sources(published, campaign, answer, reason):
    if answer is not None:
        published.pages[campaign] = answer
    report = run(published, campaign_source_url=campaign)
    assets = check(report, "ASSETS")
    assert report.verdict == "NO-GO"
    assert assets.status == "fail"
    assert any(reason in d and campaign in d for d in assets.details), assets.details


def test_assets_rejects_an_unreachable_crawl_target(published):
    published.pages[f"{BASE}/WEDGE.md"] = (404, "")
    report = run(published)
    assets = check(report, "ASSETS")
    assert assets.status == "fail"
    assert any("crawl target" in d and "/WEDGE.md" in d for d in assets.details)


def test_assets_without_content_sources_only_warns(published):
    report = run(published, campaign_source_url="")
    assert check(report, "ASSETS").status == "warn"
    assert report.verdict == "GO"


def test_assets_setting_sources_are_checked(published):
    extra = "https://media.tollgate-launch.dev/feed.xml"
    with override_settings(**{**GOOD_SETTINGS, "CONTENT_SOURCE_URLS": [extra]}):
        report = launch_preflight_run(
            base_url="", payment_secret_key=LIVE_KEY, campaign_source_url=CAMPAIGN, fetcher=published
        )
    assert check(report, "ASSETS").status == "fail"
    assert extra in published.calls


def test_default_fetcher_refuses_private_and_plain_http():
    fetcher = HttpxFetcher(timeout=1.0)
    with pytest.raises(FetchRefused, match="https"):
        fetcher("http://gateway.tollgate-launch.dev/llms.txt")
    # One answer whether a name resolves to a private address, is an IP literal or does not resolve at all.
    refusals = set()
    for url in ("https://localhost/llms.txt", "https://127.0.0.1/llms.txt", "https://no-such-host.invalid/x"):
        with pytest.raises(FetchRefused) as refused:
            fetcher(url)
        refusals.add(str(refused.value))
    assert refusals == {"not fetched: the host is not reachable at a public address"}


def test_wallet_keys_learn_nothing_about_the_operators_configuration(tenant, published, monkeypatch):
    monkeypatch.setattr(preflight, "default_fetcher", lambda: published)
    for secret_key in ("django-insecure-placeholder", "x" * 60 + "a-real-looking-secret"):
        bad = {**GOOD_SETTINGS, "SECRET_KEY": secret_key, "PAYMENT_SECRET_KEY": ""}
        with override_settings(**bad):
            r = tenant.agent_client.post("/v1/launch/preflight", {}, format="json")
        assert r.status_code == 200, r.content
        text = r.content.decode()
        assert "SECRET_KEY" not in text
        assert "PAYMENT_SECRET_KEY" not in text
        assert "setting" not in text
        assert "CONTENT_SOURCE_URLS" not in text
        assert BASE not in text  # PUBLIC_BASE_URL is the operator's too
        statuses = {c["name"]: c["status"] for c in r.json()["checks"]}
        assert set(statuses.values()) == {"skipped"}, statuses
        assert r.json()["verdict"] == "GO"  # nothing it sent failed
    # What it sends is checked.
    with override_settings(**GOOD_SETTINGS):
        r = tenant.agent_client.post(
            "/v1/launch/preflight", {"payment_secret_key": "sk_test_abc", "base_url": BASE}, format="json"
        )
    checks = {c["name"]: c for c in r.json()["checks"]}
    assert checks["KEYS"]["status"] == "fail"
    assert checks["DOMAIN"]["status"] == "pass"
    assert not any("SECRET_KEY" in d for d in checks["KEYS"]["details"])


def test_the_fetcher_connects_to_the_address_it_checked(monkeypatch):
    """DNS rebinding: the name is resolved once; the connection goes to that checked address."""
    import socket

    answers = iter([[(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 443))]])

    def fake_getaddrinfo(host, port, *args, **kwargs):
        return next(answers)  # a second lookup would raise StopIteration

    seen: dict[str, Any] = {}

    def fake_stream(self, method, url, headers=None, extensions=None, **kwargs):
        seen.update(url=str(url), host=headers.get("Host"), sni=(extensions or {}).get("sni_hostname"))
        raise httpx.ConnectError("stop here")

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    monkeypatch.setattr(httpx.Client, "stream", fake_stream)
    with pytest.raises(httpx.ConnectError):
        HttpxFetcher(timeout=1.0)("https://gateway.tollgate-launch.dev/llms.txt")
    assert seen == {
        "url": "https://93.184.215.14/llms.txt",
        "host": "gateway.tollgate-launch.dev",
        "sni": "gateway.tollgate-launch.dev",
    }


@pytest.mark.django_db(transaction=True)
def test_default_fetcher_reads_a_loopback_server_when_allowed(live_server):
    status, body = HttpxFetcher(timeout=5.0, allow_private=True)(f"{live_server.url}/llms.txt")
    assert status == 200
    assert body.startswith("# Tollgate 1.3.0")
