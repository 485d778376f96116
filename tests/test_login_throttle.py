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


@pytest.mark.django_db(transaction=True)
def test_attempts_in_flight_together_are_counted_before_any_is_checked(backend: str) -> None:
    """Twenty wrong passwords sent at once: at most twelve reach the password check, the rest are locked."""
    import threading
    import time

    from django.db import connections
    from django.http import HttpResponse
    from django.test import RequestFactory

    from billing.ratelimit import throttle_failed_logins

    checked: list[int] = []

    def slow_wrong_password(request: Any) -> HttpResponse:
        checked.append(1)
        time.sleep(0.2)  # hashing the password: every attempt is in flight at once
        return HttpResponse("wrong username or password", status=200)

    view = throttle_failed_logins(slow_wrong_password)
    start = threading.Barrier(20)
    statuses: list[int] = []

    def attempt() -> None:
        try:
            start.wait(10)
            form = {"username": "ops", "password": "x"}
            request = RequestFactory().post("/admin/login/", form, REMOTE_ADDR="10.9.9.9")
            statuses.append(view(request).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # At most twelve (attempts charged to the two buckets in different orders can lock one more early).
    assert 10 <= len(checked) <= 12
    assert sorted(statuses) == [200] * len(checked) + [429] * (20 - len(checked))
