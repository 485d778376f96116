"""The charge's fast path (billing/fastcharge.py) answers as Django's full path does.

Each scenario is a sequence of requests sent as WSGI calls twice: through Django's own handler
(every middleware, URL resolution, DRF) for one wallet and key, and through ``config.wsgi``'s
application for a twin wallet and key (same balance, controls and history, under the same
sponsor). The answers must be the same: status, every header, and the body, once the ids and
times that differ between two charges are replaced by placeholders. The scenarios cover what the
fast path answers itself (a charge, a replay, every refusal the charge statement raises, a
velocity freeze, an idempotency key reused) and what it hands on (a rejected or revoked key, the
rate limiter's 429, a disallowed host, the HTTPS redirect and HSTS, an oversized body), and
requests it must not take at all.
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import pytest
from django.core.cache import cache
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from access import ratelimit
from access import services as key_services
from billing import fastcharge, services
from billing.fastcharge import Gateway
from billing.models import Wallet
from billing.views import ChargeView, charge_query
from common.errors import RequestValidationError
from tests import factories
from tests.test_billing_charge_fn import QUERY

pytestmark = pytest.mark.django_db

Step = tuple[dict[str, str], dict[str, str]] | Callable[["Side"], object]


@dataclass
class Side:
    """One of the two twins: the wallet a scenario charges, its key, and an operator key of its own."""

    wallet: Wallet
    secret: str
    key_id: str
    operator_secret: str


@dataclass
class Answer:
    status: str
    headers: list[tuple[str, str]]
    body: bytes


def call(app: Callable[..., Any], query: dict[str, str], headers: dict[str, str]) -> Answer:
    """One WSGI call, as gunicorn makes it; the connection is the test's (its transaction stays open)."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/v1/billing/charge",
        "QUERY_STRING": urlencode(query),
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1:8000",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        **headers,
    }
    started: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        started.update(status=status, headers=response_headers)

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        result = app(environ, start_response)
        body = b"".join(result)
        result.close()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    return Answer(started["status"], started["headers"], body)


_GENERATED = re.compile(r"\b(led|ltx|req|evt|key)_[A-Za-z0-9]{22}\b")
_NONCE = re.compile(r"'nonce-[A-Za-z0-9_-]+'")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def normal(answer: Answer, side: Side) -> tuple[str, list[tuple[str, str]], str]:
    """``answer`` with the side's own ids and what differs between any two charges replaced."""

    def scrub(text: str) -> str:
        text = text.replace(side.wallet.wallet_id, "<wallet>").replace(side.key_id, "<key>")
        text = _NONCE.sub("'nonce-<nonce>'", text)
        return _TIME.sub("<time>", _GENERATED.sub(lambda m: f"{m.group(1)}_<id>", text))

    def header(name: str, value: str) -> str:
        if name == "X-Request-Id" and value.startswith("req_"):
            return "<id>"
        if name == "Content-Length":  # a time without microseconds is 7 characters shorter (isoformat)
            assert value == str(len(answer.body))
            return "<length>"
        return scrub(value)

    headers = [(name, header(name, value)) for name, value in answer.headers]
    return answer.status, sorted(headers), scrub(answer.body.decode())


@pytest.fixture
def twins(settings: Any) -> tuple[Side, Side]:
    settings.RATE_LIMIT_BACKEND = "database"
    ratelimit._KEYS.clear()
    sponsor = factories.make_sponsor("twins", balance=20_000)
    sides = []
    for name in ("full", "fast"):
        wallet = factories.make_wallet(sponsor, name, balance=5_000)
        sides.append(Side(wallet, *_key(wallet), operator_secret=factories.make_operator_key().secret))
    return sides[0], sides[1]


