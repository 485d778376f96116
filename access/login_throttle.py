"""Failed password sign-ins on the console (``/admin/login/``) and the approval pages (``/approvals/login``).

Three leaky buckets per attempt, rows of ``access.models.LoginThrottle`` in PostgreSQL (whatever
``RATE_LIMIT_BACKEND`` says: a lockout must hold across processes and survive a restart):

* the account from this client (``client`` scope): ``LOGIN_FAILURES_PER_CLIENT`` failures an hour;
* the account from every client (``account``): ``LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR``, so guessing
  spread over many addresses stays slow;
* this client for every account (``address``): ``LOGIN_FAILURES_PER_ADDRESS_PER_HOUR``, so one
  address spraying one password over many usernames stops too.

A bucket drains continuously at its hourly limit: there is no window boundary to straddle. A
failure that leaves no room in a bucket for another locks that row for the next cool-off of
``LOGIN_COOLOFF_MINUTES`` (1, 5, 15, 60 minutes by default); the lockout level starts again after
``LOGIN_LOCKOUT_RESET_HOURS`` without an attempt or a lock. A ``client`` lock holds the account
only from that client: the right person elsewhere still signs in. Each lock and each console
unlock is audited (``auth.login_locked``, ``auth.login_unlocked``).

The account is the username as Django authenticates it, NFKC-normalized (``UsernameField``), and
casefolded; where a user with that username exists, the user's id. Every spelling that reaches
one account (fullwidth letters, other cases) therefore shares its buckets, and an unknown username
is counted the same way, so behaviour does not tell whether it exists.

Each attempt is charged to its three buckets, under their row locks, before its password is
checked, and given back when it succeeds (to the ``client`` bucket: all of it) or is not checked.
An attempt that finds a row locked, or a bucket with no room, is refused (429, "retry in N s")
without its password being checked, and costs nothing. Attempts in flight together are each
counted before any is checked, so concurrency cannot add attempts to a bucket's limit.
(docs/decisions.md, Operator console.)
"""

from __future__ import annotations

import enum
import functools
import hashlib
import logging
import math
import random
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.template.response import TemplateResponse
from django.utils import timezone

from access.models import LoginThrottle, LoginThrottleScope
from audit.services import audit_record
from common.jsonbounds import text_problem

logger = logging.getLogger("tollgate.login_throttle")

# Rows whose lockout level has reset and whose bucket has drained are deleted now and then by the
# attempts themselves (once in this many, on average).
PRUNE_EVERY = 200


def clock() -> datetime:
    """The throttle's clock: every time it reads is read here (tests move it)."""
    return timezone.now()


class Outcome(enum.Enum):
    FAILED = "failed"  # the form came back: wrong username or password
    SUCCEEDED = "succeeded"  # signed in (a redirect)
    UNCHECKED = "unchecked"  # the view raised: not a checked attempt


@dataclass(frozen=True)
class LoginAccount:
    """The account an attempt is counted against: ``key`` as stored, ``label`` as the console shows it."""

    key: str
    label: str


@dataclass(frozen=True)
class Admission:
    """The verdict on one attempt. ``rows`` are the (scope, account_key, client) it was charged to."""

    admitted: bool
    retry_after: int
    rows: tuple[tuple[str, str, str], ...]
    account: LoginAccount
    client: str


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def _printable(text: str) -> str:
    """``text`` with what PostgreSQL text cannot hold (NUL, lone surrogates) replaced, for labels and audit."""
    if text_problem(text) is None:
        return text
    return "".join("\ufffd" if ch == "\x00" or 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)


def login_account(*, username: str) -> LoginAccount:
    """The account a sign-in with ``username`` is counted against (see the module docstring).

    ``authenticate`` finds the user whose username equals the NFKC form of what was typed; every
    spelling with that NFKC form casefolds alike, so it finds the same candidates here. Where
    exactly one user's username casefolds to the typed one, the key is that user's id; otherwise
    (none, or two users differing only in case) it is the hash of the casefolded name.
    """
    typed = unicodedata.normalize("NFKC", username)
    folded = _fold(typed)
    user_model = get_user_model()
    field = user_model.USERNAME_FIELD
    max_length = getattr(user_model._meta.get_field(field), "max_length", None) or 150
    if text_problem(typed) is None and len(typed) <= max_length:
        lookup = f"{field}__iexact"
        found = user_model._default_manager.filter(Q(**{lookup: typed}) | Q(**{lookup: folded}))
        users = [user for user in found.only("pk", field)[:10] if _fold(str(getattr(user, field))) == folded]
        if len(users) == 1:
            return LoginAccount(key=f"user:{users[0].pk}", label=str(getattr(users[0], field))[:150])
    digest = hashlib.sha256(folded.encode("utf-8", "surrogatepass")).hexdigest()
    return LoginAccount(key=f"name:{digest}", label=_printable(folded)[:150])


