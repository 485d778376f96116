"""Failed password logins are throttled (console and approval pages): per account from one client, per
account from every client and per client for every account, with growing cool-offs
(access.login_throttle; docs/decisions.md, Operator console)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.test import Client

from audit.models import AuditEvent

pytestmark = pytest.mark.django_db

PASSWORD = "the-right-password-for-tests"
PAGES = [("/admin/login/", {"next": "/admin/"}), ("/approvals/login", {})]
CONSOLE = PAGES[0]
_staff = itertools.count()


@dataclass
class Clock:
    now: datetime

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The throttle's clock, moved by the test (never by sleeping)."""
    from access import login_throttle

    frozen = Clock(login_throttle.clock())
    monkeypatch.setattr(login_throttle, "clock", lambda: frozen.now)
    return frozen


def ops(username: str = "ops") -> Any:
    return get_user_model().objects.create_user(username, password=PASSWORD, is_staff=True)


def attempt(address: str, username: str, password: str, page: tuple[str, dict[str, str]] = CONSOLE) -> Any:
    path, extra = page
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password, **extra})


def fail(address: str, username: str, times: int, page: tuple[str, dict[str, str]] = CONSOLE) -> list[int]:
    return [attempt(address, username, f"wrong{i}", page).status_code for i in range(times)]


@pytest.mark.parametrize("page", PAGES)
def test_guessing_stops_after_twelve_failures_and_the_right_password_waits(page: tuple[str, dict[str, str]]) -> None:
    ops()
    statuses = fail("10.1.1.1", "ops", 20, page)
    assert statuses[:12] == [200] * 12  # the form again, "wrong username or password"
    assert statuses[12:] == [429] * 8
    locked = attempt("10.1.1.1", "ops", PASSWORD, page)
    assert locked.status_code == 429
    assert b"Too many failed sign-in attempts" in locked.content
    assert 1 <= int(locked["Retry-After"]) <= 60  # the first cool-off: one minute
    assert f"Retry in <strong>{locked['Retry-After']} s</strong>".encode() in locked.content
    events = AuditEvent.objects.filter(event="auth.login_locked")
    assert events.count() == 1  # the lockout, once, not every refused attempt
    assert events.get().detail["username"] == "ops"
    assert events.get().detail["scope"] == "client"


@pytest.mark.parametrize("page", PAGES)
def test_fullwidth_and_case_spellings_share_the_account(page: tuple[str, dict[str, str]]) -> None:
    """Django signs the fullwidth spelling in as ``operator`` (NFKC): every spelling counts against one account."""
    ops("operator")
    statuses = fail("10.1.1.2", "operator", 4, page)
    statuses += fail("10.1.1.2", "ＯＰＥＲＡＴＯＲ", 4, page)
    statuses += fail("10.1.1.2", "Operator", 4, page)
    assert statuses == [200] * 12
    for spelling in ("ｏｐｅｒａｔｏｒ", "operator", "OPERATOR"):
        assert attempt("10.1.1.2", spelling, PASSWORD, page).status_code == 429
    # The fullwidth spelling does sign in as operator, from a client that is not locked.
    assert attempt("10.1.1.3", "ｏｐｅｒａｔｏｒ", PASSWORD, page).status_code == 302


@pytest.mark.parametrize("page", PAGES)
def test_spellings_spread_over_clients_add_up_on_the_account(settings: Any, page: tuple[str, dict[str, str]]) -> None:
    """The account's ceiling across clients counts every spelling of the account as one."""
    settings.LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR = 12
    ops("operator")
    spellings = ["operator", "ＯＰＥＲＡＴＯＲ", "ｏｐｅｒａｔｏｒ"]
    statuses = [s for i in range(12) for s in fail(f"10.1.2.{i}", spellings[i % 3], 1, page)]
    assert statuses == [200] * 12
    for spelling in spellings:
        assert attempt("10.1.3.1", spelling, PASSWORD, page).status_code == 429


