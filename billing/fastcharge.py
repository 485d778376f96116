"""``POST /v1/billing/charge`` without URL resolution, DRF, or the middleware that does nothing for it.

The charge is the gateway's cheapest request and its busiest. Django's full path costs more CPU for
it than the charge itself: thirteen middleware, URL resolution, DRF's request, authentication,
negotiation and rendering (measured in docs/decisions.md, Hot path). ``Gateway`` (the WSGI
application ``config.wsgi`` serves) sends a charge here when ``plain_request`` finds it plain: a
POST to exactly ``CHARGE_PATH``, an ``Accept`` DRF answers with JSON without negotiating (none,
``*/*`` or ``application/json``), no ``format`` parameter, a credential header, a valid or absent
``Idempotency-Key``, and query values ``billing.views.plain_charge_params`` reads without
``ChargeQuery``. Everything else takes the full path unchanged, before anything was charged or
written.

``ChargeHandler`` is Django's own WSGI handler (request, signals, response, the log of 4xx and 5xx)
with the project's middleware minus ``SKIPPED``, the middleware that does nothing for such a
request: static files (the path is not one), sessions, CSRF and the session user (DRF views are
CSRF-exempt, and the charge authenticates by API key only), and messages (made lazily, never
touched by the API). The rest runs as on the full path and in the same order: the request id,
security headers, the body limit, Django's security middleware (HTTPS redirect, HSTS), metrics,
the rate limiter (which defers the key's charge to the statement, as on the full path), the host
check and Content-Length of ``CommonMiddleware``, and ``X-Frame-Options``. In place of URL
resolution and DRF, ``_get_response`` runs ``billing.views.charge`` (the code ``ChargeView``
runs) and writes the answer DRF would: the same JSON bytes (DRF's renderer), status and headers.
A charge that raises is answered by DRF itself (``ChargeView``'s exception handling and
rendering); a request whose credential did not authenticate goes to URL resolution and
``ChargeView``, which answers it. tests/test_fastcharge.py sends the same requests both ways and
compares the answers.

``charge_handler`` returns None, and every request takes the full path, when the project's
middleware is not the known list (an operator added or removed one) or ``CHARGE_PATH`` no longer
resolves to ``ChargeView``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from billing.authentication import credential_from_meta
from billing.ratelimit import DeferredRefused
from billing.selectors import Principal
from billing.views import PLAIN_ACCEPT, ChargeView, charge, plain_charge_params
from common.errors import RequestValidationError
from common.idempotency import validate_idempotency_key

logger = logging.getLogger("tollgate.fastcharge")

CHARGE_PATH = "/v1/billing/charge"
# The WSGI environ key under which ``plain_request``'s parameters reach ``ChargeHandler`` (a server's
# environ has no such key, and a header could only ever arrive as HTTP_...).
PARAMS = "tollgate.charge"
# The middleware that does nothing for a plain charge (module docstring); every other middleware of
# settings.MIDDLEWARE must be one of KEPT, or the fast path is off.
SKIPPED = frozenset(
    {
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "config.middleware.LazyMessageMiddleware",
    }
)
KEPT = frozenset(
    {
        "config.middleware.RequestIdMiddleware",
        "config.middleware.SecurityHeadersMiddleware",
        "common.jsonbody.BodySizeLimitMiddleware",
        "django.middleware.security.SecurityMiddleware",
        "metrics.middleware.MetricsMiddleware",
        "billing.ratelimit.RateLimitMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    }
)


def plain_request(environ: dict[str, Any]) -> dict[str, Any] | None:
    """The charge's parameters (``plain_charge_params``' and ``idempotency_key``) when ``environ`` is a plain
    charge (module docstring), else None. Reads the query as Django's ``QueryDict`` does."""
    if environ.get("PATH_INFO") != CHARGE_PATH or environ.get("REQUEST_METHOD") != "POST":
        return None
    if environ.get("HTTP_ACCEPT") not in PLAIN_ACCEPT or credential_from_meta(environ) is None:
        return None
    try:
        idempotency_key = validate_idempotency_key(environ.get("HTTP_IDEMPOTENCY_KEY"), required=False)
    except RequestValidationError:
        return None
    query = environ.get("QUERY_STRING", "")
    if not query.isascii():  # Django decodes other bytes its own way: let it
        return None
    try:
        pairs = parse_qsl(query, keep_blank_values=True, max_num_fields=settings.DATA_UPLOAD_MAX_NUMBER_FIELDS)
    except ValueError:  # too many fields: Django's 400
        return None
    values = dict(pairs)  # each name's last value, as QueryDict.get
    if api_settings.URL_FORMAT_OVERRIDE in values:
        return None
    params = plain_charge_params(values)
    if params is None:
        return None
    params["idempotency_key"] = idempotency_key
    return params


