"""Operational counters for ``GET /metrics`` that every gateway process shares.

Two sources feed the exposition (see ``config.metrics_views``):

* Business totals (governed actions by outcome, credits debited and refunded,
  swept actions, audit appends) are read from PostgreSQL at scrape time. They
  are exact whichever process answers the scrape, and need nothing here.
* What only a process sees (requests by route and status, upstream latency,
  rate-limit refusals) is counted in this module's store: integer counters in
  Django's cache, incremented with ``cache.incr``. With ``CACHE_URL`` pointing
  at Redis every gunicorn worker and every node adds to the same counters, so
  any worker's scrape reports the whole deployment. With the default local
  memory cache the store is per process: a scrape reports only the worker that
  answered it (``tollgate_metrics_store_info{shared="false"}`` says so). Run
  several workers with Redis when these series matter.

A cache has no way to list its keys, so the store keeps an index: the first
process to create a counter (``cache.add`` succeeds for exactly one) appends its
series to numbered slots. A scrape reads the slots, the series this process has
touched, and then all values in one ``get_many``. Cache eviction or a flush
resets counters, which Prometheus treats as a counter reset.

Counting never fails a request: a cache error is logged (at most once a minute)
and the increment is dropped.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.core.cache import cache, caches
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve

logger = logging.getLogger("tollgate.metrics")

METRICS_PATH = "/metrics"
PREFIX = "tollgate:metrics:v1"
_SLOT_COUNT = f"{PREFIX}:slots"
MAX_SLOTS = 20_000  # far above the label space; a guard against an ever-growing index

# Upstream latency buckets in seconds: the gateway's own overhead sits in the first ones, the
# upstream read timeout (15 s by default) and the total timeout (twice that) in the last ones.
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0)
REFUSAL_KINDS = ("key", "anonymous", "rejected_credentials")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Store families (internal names; the exposition names live in config.metrics_views).
HTTP_REQUESTS = "http_requests"
UPSTREAM_BUCKET = "upstream_bucket"
UPSTREAM_SUM_US = "upstream_sum_us"
RATE_LIMIT_REFUSALS = "rate_limit_refusals"

Labels = tuple[tuple[str, str], ...]

# Series this process has counted: series -> cache key. Bounded by the label space.
_known: dict[str, str] = {}
_warned_at = [0.0]
_warn_lock = threading.Lock()


def _series(family: str, labels: Labels) -> str:
    return json.dumps([family, [list(pair) for pair in labels]], separators=(",", ":"))


def _key(series: str) -> str:
    known = _known.get(series)
    if known is None:
        # Hashed: routes hold characters that some cache backends refuse in keys.
        known = f"{PREFIX}:c:{hashlib.blake2b(series.encode(), digest_size=12).hexdigest()}"
        _known[series] = known
    return known


def _warn(exc: Exception) -> None:
    with _warn_lock:
        now = time.monotonic()
        if now - _warned_at[0] < 60:
            return
        _warned_at[0] = now
    logger.warning("metrics store unavailable, increments dropped: %s", exc)


def _register(series: str) -> None:
    cache.add(_SLOT_COUNT, 0, timeout=None)
    slot = int(cache.incr(_SLOT_COUNT))
    if slot <= MAX_SLOTS:
        cache.set(f"{PREFIX}:slot:{slot}", series, timeout=None)


def add(family: str, labels: Labels, amount: int = 1) -> None:
    """Add ``amount`` to one counter of the store, creating (and indexing) it on first use."""
    series = _series(family, labels)
    key = _key(series)
    try:
        try:
            cache.incr(key, amount)
            return
        except ValueError:  # not there yet (or evicted)
            pass
        if cache.add(key, amount, timeout=None):
            _register(series)
        else:  # another process created it in between
            cache.incr(key, amount)
    except Exception as exc:  # the request must not fail because a counter could not move
        _warn(exc)


def observe_upstream(seconds: float, *, kind: str) -> None:
    """Record one upstream ``tools/call``: its latency (seconds) and result kind (``CallResult.kind``)."""
    seconds = max(0.0, seconds)
    index = bisect.bisect_left(UPSTREAM_BUCKETS, seconds)
    le = _format_le(UPSTREAM_BUCKETS[index]) if index < len(UPSTREAM_BUCKETS) else "+Inf"
    # Buckets are stored one per interval (one increment per call) and made cumulative at scrape time.
    add(UPSTREAM_BUCKET, (("kind", kind), ("le", le)))
    add(UPSTREAM_SUM_US, (("kind", kind),), round(seconds * 1_000_000))


def count_refusal(kind: str) -> None:
    """Record one 429 from the rate limiter; ``kind`` is the bucket kind (``key``, ``anonymous``...)."""
    add(RATE_LIMIT_REFUSALS, (("kind", kind),))


def _format_le(bound: float) -> str:
    return repr(float(bound))


def route_of(request: HttpRequest) -> str:
    """The URL pattern that serves ``request`` (bounded cardinality), never the raw path."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        # Answered before URL resolution (rate limiter, static files) or by no route at all.
        if request.path_info.startswith(str(settings.STATIC_URL)):
            return "static"
        try:
            match = resolve(request.path_info, getattr(request, "urlconf", None))
        except Resolver404:
            return "unmatched"
    return "/" + match.route