def test_the_account_lock_follows_the_user_not_the_name(settings: Any) -> None:
    """Where the account exists the buckets are the user's: renaming it does not lift its lock."""
    settings.LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR = 12
    user = ops()
    assert [s for i in range(12) for s in fail(f"10.1.4.{i}", "ops", 1)] == [200] * 12
    user.username = "ops-renamed"
    user.save(update_fields=["username"])
    assert attempt("10.1.5.1", "ops-renamed", PASSWORD).status_code == 429


def test_unknown_usernames_are_counted_like_known_ones() -> None:
    """Probing tells nothing: an unknown name locks after the same failures, whatever its spelling."""
    statuses = fail("10.1.1.4", "nobody", 6) + fail("10.1.1.4", "ＮＯＢＯＤＹ", 8)
    assert statuses == [200] * 12 + [429] * 2
    assert AuditEvent.objects.get(event="auth.login_locked").detail["username"] == "nobody"


@pytest.mark.parametrize("page", PAGES)
def test_the_right_password_from_another_client_signs_in_while_one_is_locked(page: tuple[str, dict[str, str]]) -> None:
    ops()
    assert fail("10.2.0.1", "ops", 13, page)[-1] == 429
    assert attempt("10.2.0.1", "ops", PASSWORD, page).status_code == 429
    assert attempt("10.2.0.2", "ops", PASSWORD, page).status_code == 302  # the right person, elsewhere
    assert fail("10.2.0.3", "ops", 12, page) == [200] * 12  # each client has its own count


def test_the_cooloff_grows_with_each_lockout_and_resets_after_a_quiet_period(clock: Clock) -> None:
    ops()
    waits = []
    for _ in range(5):
        assert fail("10.3.0.1", "ops", 12) == [200] * 12
        locked = attempt("10.3.0.1", "ops", PASSWORD)
        assert locked.status_code == 429
        waits.append(int(locked["Retry-After"]))
        clock.advance(seconds=waits[-1] - 1)
        assert attempt("10.3.0.1", "ops", PASSWORD).status_code == 429  # a second before the end: still locked
        clock.advance(seconds=1)
    assert waits == [60, 300, 900, 3600, 3600]
    levels = [e.detail["level"] for e in AuditEvent.objects.filter(event="auth.login_locked").order_by("seq")]
    assert levels == [1, 2, 3, 4, 5]
    clock.advance(hours=23, minutes=59)
    fail("10.3.0.1", "ops", 12)
    assert int(attempt("10.3.0.1", "ops", PASSWORD)["Retry-After"]) == 3600  # not quiet long enough
    clock.advance(hours=25)
    fail("10.3.0.1", "ops", 12)
    assert int(attempt("10.3.0.1", "ops", PASSWORD)["Retry-After"]) == 60  # a quiet day: back to the first


def test_a_burst_across_any_boundary_gets_twelve_checks(clock: Clock) -> None:
    """25 consecutive guesses two seconds apart (a slow host) straddle every minute boundary: 12 are checked."""
    ops()
    statuses = []
    for i in range(25):
        statuses.append(attempt("10.4.0.1", "ops", f"wrong{i}").status_code)
        clock.advance(seconds=2)
    assert statuses == [200] * 12 + [429] * 13


def test_failures_drain_at_the_hourly_limit_not_at_a_boundary(clock: Clock) -> None:
    """Twelve failures an hour: after 11 failures, one more is forgiven every five minutes, no sooner."""
    ops()
    assert fail("10.4.0.2", "ops", 11) == [200] * 11
    clock.advance(minutes=4, seconds=59)
    assert fail("10.4.0.2", "ops", 1) == [200]  # the twelfth locks
    assert attempt("10.4.0.2", "ops", PASSWORD).status_code == 429
    clock.advance(minutes=1, seconds=1)  # the lock ends; the bucket starts empty
    assert fail("10.4.0.2", "ops", 11) == [200] * 11
    clock.advance(minutes=5, seconds=1)  # one failure drained
    assert fail("10.4.0.2", "ops", 2) == [200, 200]
    assert attempt("10.4.0.2", "ops", PASSWORD).status_code == 429  # 13 failures, one drained: full, locked


