"""Failed password logins are throttled per client and per username (console and approval pages)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from audit.models import AuditEvent

pytestmark = pytest.mark.django_db

PASSWORD = "the-right-password-for-tests"
PAGES = [("/admin/login/", {"next": "/admin/"}), ("/approvals/login", {})]


@pytest.fixture(autouse=True, params=["database", "cache"])
def backend(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.RATE_LIMIT_BACKEND = request.param
    return str(request.param)


@pytest.mark.parametrize(("path", "extra"), PAGES)
def test_guessing_stops_after_twelve_failures_and_the_right_password_waits(path: str, extra: dict[str, str]) -> None:
    get_user_model().objects.create_user("ops", password=PASSWORD, is_staff=True)
    client = Client(REMOTE_ADDR="10.1.1.1")
    statuses = [client.post(path, {"username": "ops", "password": f"wrong{i}", **extra}).status_code for i in range(20)]
    assert statuses[:12] == [200] * 12  # the form again, "wrong username or password"
    assert statuses[12:] == [429] * 8
    locked = client.post(path, {"username": "ops", "password": PASSWORD, **extra})
    assert locked.status_code == 429
    assert b"Too many failed sign-in attempts" in locked.content
    assert 1 <= int(locked["Retry-After"]) <= 60
    assert f"Retry in <strong>{locked['Retry-After']} s</strong>".encode() in locked.content
    events = AuditEvent.objects.filter(event="auth.login_locked")
    assert events.count() == 1  # the lockout, once, not every refused attempt
    assert events.get().detail["username"] == "ops"


@pytest.mark.parametrize(("path", "extra"), PAGES)
def test_the_username_bucket_holds_across_addresses(path: str, extra: dict[str, str]) -> None:
    get_user_model().objects.create_user("ops", password=PASSWORD, is_staff=True)
    for i in range(12):
        Client(REMOTE_ADDR=f"10.2.0.{i}").post(path, {"username": "ops", "password": "wrong", **extra})
    fresh = Client(REMOTE_ADDR="10.3.3.3")
    assert fresh.post(path, {"username": "ops", "password": PASSWORD, **extra}).status_code == 429
    # Another user from that fresh address is not affected.
    get_user_model().objects.create_user("other", password=PASSWORD, is_staff=True)
    assert fresh.post(path, {"username": "other", "password": PASSWORD, **extra}).status_code == 302


@pytest.mark.parametrize(("path", "extra"), PAGES)
def test_successful_logins_cost_nothing(path: str, extra: dict[str, str]) -> None:
    get_user_model().objects.create_user("ops", password=PASSWORD, is_staff=True)
    for _ in range(20):
        client = Client(REMOTE_ADDR="10.4.4.4")
        assert client.post(path, {"username": "ops", "password": PASSWORD, **extra}).status_code == 302
