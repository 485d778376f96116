"""Security headers on every HTML page; no inline script runs without the request's nonce."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.browser import browser_page, require_chromium, screenshot
from tests.conftest import Tenant
from tests.test_site_production import ROOT, SOUND

PAGES = ["/admin/login/", "/approvals/login", "/dashboard", "/docs", "/redoc"]


def _assert_secure_html(response: Any, path: str) -> None:
    assert response["Content-Type"].startswith("text/html"), path
    csp = response["Content-Security-Policy"]
    script_src = re.search(r"script-src ([^;]+)", csp)
    assert script_src is not None, path
    assert "'unsafe-inline'" not in script_src.group(1), path
    assert re.search(r"'nonce-[A-Za-z0-9_-]{16,}'", script_src.group(1)), path
    assert "frame-ancestors 'none'" in csp
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
    # Every inline script on the page carries this response's nonce.
    nonce = re.search(r"'nonce-([^']+)'", csp).group(1)  # type: ignore[union-attr]
    for tag in re.findall(rb"<script(?![^>]*\bsrc=)[^>]*>", response.content):
        assert f'nonce="{nonce}"'.encode() in tag, (path, tag)


@pytest.mark.django_db
@pytest.mark.parametrize("path", PAGES)
def test_every_html_page_carries_the_headers(path: str) -> None:
    _assert_secure_html(Client().get(path), path)


@pytest.mark.django_db
def test_console_and_card_pages_carry_the_headers(tenant: Tenant) -> None:
    user = get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    client = Client()
    client.force_login(user)
    for path in ("/admin/", "/admin/billing/wallet/", "/admin/billing/wallet/add/", "/approvals/"):
        _assert_secure_html(client.get(path), path)
    r = tenant.agent_client.post(
        "/v1/permit-requests",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["clock.now"], "max_credits": "5"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="card-headers",
    )
    assert r.status_code == 202, r.content
    card = tenant.agent_client.get(f"/v1/permit-requests/{r.json()['request_id']}/card")
    _assert_secure_html(card, "card")
    # JSON answers are not HTML: no policy needed there.
    assert "Content-Security-Policy" not in tenant.agent_client.get("/v1/me/authority")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("path", "ready"), [("/docs", ".swagger-ui .info .title"), ("/redoc", ".api-info h1")])
def test_docs_run_under_the_policy_in_chromium(live_server: Any, path: str, ready: str) -> None:
    require_chromium()
    with browser_page(viewport={"width": 1366, "height": 768}) as page:
        violations: list[str] = []
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        page.goto(f"{live_server.url}{path}")
        page.wait_for_selector(ready, timeout=30_000)
        page.wait_for_load_state("networkidle")
        screenshot(page, f"csp{path.replace('/', '-')}")
        assert not violations, violations


@pytest.mark.django_db(transaction=True)
def test_console_runs_under_the_policy_in_chromium(live_server: Any) -> None:
    require_chromium()
    from tests import factories

    get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    factories.make_sponsor("acme", balance=10)  # an empty list shows no actions
    with browser_page(viewport={"width": 1366, "height": 768}) as page:
        violations: list[str] = []
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        page.goto(f"{live_server.url}/admin/login/?next=/admin/billing/wallet/")
        page.fill("#id_username", "root")
        page.fill("#id_password", "pw-for-tests-only")
        page.click("input[type=submit]")
        page.wait_for_selector("#changelist", timeout=30_000)
        page.check("input.action-select")  # the admin's own scripts run: the counter updates
        page.wait_for_function("document.querySelector('.action-counter').textContent.startsWith('1 of')")
        page.select_option("select[name=action]", "close_wallets")
        page.click("button[name=index]")
        page.wait_for_selector("#confirm-action", timeout=30_000)  # the confirmation page, nothing closed yet
        screenshot(page, "csp-console-close-confirmation")
        assert not violations, violations


def test_production_settings_force_https_and_hsts() -> None:
    probe = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "s.SECURE_PROXY_SSL_HEADER)"
    )

    def settings_with(**extra: str) -> list[str]:
        import os

        env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
        env.update(SOUND)
        env.update(extra)
        done = subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(" ", 4)

    assert settings_with() == ["True", "31536000", "True", "True", "None"]
    behind_proxy = settings_with(SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO")
    assert behind_proxy[4] == "('HTTP_X_FORWARDED_PROTO', 'https')"
