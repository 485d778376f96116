"""Rate limiting (spec, Limits): fixed windows in Django's cache.

* 120 requests per 60 s per API key, and as many per wallet line: a wallet key's request charges
  its key's bucket and its wallet line's (the key's wallet, or for a child wallet its agent parent;
  ``wallet_line_bucket``) and is refused when either is over, so an agent minting keys for itself
  or for child wallets does not multiply its limit (docs/decisions.md, "Rate limits count per
  wallet line");
* one shared bucket for all other requests without credentials, but public key material and
  public catalogues (``PUBLIC_PATHS``) and readiness (``PROBE_PATHS``) are charged to a bucket of
  the client address, so one anonymous client cannot lock everyone out of them; the public
  documents' GET answers carry a strong ``ETag`` and ``Cache-Control: public`` and answer
  ``If-None-Match`` with 304 (``public_cacheable``);
* a bucket of its own for a ``/metrics`` scrape with ``METRICS_SCRAPE_TOKEN``
  (marked by ``metrics.middleware``), so anonymous traffic cannot lock the
  scraper out;
* requests with rejected credentials are charged 10 units each to a bucket of
  the client address, so a client guessing keys is stopped after 12 attempts
  a window whatever keys it tries;
* no burst allowance.

Windows are counted where every gunicorn worker and every instance looks
already: by default an UNLOGGED PostgreSQL table (``billing_rate_limit_window``,
one upsert per request, in autocommit, outside any transaction), so the limits
hold across processes with no extra service. With ``CACHE_URL`` pointing at
Redis the windows live there instead (``RATE_LIMIT_BACKEND=cache``), the faster
option for large deployments. A per-process memory cache is never the limiter
outside tests. Old windows are deleted now and then by the requests themselves.

Every counted response carries ``X-RateLimit-Limit``,
``X-RateLimit-Remaining`` and ``X-RateLimit-Reset`` (seconds until the window
resets); a refusal is 429 with ``Retry-After``.

Rejected credentials that the limiter lets through are written to the audit
log; refusals by the limiter itself are only counted, so a flood of bad keys
cannot flood the database.

A governed ``tools/call`` (``POST /mcp`` in the stateless era, ``Mcp-Method:
tools/call``) or a ``POST /v1/billing/charge`` whose key this process has
authenticated before is not charged here: the key comes from the process's
cache, and the charge is deferred to the statement that does the work
(``gateway_claim``, ``billing_charge``), which checks the key (active, same
secret) and charges its window, refusing over the limit. Any other
outcome of such a request is charged before it writes anything
(``DeferredCharge.settle``), or, for an answer that wrote nothing, after the
view, when the answer is replaced by the 429 (or the 401 of a key revoked
meanwhile) it would have had. Every request is charged exactly once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.utils.cache import get_conditional_response

from access.authentication import credential_from_headers, resolve_credential
from access.keys import hash_secret
from access.selectors import api_key_authenticate_charging
from audit.services import audit_record
from common import metrics
from common.errors import InvalidAPIKey, RateLimited, json_error
from common.records import record_json

if TYPE_CHECKING:
    from access.models import APIKey

logger = logging.getLogger("tollgate.ratelimit")

# Human pages (session login) and the liveness probe are not metered by API key.
EXEMPT_EXACT = {"/health"}
EXEMPT_PREFIXES = ("/static/", "/admin/", "/approvals/")

# Counters for /metrics (per process).
REFUSALS = {"key": 0, "anonymous": 0, "public": 0, "rejected_credentials": 0, "scrape": 0}

# Public key material and public catalogues: without credentials, charged to a bucket of the client
# address instead of the shared anonymous one (``tollgate-verify --issuer`` fetches the JWKS and the
# signing keys; agents read the manifests before they hold a key), and cacheable (``public_cacheable``).
PUBLIC_PATHS = frozenset(
    {
        "/.well-known/jwks.json",
        "/v1/signing-keys/active",
        "/mcp/public",
        "/mcp/tools.json",
        "/.well-known/mcp/tools.json",
        "/.well-known/agent.json",
        "/llms.txt",
        "/llm.txt",
        "/.well-known/tlog-keys",
    }
)
# The transparency logs (tlog.views): checkpoints, proofs and tiles, read without credentials.
PUBLIC_PREFIXES = ("/v1/signing-keys/", "/tlog/")
# Readiness (an orchestrator's probe, anonymous): charged to a bucket of the caller's address like the
# public documents, so that no client can fill the shared anonymous bucket and make every instance
# answer its orchestrator 429, i.e. not ready; never made cacheable (docs/decisions.md, "Rate-limit
# exemptions"). Its cost per call is bounded (publicsite.health: the upstreams at most once per interval).
PROBE_PATHS = frozenset({"/health/ready"})
# How long a client or a shared cache may keep a public document (the JWKS keeps a retired key
# published, so a verifier holding a stale copy for this long still finds the keys it needs).
PUBLIC_MAX_AGE_SECONDS = 300


def _client_address(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def wallet_line_bucket(key: APIKey) -> str | None:
    """The rate-limit bucket of a wallet key's line, ``wallet:<id>`` (None for an operator key).

    The line is the key's wallet, or for a child wallet its agent parent (``Wallet.line_id``):
    every key of an agent and of its child wallets shares one allowance. The same rule as
    ``billing_rate_limit_key_charge`` (billing/sql), which charges it with the database backend;
    this copy serves the cache backend, which has no SQL.
    """
    wallet = key.wallet
    return None if wallet is None else f"wallet:{wallet.line_id}"


_UPSERT = (
    "INSERT INTO billing_rate_limit_window (bucket, window_index, count) VALUES (%s, %s, %s) "
    "ON CONFLICT (bucket, window_index) DO UPDATE SET count = billing_rate_limit_window.count + EXCLUDED.count "
    "RETURNING count"
)
_PRUNE = "DELETE FROM billing_rate_limit_window WHERE window_index < %s"
PRUNE_EVERY = 500  # requests per process between deletions of finished windows (on average)


def bucket_charge(bucket: str, cost: int, window: int, *, now: float | None = None) -> tuple[int, int]:
    """Add ``cost`` to ``bucket`` in the current fixed window of ``window`` seconds.

    Returns (the window's count after this charge, seconds until the window resets).
    Shared by every process (see the module docstring). Used for API keys, the
    anonymous bucket, rejected credentials and failed console/approval logins.
    """
    now = time.time() if now is None else now
    window_index = int(now // window)
    reset = _reset(window_index, window, now)
    if settings.RATE_LIMIT_BACKEND == "database":
        return _database_charge(bucket, cost, window_index), reset
    return _cache_charge(bucket, cost, window, window_index), reset


def _database_charge(bucket: str, cost: int, window_index: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT, [bucket[:200], window_index, cost])
        count = int(cursor.fetchone()[0])
    _prune_now_and_then(window_index)
    return count


def _reset(window_index: int, window: int, now: float) -> int:
    """Whole seconds (at least 1) from ``now`` until window ``window_index`` of ``window`` seconds ends."""
    return max(1, math.ceil((window_index + 1) * window - now))


def _prune_now_and_then(window_index: int) -> None:
    """Delete the finished windows once in ``PRUNE_EVERY`` calls (on average)."""
    if random.randrange(PRUNE_EVERY) == 0:
        with connection.cursor() as cursor:
            cursor.execute(_PRUNE, [window_index - 1])


def _cache_charge(bucket: str, cost: int, window: int, window_index: int) -> int:
    key = f"tollgate:rl:{bucket}:{window_index}"
    for _ in range(3):
        cache.add(key, 0, timeout=window + 5)
        try:
            return int(cache.incr(key, cost))
        except ValueError:  # expired between add and incr
            continue
    cache.set(key, cost, timeout=window + 5)
    return cost


def charge_request(request: HttpRequest) -> tuple[str, int, int, int]:
    """Resolve the caller's bucket and charge it. Returns (kind, count, limit, reset).

    With the database backend, a valid key is looked up and its window charged
    in one statement (``api_key_authenticate_charging``); the verdict is left on
    the request as ``resolve_credential`` does, so authentication reuses it.
    """
    if settings.RATE_LIMIT_BACKEND == "database" and getattr(request, "_tollgate_auth", None) is None:
        secret = credential_from_headers(request)
        if secret is not None:
            return _charge_presented_key(request, secret)
    key, error = resolve_credential(request)
    if key is not None:
        window = settings.RATE_LIMIT_WINDOW_SECONDS
        now = time.time()  # one window for both buckets
        count, reset = bucket_charge(f"key:{key.key_id}", 1, window, now=now)
        line = wallet_line_bucket(key)
        if line is not None:  # the database backend does both in billing_rate_limit_key_charge (billing/sql)
            count = max(count, bucket_charge(line, 1, window, now=now)[0])
        return "key", count, settings.RATE_LIMIT_REQUESTS, reset
    if error is not None:
        kind = "rejected_credentials"
        bucket = f"client:{_client_address(request)}"
        cost = settings.RATE_LIMIT_REJECTED_MULTIPLIER
    elif getattr(request, "_tollgate_scrape", False):  # the scrape token, checked by metrics.middleware
        kind, bucket, cost = "scrape", "scrape", 1
    elif request.path in PUBLIC_PATHS or request.path.startswith(PUBLIC_PREFIXES) or request.path in PROBE_PATHS:
        kind, bucket, cost = "public", f"public:{_client_address(request)}", 1
    else:
        kind, bucket, cost = "anonymous", "anonymous", 1
    count, reset = bucket_charge(bucket, cost, settings.RATE_LIMIT_WINDOW_SECONDS)
    return kind, count, settings.RATE_LIMIT_REQUESTS, reset


def _charge_presented_key(request: HttpRequest, secret: str) -> tuple[str, int, int, int]:
    window = settings.RATE_LIMIT_WINDOW_SECONDS
    now = time.time()
    window_index = int(now // window)
    digest = hash_secret(secret)
    try:
        key, count = api_key_authenticate_charging(secret=secret, window_index=window_index)
    except InvalidAPIKey as exc:
        _KEYS.pop(digest, None)
        request._tollgate_auth = (None, exc)  # type: ignore[attr-defined]
        cost = settings.RATE_LIMIT_REJECTED_MULTIPLIER
        count, reset = bucket_charge(f"client:{_client_address(request)}", cost, window, now=now)
        return "rejected_credentials", count, settings.RATE_LIMIT_REQUESTS, reset
    request._tollgate_auth = (key, None)  # type: ignore[attr-defined]
    _remember_key(digest, key)
    _prune_now_and_then(window_index)
    return "key", count, settings.RATE_LIMIT_REQUESTS, _reset(window_index, window, now)


# Keys this process authenticated, by the SHA-256 of the secret (never the secret): wallet keys only.
_KEYS: dict[str, APIKey] = {}
KEY_CACHE_LIMIT = 10_000
# The requests the charge may be deferred for: the governed call (mcpgateway.transports: the stateless
# era's POST /mcp with Mcp-Method: tools/call) and the charge endpoint, whose statements carry it.
_DEFERRABLE_PATH, _DEFERRABLE_VERSION, _DEFERRABLE_METHOD = "/mcp", "2026-07-28", "tools/call"
_DEFERRABLE_CHARGE = "/v1/billing/charge"


def _remember_key(digest: str, key: APIKey) -> None:
    if key.wallet_id is None:
        return
    if len(_KEYS) >= KEY_CACHE_LIMIT:
        _KEYS.clear()
    _KEYS[digest] = key


class DeferredRefused(Exception):  # a signal to the middleware, not an error answered as such
    """The deferred charge settled into a refusal (over the limit, or the key no longer valid):
    the request stops, and the middleware answers it as a request charged at its start would be."""


class DeferredCharge:
    """The rate-limit charge of one request, deferred to the statement that does its work (see the
    module docstring).

    ``key`` is the process's cached key for the presented secret; ``digest`` its SHA-256. That
    statement (``gateway_claim``, ``billing_charge``) takes ``claim_params()`` and its caller
    reports the window's count with ``claimed``; everything else calls ``settle`` (idempotent)
    before it writes.
    """

    def __init__(self, request: HttpRequest, secret: str, digest: str, key: APIKey) -> None:
        self.request, self._secret, self.digest, self.key = request, secret, digest, key
        self.now = time.time()
        self.window_index = int(self.now // settings.RATE_LIMIT_WINDOW_SECONDS)
        self.outcome: tuple[str, int, int, int] | None = None

    @property
    def settled(self) -> bool:
        return self.outcome is not None

    def claim_params(self) -> list[Any]:
        """The k_ arguments of ``gateway_claim`` and ``billing_charge``: the key, the digest, the window, the limit."""
        return [self.key.key_id, self.digest, self.window_index, settings.RATE_LIMIT_REQUESTS]

    def claim_record(self) -> str:
        """The deferred charge as ``gateway_claim``'s ``p_rate`` record (JSON text: key_id, secret_hash,
        window_index, limit). The one constructor of the shape."""
        key_id, digest, window_index, limit = self.claim_params()
        return record_json({"key_id": key_id, "secret_hash": digest, "window_index": window_index, "limit": limit})

    def claimed(self, count: int) -> None:
        """The statement checked the key and charged its window: ``count`` after the charge."""
        reset = _reset(self.window_index, settings.RATE_LIMIT_WINDOW_SECONDS, self.now)
        self.outcome = ("key", count, settings.RATE_LIMIT_REQUESTS, reset)
        _prune_now_and_then(self.window_index)

    def settle(self) -> tuple[str, int, int, int]:
        """Charge the request as the middleware does at a request's start (once): the key read afresh."""
        if self.outcome is None:
            self.outcome = _charge_presented_key(self.request, self._secret)
        return self.outcome

    def fresh_key(self) -> APIKey:
        """Settle; the key read afresh, or ``DeferredRefused`` when the request is to be refused."""
        kind, count, limit, _ = self.settle()
        key, _error = resolve_credential(self.request)
        if kind != "key" or count > limit or key is None:
            raise DeferredRefused()
        return key


