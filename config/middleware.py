"""Request correlation: every request gets a ``request_id``.

An incoming ``X-Request-Id`` is kept when it is sane (1-128 characters of
``[A-Za-z0-9._:-]``); otherwise one is generated. It is returned in the
``X-Request-Id`` response header and recorded on the request's audit events.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from config.ids import new_id

_SANE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("current_request_id", default=None)


def get_request_id() -> str | None:
    return current_request_id.get()


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-Id", "")
        request_id = incoming if _SANE.match(incoming) else new_id("req")
        request.request_id = request_id  # type: ignore[attr-defined]
        token = current_request_id.set(request_id)
        response: HttpResponse
        try:
            if "\x00" in request.path:
                # No stored id can contain NUL (PostgreSQL text cannot hold it): nothing is there.
                from config.errors import NotFound, json_error

                response = json_error(request, NotFound())
            else:
                response = self.get_response(request)
        finally:
            current_request_id.reset(token)
        response["X-Request-Id"] = request_id
        return response
