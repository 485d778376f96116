"""Rate limiting (spec, Limits): fixed windows in Django's cache.

* 120 requests per 60 s per API key;
* one shared bucket for all requests without credentials;
* requests with rejected credentials are charged 10 units each to a bucket of
  the client address, so a client guessing keys is stopped after 12 attempts
  a window whatever keys it tries;
* no burst allowance.

The cache is local memory by default (one process) and Redis through
``CACHE_URL`` when several processes or machines serve the gateway, which then
share the windows. Every counted response carries ``X-RateLimit-Limit``,
``X-RateLimit-Remaining`` and ``X-RateLimit-Reset`` (seconds until the window
resets); a refusal is 429 with ``Retry-After``.

Rejected credentials that the limiter lets through are written to the audit
log; refusals by the limiter itself are only counted, so a flood of bad keys
cannot flood the database.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse

from config import metrics
from config.authentication import resolve_credential
from config.errors import RateLimited, json_error

logger = logging.getLogger("tollgate.ratelimit")

# Human pages (session login) and the liveness probe are not metered by API key.
EXEMPT_EXACT = {"/health"}
EXEMPT_PREFIXES = ("/static/", "/admin/", "/approvals/")

# Counters for /metrics (per process).
REFUSALS = {"key": 0, "anonymous": 0, "rejected_credentials": 0}


def _client_address(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def _charge(bucket: str, cost: int, window: int, now: float) -> tuple[int, int]:
    """Add ``cost`` to ``bucket`` in the current fixed window. Returns (count, seconds to reset)."""
    window_index = int(now // window)
    reset = max(1, math.ceil((window_index + 1) * window - now))
    key = f"tollgate:rl:{bucket}:{window_index}"
    for _ in range(3):
        cache.add(key, 0, timeout=window + 5)
        try:
            return int(cache.incr(key, cost)), reset
        except ValueError:  # expired between add and incr
            continue
    cache.set(key, cost, timeout=window + 5)
    return cost, reset


def charge_request(request: HttpRequest) -> tuple[str, int, int, int]:
    """Resolve the caller's bucket and charge it. Returns (kind, count, limit, reset)."""
    key, error = resolve_credential(request)
    if key is not None:
        kind, bucket, cost = "key", f"key:{key.key_id}", 1
    elif error is not None:
        kind = "rejected_credentials"
        bucket = f"client:{_client_address(request)}"
        cost = settings.RATE_LIMIT_REJECTED_MULTIPLIER
    else:
        kind, bucket, cost = "anonymous", "anonymous", 1
    count, reset = _charge(bucket, cost, settings.RATE_LIMIT_WINDOW_SECONDS, time.time())
    return kind, count, settings.RATE_LIMIT_REQUESTS, reset


class RateLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if path in EXEMPT_EXACT or path.startswith(EXEMPT_PREFIXES):
            return self.get_response(request)
        kind, count, limit, reset = charge_request(request)
        remaining = max(0, limit - count)
        if count > limit:
            REFUSALS[kind] += 1
            metrics.count_refusal(kind)
            response: HttpResponse = json_error(
                request,
                RateLimited(
                    f"Rate limit of {limit} requests per {settings.RATE_LIMIT_WINDOW_SECONDS} s exceeded.",
                    retry_after_seconds=reset,
                ),
            )
            response["Retry-After"] = str(reset)
        else:
            if kind == "rejected_credentials":
                self._audit_rejection(request)
            response = self.get_response(request)
        response["X-RateLimit-Limit"] = str(limit)
        response["X-RateLimit-Remaining"] = str(remaining)
        response["X-RateLimit-Reset"] = str(reset)
        return response

    @staticmethod
    def _audit_rejection(request: HttpRequest) -> None:
        from audit.services import audit_record

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
