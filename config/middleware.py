"""Request correlation: every request gets a ``request_id``.

An incoming ``X-Request-Id`` is kept when it is sane (1-128 characters of
``[A-Za-z0-9._:-]``); otherwise one is generated. It is returned in the
``X-Request-Id`` response header and recorded on the request's audit events.
"""

from __future__ import annotations

import contextvars
import re
import secrets
from collections.abc import Callable

from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.messages.storage import default_storage
from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject, empty

from common.ids import new_id

_SANE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("current_request_id", default=None)


def get_request_id() -> str | None:
    return current_request_id.get()


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.META.get("HTTP_X_REQUEST_ID", "")  # request.headers would copy every header first
        request_id = incoming if _SANE.match(incoming) else new_id("req")
        request.request_id = request_id  # type: ignore[attr-defined]
        token = current_request_id.set(request_id)
        response: HttpResponse
        try:
            if "\x00" in request.path:
                # No stored id can contain NUL (PostgreSQL text cannot hold it): nothing is there.
                from common.errors import NotFound, json_error

                response = json_error(request, NotFound())
            else:
                response = self.get_response(request)
        finally:
            current_request_id.reset(token)
        response["X-Request-Id"] = request_id
        return response


# Every HTML page (console, approvals, card, dashboard, docs): no inline script runs unless it
# carries this request's nonce; the page is never framed; nothing is fetched from elsewhere.
CSP = (
    "default-src 'self'; script-src 'self' 'nonce-{nonce}'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'self'; form-action 'self'; object-src 'none'"
)


class SecurityHeadersMiddleware:
    """Content-Security-Policy with a per-request script nonce on HTML responses.

    ``request.csp_nonce`` (and ``{{ csp_nonce }}`` in templates, through
    ``config.middleware.csp_nonce``) marks the few inline scripts that must stay.
    ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY`` and
    ``Referrer-Policy`` come from Django's security and clickjacking middleware.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        nonce = secrets.token_urlsafe(16)
        request.csp_nonce = nonce  # type: ignore[attr-defined]
        response = self.get_response(request)
        if response.get("Content-Type", "").startswith("text/html") and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = CSP.format(nonce=nonce)
        return response


def csp_nonce(request: HttpRequest) -> dict[str, str]:
    """Template context: ``csp_nonce`` for an inline ``<script nonce="...">``."""
    return {"csp_nonce": getattr(request, "csp_nonce", "")}


class LazyMessageMiddleware(MessageMiddleware):
    """Django's message middleware, making the message storage only for requests that use it.

    Messages are for people (the console, the approval pages); the API and MCP requests, nearly
    all of the traffic, never read or add one. The storage is made the first time a view or a
    template touches ``request._messages``; a response whose request never did is left alone.
    """

    def process_request(self, request: HttpRequest) -> None:
        request._messages = SimpleLazyObject(lambda: default_storage(request))  # type: ignore[attr-defined]

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        stored = getattr(request, "_messages", None)
        if isinstance(stored, SimpleLazyObject) and stored._wrapped is empty:
            return response
        return super().process_response(request, response)