def _key(wallet: Wallet) -> tuple[str, str]:
    issued = factories.make_key(wallet)
    return issued.secret, issued.key.key_id


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request the fast path's handler took (its query string)."""
    seen: list[str] = []
    original = fastcharge.ChargeHandler.__call__

    def spy(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        seen.append(environ["QUERY_STRING"])
        return original(self, environ, start_response)

    monkeypatch.setattr(fastcharge.ChargeHandler, "__call__", spy)
    return seen


def run(steps: list[Step], full: Side, fast: Side) -> tuple[list[Any], list[Any]]:
    """The scenario through the full path for ``full`` and through the gateway's application for ``fast``."""
    answers: tuple[list[Any], list[Any]] = ([], [])
    for side, app, out in ((full, WSGIHandler(), answers[0]), (fast, Gateway(), answers[1])):
        forget_shared_windows()
        for step in steps:
            if callable(step):
                step(side)
                continue
            query, headers = step
            query = {name: value.format(wallet=side.wallet.wallet_id) for name, value in query.items()}
            headers = {
                name: value.format(secret=side.secret, operator=side.operator_secret) for name, value in headers.items()
            }
            headers.setdefault("HTTP_X_API_KEY", side.secret)
            if headers["HTTP_X_API_KEY"] == "":
                del headers["HTTP_X_API_KEY"]
            out.append(normal(call(app, query, headers), side))
    return answers


def forget_shared_windows() -> None:
    """Empty the rate-limit windows both sides would share (anonymous, the client address): each side's keys
    are its own, so its counts then match the other side's."""
    cache.clear()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM billing_rate_limit_window WHERE bucket NOT LIKE 'key:%%'")


def charge(units: str = "0.5", category: str = "tooling", **extra: str) -> dict[str, str]:
    return {"wallet_id": "{wallet}", "service_category": category, "units": units, **extra}


def assert_same(steps: list[Step], full: Side, fast: Side) -> list[Any]:
    reference, answered = run(steps, full, fast)
    for n, (expected, got) in enumerate(zip(reference, answered, strict=True)):
        assert got == expected, f"request {n}"
    return reference


def test_charges_replays_and_refusals_answer_as_the_full_path(twins: tuple[Side, Side], taken: list[str]) -> None:
    full, fast = twins
    rid = {"HTTP_X_REQUEST_ID": "trace-1"}
    steps: list[Step] = [
        (charge(), {"HTTP_IDEMPOTENCY_KEY": "k-1", **rid}),
        (charge(), {"HTTP_IDEMPOTENCY_KEY": "k-1", **rid}),  # a replay
        (charge("0.7"), {"HTTP_IDEMPOTENCY_KEY": "k-1", **rid}),  # the key with other parameters: 422
        (charge(), {}),  # no idempotency key, a generated request id
        (charge(), {"HTTP_X_REQUEST_ID": "not sane!"}),
        (charge("2", "data"), {"HTTP_ACCEPT": "*/*", **rid}),
        (
            charge("1", "search", request_path="/v1/search", description="weekly report"),
            {"HTTP_ACCEPT": "application/json", **rid},
        ),
        ({"wallet_id": "{wallet}", "service": "storage"}, rid),  # the alias, units defaulted
        (charge(), {"HTTP_X_API_KEY": "", "HTTP_AUTHORIZATION": "Bearer {secret}", **rid}),
        (charge("9000", "compute"), rid),  # above the balance: 402
        ({"wallet_id": "agt_nosuchwalletxxxxxxxxxx"}, rid),  # out of the key's reach: 403
        ({"wallet_id": "agt_nosuchwalletxxxxxxxxxx"}, {"HTTP_X_API_KEY": "{operator}", **rid}),  # operator: 404
        (charge(), {"HTTP_X_API_KEY": "{operator}", **rid}),  # an operator charges the wallet
        (charge("0.00000001", "tooling"), rid),  # zero at 8 places: 422
        (charge("1001", "compute"), {"HTTP_IDEMPOTENCY_KEY": "k-2", **rid}),  # velocity: frozen, 403
        (charge(), rid),  # frozen
    ]
    answers = assert_same(steps, full, fast)
    statuses = [status for status, _, _ in answers]
    assert statuses == [
        "200 OK",
        "200 OK",
        "422 Unprocessable Entity",
        "200 OK",
        "200 OK",
        "200 OK",
        "200 OK",
        "200 OK",
        "200 OK",
        "402 Payment Required",
        "403 Forbidden",
        "404 Not Found",
        "200 OK",
        "422 Unprocessable Entity",
        "403 Forbidden",
        "403 Forbidden",
    ]
    assert ("Idempotent-Replayed", "true") in answers[1][1]
    assert '"error":"wallet_frozen"' in answers[-1][2]
    assert len(taken) == len(steps)  # the fast path answered every one of them itself


def test_a_closed_wallet_and_a_foreign_wallet(twins: tuple[Side, Side], taken: list[str]) -> None:
    full, fast = twins
    foreign = factories.make_wallet(factories.make_sponsor("other", balance=10), "theirs", balance=5)
    steps: list[Step] = [
        ({"wallet_id": foreign.wallet_id}, {}),
        lambda side: Wallet.objects.filter(pk=side.wallet.pk).update(daily_limit=Decimal("0.01")),
        (charge(), {}),  # above the daily limit
        lambda side: services.wallet_freeze(wallet=side.wallet, reason="test"),
        (charge(), {}),
        lambda side: services.wallet_close(wallet=side.wallet),
        (charge(), {}),
    ]
    answers = assert_same(steps, full, fast)
    assert [status for status, _, _ in answers] == ["403 Forbidden"] * 4
    assert '"error":"daily_limit_exceeded"' in answers[1][2]
    assert len(taken) == 4


def test_rejected_and_revoked_keys_are_answered_by_drf(twins: tuple[Side, Side], taken: list[str]) -> None:
    full, fast = twins
    steps: list[Step] = [
        (charge(), {"HTTP_X_API_KEY": "tg_key_wrong"}),
        (charge(), {"HTTP_X_API_KEY": "", "HTTP_AUTHORIZATION": "Basic abc"}),
        (charge(), {}),  # the key is now known to the process: its next charge is deferred
        lambda side: key_services.api_key_revoke(wallet=side.wallet, key_id=side.key_id),
        (charge(), {}),  # revoked while cached: the statement finds it out, DRF answers 401
    ]
    answers = assert_same(steps, full, fast)
    assert [status for status, _, _ in answers] == [
        "401 Unauthorized",
        "401 Unauthorized",
        "200 OK",
        "401 Unauthorized",
    ]
    assert ("WWW-Authenticate", 'Bearer realm="tollgate"') in answers[0][1]
    assert len(taken) == 4


@pytest.mark.parametrize("backend", ["database", "cache"])
def test_the_rate_limit(twins: tuple[Side, Side], taken: list[str], settings: Any, backend: str) -> None:
    settings.RATE_LIMIT_BACKEND = backend
    settings.RATE_LIMIT_REQUESTS = 3
    full, fast = twins
    answers = assert_same([(charge(), {})] * 5, full, fast)
    assert [status for status, _, _ in answers] == ["200 OK"] * 3 + ["429 Too Many Requests"] * 2
    assert any(name == "Retry-After" for name, _ in answers[-1][1])


def test_what_django_middleware_refuses_or_adds(twins: tuple[Side, Side], taken: list[str], settings: Any) -> None:
    settings.SECURE_HSTS_SECONDS = 3600
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    full, fast = twins
    steps: list[Step] = [
        (charge(), {"HTTP_HOST": "evil.example"}),  # CommonMiddleware: DisallowedHost, common.errors.handler400
        (charge(), {"CONTENT_LENGTH": "5000"}),  # the body limit: 413
        (charge(), {"wsgi.url_scheme": "https"}),  # HSTS on a secure request
    ]
    answers = assert_same(steps, full, fast)
    statuses = [status for status, _, _ in answers]
    assert statuses == ["422 Unprocessable Entity", "413 Request Entity Too Large", "200 OK"]
    assert ("Strict-Transport-Security", "max-age=3600") in answers[2][1]
    settings.SECURE_SSL_REDIRECT = True
    answers = assert_same([(charge(), {})], full, fast)
    assert answers[0][0] == "301 Moved Permanently"


def test_requests_it_does_not_take(twins: tuple[Side, Side], taken: list[str]) -> None:
    full, fast = twins
    steps: list[Step] = [
        (charge(), {"HTTP_ACCEPT": "text/html"}),
        (charge(format="json"), {}),
        (charge("abc"), {}),
        (charge(" 1"), {}),
        ({"units": "1"}, {}),
        (charge(category="teleport"), {}),
        (charge(), {"HTTP_IDEMPOTENCY_KEY": " padded"}),
        (charge(), {"HTTP_X_API_KEY": ""}),  # no credential
        (charge(description="caf\u00e9"), {}),
    ]
    assert_same(steps, full, fast)
    assert taken == []


def test_an_error_inside_the_charge_is_answered_by_drf(
    twins: tuple[Side, Side], taken: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error the charge does not expect is DRF's 500 in the section 8 shape, on both paths."""
    from billing import views

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(views.services, "wallet_charge", broken)
    full, fast = twins
    answers = assert_same([(charge(), {})], full, fast)
    assert answers[0][0] == "500 Internal Server Error"
    assert '"error":"internal_error"' in answers[0][2]
    assert len(taken) == 1


def test_plain_charges_do_not_reach_drf(twins: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("ChargeView ran")

    monkeypatch.setattr(ChargeView, "post", refuse)
    _, fast = twins
    answer = call(Gateway(), {**charge(), "wallet_id": fast.wallet.wallet_id}, {"HTTP_X_API_KEY": fast.secret})
    assert answer.status == "200 OK"


def test_the_fast_path_is_off_when_the_middleware_or_the_route_is_not_the_known_one(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert fastcharge.charge_handler() is not None
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    assert fastcharge.charge_handler() is None
    assert Gateway().charge is None
    settings.MIDDLEWARE = settings.MIDDLEWARE[:-1]
    monkeypatch.setattr(fastcharge, "CHARGE_PATH", "/v1/billing/pricing")
    assert fastcharge.charge_handler() is None


@settings(max_examples=300, deadline=None)
@given(query=QUERY, accept=st.sampled_from([None, "*/*", "application/json", "text/html"]))
def test_plain_request_reads_the_query_as_chargeview(query: dict[str, str], accept: str | None) -> None:
    """Whatever ``plain_request`` takes, ChargeView reads the same parameters from the same request."""
    path = "/v1/billing/charge?" + urlencode(query)
    headers = {"HTTP_X_API_KEY": "tg_key_x", **({"HTTP_ACCEPT": accept} if accept is not None else {})}
    django_request = APIRequestFactory().post(path, **headers)
    params = fastcharge.plain_request(django_request.META)
    if params is None:
        return
    assert accept in (None, "*/*", "application/json")
    assert params.pop("idempotency_key") is None
    try:
        reference = charge_query(Request(django_request))
    except RequestValidationError as exc:  # pragma: no cover - a failure shows the difference
        raise AssertionError(f"the fast path took a query ChargeQuery refuses: {exc.errors}") from exc
    assert params == reference
    assert str(params["units"]) == str(reference["units"])


@pytest.mark.parametrize(
    ("query", "taken"),
    [
        ("wallet_id=agt_first&wallet_id=agt_second&units=1", True),
        ("wallet_id=agt_x&units=1&units=2&service=data&service_category=data", True),
        ("wallet_id=agt_x&description=a%20b&request_path=%2Fp", True),
        ("wallet_id=agt_x&&units=1&", True),
        ("wallet_id=agt_x&units=", False),  # ChargeQuery's 422
        ("wallet_id=agt_x&service=data&service_category=search", False),
    ],
)
def test_repeated_and_encoded_parameters_read_as_chargeview(query: str, taken: bool) -> None:
    """Each name's last value, percent-decoding, empty pairs: what the fast path takes, ChargeView reads alike."""
    django_request = APIRequestFactory().post("/v1/billing/charge?" + query, HTTP_X_API_KEY="tg_key_x")
    params = fastcharge.plain_request(django_request.META)
    assert (params is not None) == taken
    if params is not None:
        assert params.pop("idempotency_key") is None
        assert params == charge_query(Request(django_request))
