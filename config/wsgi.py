"""WSGI entry point for gunicorn: the application named by ``GATEWAY_WSGI_APPLICATION``.

That is ``billing.fastcharge.Gateway``: Django's handler, with plain charges answered by billing's
fast path. Named by a setting so that config imports no app (docs/decisions.md, Foundation).
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402 - after setup
from django.utils.module_loading import import_string  # noqa: E402

from common.tracing import tracing_setup  # noqa: E402 - after setup

tracing_setup()  # once per process: a no-op under gunicorn, whose post_fork did it (config/gunicorn.py)
application = import_string(settings.GATEWAY_WSGI_APPLICATION)()