def test_the_account_ceiling_locks_across_many_clients(settings: Any, clock: Clock) -> None:
    settings.LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR = 30
    ops()
    assert [s for i in range(29) for s in fail(f"10.5.0.{i}", "ops", 1)] == [200] * 29
    assert attempt("10.5.1.1", "ops", PASSWORD).status_code == 302  # below the ceiling the right person signs in
    assert fail("10.5.0.99", "ＯＰＳ", 1) == [200]  # the thirtieth, in another spelling: the account locks
    event = AuditEvent.objects.get(event="auth.login_locked")
    assert (event.detail["scope"], event.detail["level"]) == ("account", 1)
    for fresh in ("10.5.2.1", "10.5.2.2"):
        refused = attempt(fresh, "ops", PASSWORD)
        assert refused.status_code == 429
        assert int(refused["Retry-After"]) == 60
    clock.advance(seconds=61)
    assert attempt("10.5.2.1", "ops", PASSWORD).status_code == 302
    # The next 30 failures (spread again) lock it for the next cool-off.
    assert [s for i in range(30) for s in fail(f"10.5.3.{i}", "ops", 1)] == [200] * 30
    assert int(attempt("10.5.2.2", "ops", PASSWORD)["Retry-After"]) == 300


def test_one_client_spraying_many_usernames_is_stopped(settings: Any) -> None:
    settings.LOGIN_FAILURES_PER_ADDRESS_PER_HOUR = 20
    ops()
    statuses = [s for i in range(21) for s in fail("10.6.0.1", f"user{i}", 1)]
    assert statuses == [200] * 20 + [429]
    assert attempt("10.6.0.1", "ops", PASSWORD).status_code == 429  # the address is locked for every account
    assert attempt("10.6.0.2", "ops", PASSWORD).status_code == 302  # another address is not


@pytest.mark.parametrize("page", PAGES)
def test_successful_logins_cost_nothing(page: tuple[str, dict[str, str]]) -> None:
    ops()
    for _ in range(20):
        assert attempt("10.4.4.4", "ops", PASSWORD, page).status_code == 302


def test_a_success_forgives_that_clients_failures() -> None:
    ops()
    assert fail("10.4.4.5", "ops", 11) == [200] * 11
    assert attempt("10.4.4.5", "ops", PASSWORD).status_code == 302
    assert fail("10.4.4.5", "ops", 12) == [200] * 12


def test_a_username_postgresql_cannot_store_is_counted_and_audited() -> None:
    assert fail("10.4.4.6", "ops\x00", 13) == [200] * 12 + [429]
    assert AuditEvent.objects.get(event="auth.login_locked").detail["username"] == "ops\ufffd"


def staff(*permissions: str) -> tuple[Client, Any]:
    user = get_user_model().objects.create_user(f"staff{next(_staff)}", password="pw-for-tests-only", is_staff=True)
    for label in permissions:
        app_label, codename = label.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    client.force_login(user)
    return client, user


LIST = "/admin/access/loginthrottle/"


def _lock_ops_from(address: str) -> int:
    from access.models import LoginThrottle

    fail(address, "ops", 12)
    return LoginThrottle.objects.get(scope="client", client=address).pk