def _deferred(request: HttpRequest) -> DeferredCharge | None:
    """A ``DeferredCharge`` when ``request`` is a governed call or a charge whose key this process knows."""
    if not _KEYS or request.method != "POST" or settings.RATE_LIMIT_BACKEND != "database":
        return None
    if request.path != _DEFERRABLE_CHARGE and (
        request.path != _DEFERRABLE_PATH
        or request.headers.get("Mcp-Method") != _DEFERRABLE_METHOD
        or request.headers.get("MCP-Protocol-Version") != _DEFERRABLE_VERSION
    ):
        return None
    secret = credential_from_headers(request)
    if secret is None:
        return None
    digest = hash_secret(secret)
    key = _KEYS.get(digest)
    if key is None:
        return None
    return DeferredCharge(request, secret, digest, key)


def public_cacheable(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """A public document's 200 to a GET made cacheable: a strong ``ETag`` (the SHA-256 of the body) and
    ``Cache-Control: public, max-age=...`` (``private`` when the request presented a credential: a
    deployment may require a key for the tool catalogue, and a shared cache must not serve it on);
    an ``If-None-Match`` that names the body's tag is answered 304 with no body. Anything else
    (another path, another method such as ``POST /mcp/public``, another status) passes unchanged.
    """
    path = request.path
    if (
        request.method not in ("GET", "HEAD")
        or response.status_code != 200
        or response.streaming
        or path == "/mcp/public"
        or not (path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES))
    ):
        return response
    etag = f'"{hashlib.sha256(response.content).hexdigest()}"'
    response["ETag"] = etag
    scope = "private" if credential_from_headers(request) is not None else "public"
    if not response.has_header("Cache-Control") or scope == "private":  # a view may say how long (tlog's tiles)
        response["Cache-Control"] = f"{scope}, max-age={PUBLIC_MAX_AGE_SECONDS}"
    conditional = get_conditional_response(request, etag=etag, response=response)
    return response if conditional is None else conditional


class RateLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if path in EXEMPT_EXACT or path.startswith(EXEMPT_PREFIXES):
            return self.get_response(request)
        deferred = _deferred(request)
        if deferred is not None:
            return self._deferred_call(request, deferred)
        kind, count, limit, reset = charge_request(request)
        if count > limit:
            response: HttpResponse = self._refusal(request, kind, limit, reset)
        else:
            if kind == "rejected_credentials":
                self._audit_rejection(request)
            response = public_cacheable(request, self.get_response(request))
        return self._with_headers(response, count, limit, reset)

    def _deferred_call(self, request: HttpRequest, deferred: DeferredCharge) -> HttpResponse:
        """A request charged by the statement that does its work (a claim, a charge). Whatever else it did
        wrote nothing before ``settle``, so an answer the settled charge refuses is replaced by the refusal."""
        request._tollgate_auth = (deferred.key, None)  # type: ignore[attr-defined]
        request._tollgate_rate = deferred  # type: ignore[attr-defined]
        response = self.get_response(request)
        kind, count, limit, reset = deferred.settle()
        if count > limit:
            response = self._refusal(request, kind, limit, reset)
        elif kind == "rejected_credentials":  # the cached key was revoked before the request was charged
            self._audit_rejection(request)
            response = self.get_response(request)  # answered as the credential now reads (401)
        request._tollgate_rate = None  # type: ignore[attr-defined]  # no request <-> charge cycle for the collector
        return self._with_headers(response, count, limit, reset)

    @staticmethod
    def _refusal(request: HttpRequest, kind: str, limit: int, reset: int) -> HttpResponse:
        REFUSALS[kind] += 1
        metrics.count_refusal(kind)
        response = json_error(
            request,
            RateLimited(
                f"Rate limit of {limit} requests per {settings.RATE_LIMIT_WINDOW_SECONDS} s exceeded.",
                retry_after_seconds=reset,
            ),
        )
        response["Retry-After"] = str(reset)
        return response

    @staticmethod
    def _with_headers(response: HttpResponse, count: int, limit: int, reset: int) -> HttpResponse:
        remaining = max(0, limit - count)
        response["X-RateLimit-Limit"] = str(limit)
        response["X-RateLimit-Remaining"] = str(remaining)
        response["X-RateLimit-Reset"] = str(reset)
        return response

    @staticmethod
    def _audit_rejection(request: HttpRequest) -> None:
        _, error = resolve_credential(request)
        try:
            audit_record(
                event="auth.credential_rejected",
                ok=False,
                key_id=getattr(error, "extra", {}).get("key_id"),
                endpoint=request.path[:300],
                detail={"client": _client_address(request), "reason": str(error)},
            )
        except Exception:  # the refusal itself must still be answered
            logger.exception("could not audit a rejected credential")
