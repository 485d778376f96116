"""The metrics middleware: counts every response, and keeps a scraper's token out of the API-key path.

It sits before the rate limiter (``config/settings.py``), so 429s count too. The
counters are ``common.metrics``'s, where any app may count; the scrape-token rule
is here, and the view (``metrics.views``) checks it too.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from common.metrics import count_request

METRICS_PATH = "/metrics"


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
    ``/metrics`` is resolved as "no API key" and marked as a scrape, so the
    limiter meters it in the scraper's own bucket (not the anonymous one, which
    any client can fill) and the view accepts it on the token. A bearer that is
    not the token is left to the API-key path: a rejected credential, ten units
    of the client's bucket, so the token cannot be guessed faster than a key.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info == METRICS_PATH and scrape_token_matches(request):
            # billing.authentication.resolve_credential's per-request memo: (key, error).
            request._tollgate_auth = (None, None)  # type: ignore[attr-defined]
            # billing.ratelimit's marker for the scraper's bucket (billing may not import this app).
            request._tollgate_scrape = True  # type: ignore[attr-defined]
        response = self.get_response(request)
        count_request(request, response.status_code)
        return response