def test_the_console_lists_locks_and_unlocks_them_audited() -> None:
    ops()
    pk = _lock_ops_from("10.7.0.1")
    fail("10.7.0.2", "ops", 3)  # counted, not locked: not listed
    client, user = staff("access.view_loginthrottle", "access.unlock_login")
    page = client.get(LIST)
    assert page.status_code == 200
    assert page.context["cl"].result_count == 1
    assert b"10.7.0.1" in page.content
    assert b"10.7.0.2" not in page.content
    r = client.post(LIST, {"action": "unlock_selected", "_selected_action": [pk]})
    assert r.status_code == 302
    event = AuditEvent.objects.get(event="auth.login_unlocked")
    assert event.detail["actor"] == f"admin:{user.username}"
    assert (event.detail["username"], event.detail["client"], event.detail["scope"]) == ("ops", "10.7.0.1", "client")
    assert attempt("10.7.0.1", "ops", PASSWORD).status_code == 302
    assert client.get(LIST).context["cl"].result_count == 0


def test_staff_without_the_unlock_permission_cannot_unlock() -> None:
    ops()
    pk = _lock_ops_from("10.7.1.1")
    client, _ = staff("access.view_loginthrottle")
    page = client.get(LIST)
    assert page.status_code == 200
    assert b"unlock_selected" not in page.content
    client.post(LIST, {"action": "unlock_selected", "_selected_action": [pk]})
    assert not AuditEvent.objects.filter(event="auth.login_unlocked").exists()
    assert attempt("10.7.1.1", "ops", PASSWORD).status_code == 429
    # Nor can the page be changed or emptied by other means.
    other, _ = staff("access.view_loginthrottle", "access.change_loginthrottle", "access.delete_loginthrottle")
    other.post(LIST, {"action": "delete_selected", "_selected_action": [pk], "post": "yes"})
    assert other.get(f"{LIST}{pk}/delete/").status_code == 403
    assert attempt("10.7.1.1", "ops", PASSWORD).status_code == 429


def test_the_operator_group_may_unlock_and_the_auditor_only_look() -> None:
    operator = {p.codename for p in Group.objects.get(name="Operator").permissions.all()}
    auditor = {p.codename for p in Group.objects.get(name="Read-only auditor").permissions.all()}
    assert {"view_loginthrottle", "unlock_login"} <= operator
    assert "view_loginthrottle" in auditor
    assert "unlock_login" not in auditor


def test_quiet_rows_are_pruned(clock: Clock) -> None:
    from access.login_throttle import login_throttle_prune
    from access.models import LoginThrottle

    ops()
    fail("10.8.0.1", "ops", 12)  # locked for a minute, then quiet for a day: pruned
    clock.advance(hours=20)
    fail("10.8.0.2", "ops", 2)  # recent: kept
    clock.advance(hours=5)
    login_throttle_prune()
    left = set(LoginThrottle.objects.values_list("scope", "client"))
    assert left == {("account", ""), ("address", "10.8.0.2"), ("client", "10.8.0.2")}


@pytest.mark.django_db(transaction=True)
def test_attempts_in_flight_together_are_counted_before_any_is_checked() -> None:
    """Twenty wrong passwords sent at once: exactly twelve reach the password check, the rest are refused."""
    import threading
    import time

    from django.db import connections
    from django.http import HttpResponse
    from django.test import RequestFactory

    from access.login_throttle import throttle_failed_logins

    checked: list[int] = []

    def slow_wrong_password(request: Any) -> HttpResponse:
        checked.append(1)
        time.sleep(0.2)  # hashing the password: every attempt is in flight at once
        return HttpResponse("wrong username or password", status=200)

    view = throttle_failed_logins(slow_wrong_password)
    start = threading.Barrier(20)
    statuses: list[int] = []

    def attempt_once(i: int) -> None:
        try:
            start.wait(10)
            form = {"username": "ops" if i % 2 else "ＯＰＳ", "password": "x"}
            request = RequestFactory().post("/admin/login/", form, REMOTE_ADDR="10.9.9.9")
            statuses.append(view(request).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt_once, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(checked) == 12
    assert sorted(statuses) == [200] * 12 + [429] * 8
    assert AuditEvent.objects.filter(event="auth.login_locked").count() == 1