def client_address(request: HttpRequest) -> str:
    """The client an attempt comes from: its address, as the API's rate limits see it."""
    return str(request.META.get("REMOTE_ADDR") or "unknown")[:64]


def _limit(scope: str) -> int:
    if scope == LoginThrottleScope.CLIENT:
        return int(settings.LOGIN_FAILURES_PER_CLIENT)
    if scope == LoginThrottleScope.ACCOUNT:
        return int(settings.LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR)
    return int(settings.LOGIN_FAILURES_PER_ADDRESS_PER_HOUR)


def cooloff(level: int) -> timedelta:
    """The lockout after ``level`` earlier ones: the ``level``-th of ``LOGIN_COOLOFF_MINUTES``, then the last."""
    minutes = settings.LOGIN_COOLOFF_MINUTES
    return timedelta(minutes=minutes[min(level, len(minutes) - 1)])


def _is_locked(row: LoginThrottle, now: datetime) -> bool:
    return row.locked_until is not None and row.locked_until > now


def _drain(row: LoginThrottle, now: datetime) -> None:
    """Bring ``row`` to ``now``: the bucket drains at its hourly limit; after a quiet period with no
    attempt and no lock, the lockout level starts again. Caller holds the row lock."""
    if _is_locked(row, now):
        return
    quiet_since = max(row.updated_at, row.locked_until or row.updated_at)
    if now - quiet_since >= timedelta(hours=settings.LOGIN_LOCKOUT_RESET_HOURS):
        row.level = 0
    elapsed = max(0.0, (now - row.updated_at).total_seconds())
    row.failures = max(0.0, row.failures - elapsed * _limit(row.scope) / 3600)
    row.updated_at = max(row.updated_at, now)


def _rows_of(account: LoginAccount, client: str) -> tuple[tuple[str, str, str], ...]:
    # Sorted by scope, which every attempt has one row of: row locks are always taken in this order.
    return tuple(
        sorted(
            [
                (LoginThrottleScope.ACCOUNT.value, account.key, ""),
                (LoginThrottleScope.ADDRESS.value, "", client),
                (LoginThrottleScope.CLIENT.value, account.key, client),
            ]
        )
    )


def _lock_rows(rows: Sequence[tuple[str, str, str]], label: str, now: datetime) -> list[LoginThrottle]:
    """Create the rows that are missing, then lock them all in ``rows``' order (scope order)."""
    LoginThrottle.objects.bulk_create(
        [
            LoginThrottle(
                scope=scope, account_key=key, client=client, account_label=label if key else "", updated_at=now
            )
            for scope, key, client in rows
        ],
        ignore_conflicts=True,
    )
    match = Q()
    for scope, key, client in rows:
        match |= Q(scope=scope, account_key=key, client=client)
    return list(LoginThrottle.objects.select_for_update().filter(match).order_by("scope"))


def _seconds(delta: timedelta) -> int:
    return max(1, math.ceil(delta.total_seconds()))


@transaction.atomic(durable=True)
def login_attempt_admit(*, account: LoginAccount, client: str) -> Admission:
    """Charge one attempt to its three buckets before its password is checked, or refuse it.

    Refused (nothing charged) when a row is locked (``retry_after``: until the lock ends) or a bucket
    has no room for one more attempt, counting the attempts in flight (``retry_after``: until it
    drains enough). Admitted attempts are charged under the row locks, so no more attempts than a
    bucket's limit can be checked however many arrive together. The caller settles an admitted
    attempt with ``login_attempt_settle``.
    """
    now = clock()
    rows = _rows_of(account, client)
    locked_rows = _lock_rows(rows, account.label, now)
    for row in locked_rows:
        _drain(row, now)
    refused = [row.locked_until - now for row in locked_rows if row.locked_until is not None and row.locked_until > now]
    full = [
        timedelta(hours=(row.failures + 1 - _limit(row.scope)) / _limit(row.scope))
        for row in locked_rows
        if row.failures + 1 > _limit(row.scope)
    ]
    if refused or full:
        return Admission(False, _seconds(max(refused + full)), rows, account, client)
    for row in locked_rows:
        row.failures += 1
        row.save(update_fields=["failures", "updated_at", "level"])
    return Admission(True, 0, rows, account, client)


