"""WSGI entry point for gunicorn: Django's handler, with plain charges answered by billing.fastcharge."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import django
from django.core.handlers.wsgi import WSGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

from billing.fastcharge import PARAMS, charge_handler, plain_request  # noqa: E402 - after setup


class Gateway:
    """The WSGI application: a plain ``POST /v1/billing/charge`` to ``billing.fastcharge``, anything else to Django."""

    def __init__(self) -> None:
        self.django = WSGIHandler()
        self.charge = charge_handler()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        params = plain_request(environ) if self.charge is not None else None
        if self.charge is not None and params is not None:
            environ[PARAMS] = params
            return self.charge(environ, start_response)
        return self.django(environ, start_response)


application = Gateway()