class _ChargeRaised(ChargeView):
    """``ChargeView`` answering the exception a fast-path charge raised, through DRF as ``ChargeView`` would."""

    def post(self, request: Request) -> Response:
        raise request._request._tollgate_charge_error  # type: ignore[attr-defined]


_ANSWER_RAISED = _ChargeRaised.as_view()


class ChargeHandler(WSGIHandler):
    """Django's WSGI handler for plain charges (module docstring): the kept middleware, then the charge."""

    def load_middleware(self, is_async: bool = False) -> None:
        assert not is_async
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self.route = resolve(CHARGE_PATH)  # what URL resolution gives the request (metrics read its route)
        self.headers = ChargeView().default_response_headers  # DRF's: Allow (and Vary with several renderers)
        handler = convert_exception_to_response(self._get_response)
        for path in reversed(settings.MIDDLEWARE):
            if path in SKIPPED:
                continue
            instance = import_string(path)(handler)
            handler = convert_exception_to_response(instance)
        self._middleware_chain = handler

    def _get_response(self, request: HttpRequest) -> HttpResponseBase:
        request.resolver_match = self.route
        key, _error = getattr(request, "_tollgate_auth", None) or (None, None)
        if key is None:  # not authenticated: ChargeView answers (401), as on the full path
            return super()._get_response(request)  # type: ignore[misc]  # Django's: not in its stubs
        params = request.META[PARAMS]
        try:
            outcome = charge(request, Principal(key), params, params["idempotency_key"])
        except DeferredRefused:
            return HttpResponse(status=429)  # the rate limiter answers it (ChargeView's Response(status=429))
        except Exception as exc:  # any error: answered by DRF, as ChargeView's would be
            request._tollgate_charge_error = exc  # type: ignore[attr-defined]
            answer = _ANSWER_RAISED(request)
            answer.render()
            return answer
        response = HttpResponse(
            JSONRenderer().render(outcome.body), status=outcome.status, content_type=JSONRenderer.media_type
        )
        for name, value in self.headers.items():
            response[name] = value
        if outcome.replayed:
            response["Idempotent-Replayed"] = "true"
        return response


def charge_handler() -> ChargeHandler | None:
    """A ``ChargeHandler``, or None when the fast path cannot answer as the full path (module docstring)."""
    unknown = [path for path in settings.MIDDLEWARE if path not in KEPT | SKIPPED]
    if unknown:
        logger.warning("charge fast path off: middleware it does not know: %s", ", ".join(unknown))
        return None
    try:
        handler: ChargeHandler | None = ChargeHandler()
    except Resolver404:
        handler = None
    if handler is None or getattr(handler.route.func, "view_class", None) is not ChargeView:
        logger.warning("charge fast path off: %s is not served by ChargeView", CHARGE_PATH)
        return None
    return handler


class Gateway:
    """The WSGI application: a plain ``POST /v1/billing/charge`` to ``charge_handler``, anything else to Django.

    Built here, beside the fast path it routes to; ``config.wsgi`` builds it through the
    ``GATEWAY_WSGI_APPLICATION`` setting, so that config imports no app.
    """

    def __init__(self) -> None:
        self.django = WSGIHandler()
        self.charge = charge_handler()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        params = plain_request(environ) if self.charge is not None else None
        if self.charge is not None and params is not None:
            environ[PARAMS] = params
            return self.charge(environ, start_response)
        return self.django(environ, start_response)