@transaction.atomic(durable=True)
def login_attempt_settle(*, admission: Admission, outcome: Outcome, endpoint: str) -> list[LoginThrottle]:
    """Settle an admitted attempt; returns the rows it locked.

    A failure stays charged, and locks each row it leaves with no room for another attempt: for
    the cool-off of the row's level, which then grows; the bucket starts empty after the lock. Each
    lock is audited (``auth.login_locked``) as the last statements. A success gives its charge back
    and empties its ``client`` bucket (the person at that client knows the password); an unchecked
    attempt gives its charge back.
    """
    now = clock()
    locked_rows = _lock_rows(admission.rows, admission.account.label, now)
    newly_locked: list[LoginThrottle] = []
    for row in locked_rows:
        _drain(row, now)
        if outcome is Outcome.SUCCEEDED and row.scope == LoginThrottleScope.CLIENT:
            row.failures = 0
        elif outcome is not Outcome.FAILED:
            row.failures = max(0.0, row.failures - 1)
        elif not _is_locked(row, now) and row.failures + 1 > _limit(row.scope):
            row.locked_until = now + cooloff(row.level)
            row.level += 1
            row.failures = 0
            newly_locked.append(row)
        row.save(update_fields=["failures", "updated_at", "level", "locked_until"])
    for row in newly_locked:
        assert row.locked_until is not None
        audit_record(
            event="auth.login_locked",
            ok=False,
            endpoint=endpoint[:300],
            detail={
                "client": admission.client,
                "username": admission.account.label,
                "scope": row.scope,
                "level": row.level,
                "cooloff_seconds": _seconds(row.locked_until - now),
                "locked_until": row.locked_until.isoformat(),
            },
        )
    return newly_locked


@transaction.atomic(durable=True)
def login_throttle_unlock(*, throttle_ids: Sequence[int], actor: str) -> list[LoginThrottle]:
    """Lift the lockouts of the rows ``throttle_ids`` that are locked now; returns those rows.

    The bucket is emptied; the level stays, so a lock that follows is longer (it resets after the
    quiet period like any other). Each unlock is audited (``auth.login_unlocked``) with ``actor``
    (``admin:<username>``). Takes the row locks in the order the sign-in path takes them.
    """
    now = clock()
    rows = list(
        LoginThrottle.objects.select_for_update()
        .filter(pk__in=list(throttle_ids))
        .order_by("scope", "account_key", "client")
    )
    unlocked = [row for row in rows if _is_locked(row, now)]
    for row in unlocked:
        row.locked_until = None
        row.failures = 0
        row.updated_at = max(row.updated_at, now)
        row.save(update_fields=["locked_until", "failures", "updated_at"])
    for row in unlocked:
        audit_record(
            event="auth.login_unlocked",
            ok=True,
            detail={
                "actor": actor,
                "scope": row.scope,
                "username": row.account_label,
                "client": row.client,
                "level": row.level,
            },
        )
    return unlocked


def login_throttle_prune(*, now: datetime | None = None) -> int:
    """Delete the rows that no longer hold anything: no lock, last touched a quiet period ago (the
    level would reset) and at least an hour ago (every bucket has drained). Returns how many."""
    now = clock() if now is None else now
    quiet = now - max(timedelta(hours=settings.LOGIN_LOCKOUT_RESET_HOURS), timedelta(hours=1))
    stale = LoginThrottle.objects.filter(updated_at__lt=quiet).filter(
        Q(locked_until__isnull=True) | Q(locked_until__lt=quiet)
    )
    deleted, _ = stale.delete()
    return deleted


def throttle_failed_logins(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Wrap a password login view (Django's ``LoginView``, the console's login) with the throttle.

    A POST is admitted (charged) or refused with the 429 "retry in N s" page before the view checks
    the password; a redirect is a successful sign-in, any other answer a failed one.
    """

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        account = login_account(username=str(request.POST.get("username") or ""))
        admission = login_attempt_admit(account=account, client=client_address(request))
        if not admission.admitted:
            return _locked_page(request, admission.retry_after)
        try:
            response = view(request, *args, **kwargs)
        except BaseException:
            login_attempt_settle(admission=admission, outcome=Outcome.UNCHECKED, endpoint=request.path)
            raise
        outcome = Outcome.SUCCEEDED if response.status_code == 302 else Outcome.FAILED
        login_attempt_settle(admission=admission, outcome=outcome, endpoint=request.path)
        if random.randrange(PRUNE_EVERY) == 0:
            login_throttle_prune()
        return response

    return wrapped


def _locked_page(request: HttpRequest, retry_after: int) -> HttpResponse:
    response = TemplateResponse(request, "login_locked.html", {"retry_after": retry_after}, status=429)
    response["Retry-After"] = str(retry_after)
    return response