def count_request(request: HttpRequest, status: int) -> None:
    method = request.method if request.method in _METHODS else "other"
    add(HTTP_REQUESTS, (("method", str(method)), ("route", route_of(request)), ("status", str(status))))


def scrape_token_matches(request: HttpRequest) -> bool:
    """True when ``Authorization: Bearer <METRICS_SCRAPE_TOKEN>`` is presented (constant-time comparison)."""
    expected = str(getattr(settings, "METRICS_SCRAPE_TOKEN", "") or "")
    header = request.headers.get("Authorization")
    if not expected or header is None:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), expected.encode())


class MetricsMiddleware:
    """Counts every response by method, route and status. Sits before the rate limiter, so 429s count too.

    It also keeps a scraper's token out of the API-key path: the rate limiter
    would otherwise take the token for a rejected API key (charged ten units
    and written to the audit log on every scrape). A matching token on
    ``/metrics`` is resolved as "no API key", so the scrape is metered in the
    anonymous bucket and the view accepts it on the token.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info == METRICS_PATH and scrape_token_matches(request):
            # config.authentication.resolve_credential's per-request memo: (key, error).
            request._tollgate_auth = (None, None)  # type: ignore[attr-defined]
        response = self.get_response(request)
        count_request(request, response.status_code)
        return response


# --- Reading the store (the scrape) --------------------------------------------------------------


@dataclass
class StoreSnapshot:
    """The store's counters at scrape time, by family: labels -> value."""

    families: dict[str, dict[Labels, int]] = field(default_factory=dict)
    available: bool = True

    def family(self, name: str) -> dict[Labels, int]:
        return self.families.get(name, {})


def _parse(series: str) -> tuple[str, Labels] | None:
    try:
        family, pairs = json.loads(series)
        return str(family), tuple((str(k), str(v)) for k, v in pairs)
    except (TypeError, ValueError):
        return None


def snapshot() -> StoreSnapshot:
    """Every counter of the store (all processes when the cache is shared)."""
    out = StoreSnapshot()
    try:
        count = min(int(cache.get(_SLOT_COUNT) or 0), MAX_SLOTS)
        indexed: Iterable[object] = cache.get_many([f"{PREFIX}:slot:{i}" for i in range(1, count + 1)]).values()
        names = {s for s in indexed if isinstance(s, str)} | set(_known)
        keys = {name: _key(name) for name in names}
        values = cache.get_many(list(keys.values()))
    except Exception as exc:
        _warn(exc)
        out.available = False
        return out
    for name, key in keys.items():
        value = values.get(key)
        parsed = _parse(name)
        if value is None or parsed is None:
            continue
        family, labels = parsed
        out.families.setdefault(family, {})[labels] = int(value)
    return out


def store_backend() -> tuple[str, bool]:
    """(backend class name, whether every process shares it)."""
    backend = type(caches["default"]).__name__
    return backend, backend not in {"LocMemCache", "DummyCache"}
