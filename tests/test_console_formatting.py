"""Credits and times read one way on every surface (issue 30, items 10, 11 and 13): the one rule in
``common.formatting``, its filter, the console's lists and detail pages, the approvers' email; the
console's read-only pages, action breadcrumbs, favicon and access log."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.core import mail
from django.template import Context, Template
from django.test import Client

from common.formatting import credits_phrase, credits_text, timestamp_text
from tests import factories
from tests.test_permit_requests import approver_for, ask

pytestmark = pytest.mark.django_db
SECONDS_AND_ZONE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


@pytest.fixture
def admin_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", "", "pw-for-tests-only"))
    return client


@pytest.mark.parametrize(
    ("value", "short", "full"),
    [
        (Decimal("5000"), "5,000.00", "5,000.00000000"),
        ("5800.5", "5,800.50", "5,800.50000000"),
        (Decimal("0.75000000"), "0.75", "0.75000000"),
        (Decimal("0.12345678"), "0.12345678", "0.12345678"),
        (Decimal("-2"), "-2.00", "-2.00000000"),
        (Decimal("1234567.1"), "1,234,567.10", "1,234,567.10000000"),
        (None, "—", "—"),
    ],
)
def test_one_rule_for_credits(value, short, full):
    assert credits_text(value) == short
    assert credits_text(value, full=True) == full
    template = Template('{% load credits %}{{ v|credits }} / {{ v|credits:"full" }}')
    assert template.render(Context({"v": value})) == f"{short} / {full}"


def test_credits_phrase_and_timestamps():
    assert credits_phrase(Decimal("3")) == "3.00 credits"
    assert credits_phrase(Decimal("1")) == "1.00 credits"
    assert timestamp_text(datetime(2026, 11, 27, 16, 29, 10, tzinfo=UTC)) == "2026-11-27 16:29:10 UTC"
    assert timestamp_text(None) == "—"


def test_the_approvers_email_says_the_amount_as_the_card_does(tenant, django_capture_on_commit_callbacks):
    approver_for(tenant, "alice")
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert ask(tenant.agent_client, tenant.agent.wallet_id, key="fmt", max_credits="3").status_code == 202
    message = mail.outbox[0]
    assert "Up to 3.00 credits" in message.body
    assert "3.00000000" not in message.body
    assert "up to <strong>3.00</strong> credits" in message.alternatives[0][0]  # type: ignore[attr-defined]


def test_lists_show_seconds_and_zone_and_detail_pages_full_precision(admin_client):
    sponsor = factories.make_sponsor("fmt", balance=5000)
    listing = admin_client.get("/admin/billing/wallet/").content.decode()
    assert SECONDS_AND_ZONE.search(listing)
    assert "5,000.00" in listing
    assert "5000.00000000" not in listing
    detail = admin_client.get(f"/admin/billing/wallet/{quote(sponsor.pk)}/change/").content.decode()
    assert "5,000.00000000" in detail
    assert SECONDS_AND_ZONE.search(detail)
    ledger = admin_client.get("/admin/billing/ledgerentry/").content.decode()
    assert "5,000.00" in ledger
    assert SECONDS_AND_ZONE.search(ledger)


def test_read_only_pages_say_view_and_offer_no_save(admin_client, tenant):
    key = factories.make_key(tenant.agent, "ro").key
    page = admin_client.get(f"/admin/access/apikey/{quote(key.pk)}/change/").content.decode()
    assert "View API key" in page
    assert "Change API key" not in page
    assert 'name="_save"' not in page
    assert admin_client.post(f"/admin/access/apikey/{quote(key.pk)}/change/", {"name": "x"}).status_code == 403
    wallet_page = admin_client.get(f"/admin/billing/wallet/{quote(tenant.agent.pk)}/change/").content.decode()
    assert 'id="back-to-list"' in wallet_page
    assert "Back to the list of wallets" in wallet_page
    assert ">Close<" not in wallet_page  # not to be read as closing the wallet


def test_action_pages_have_breadcrumbs_with_app_and_model(admin_client, tenant):
    for action in ("close_wallets", "fund_from_parent"):
        page = admin_client.post(
            "/admin/billing/wallet/", {"action": action, "_selected_action": [tenant.agent.pk]}
        ).content.decode()
        crumbs = page[page.index('id="action-breadcrumbs"') :].split("</div>")[0]
        assert 'href="/admin/billing/"' in crumbs
        assert 'href="/admin/billing/wallet/"' in crumbs


def test_closed_wallets_are_not_offered_as_targets(admin_client, tenant):
    from billing.services import wallet_close

    closed = factories.make_wallet(tenant.sponsor, "gone")
    wallet_close(wallet=closed, actor="test")
    page = admin_client.post(
        "/admin/billing/wallet/", {"action": "fund_from_parent", "_selected_action": [closed.pk, tenant.agent.pk]}
    ).content.decode()
    assert 'id="closed-left-out"' in page
    assert f'name="_selected_action" value="{closed.pk}"' not in page
    key_form = admin_client.get("/admin/access/apikey/add/").content.decode()
    assert closed.wallet_id not in key_form
    assert tenant.agent.wallet_id in key_form


def test_favicon_dashboard_link_and_console_login():
    icon = Client().get("/favicon.ico")
    assert icon.status_code == 200
    assert icon["Content-Type"] == "image/x-icon"
    assert icon.content[:4] == b"\x00\x00\x01\x00"
    assert 'href="/admin/"' in Client().get("/dashboard").content.decode()


def test_static_files_stay_out_of_the_access_log_and_the_control_socket_under_data(tmp_path, monkeypatch):
    from gunicorn.config import Config

    # Importing the gunicorn config sets PROMETHEUS_MULTIPROC_DIR for the workers it would start; in the
    # test process it must not outlive this test (later tests would read metrics in multiprocess mode).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    (tmp_path / "metrics").mkdir()
    from config import gunicorn as conf

    assert conf.control_socket.startswith(str(conf._data))
    assert conf._data.name == ".data"
    cfg = Config()
    cfg.set("accesslog", str(tmp_path / "access.log"))
    logger = conf.logger_class(cfg)
    response = SimpleNamespace(status="200 OK", sent=10, headers=[], response_length=10)
    request = SimpleNamespace(headers=[], method="GET", path="/", query="", uri="/", version=(1, 1))
    for path in ("/static/admin/css/base.css", "/favicon.ico", "/admin/"):
        request.path = request.uri = path
        environ = {"PATH_INFO": path, "REMOTE_ADDR": "127.0.0.1", "REQUEST_METHOD": "GET", "RAW_URI": path}
        environ["SERVER_PROTOCOL"] = "HTTP/1.1"
        logger.access(response, request, environ, SimpleNamespace(seconds=0, microseconds=0))
    lines = (tmp_path / "access.log").read_text().splitlines()
    assert len(lines) == 1
    assert "/admin/" in lines[0]
