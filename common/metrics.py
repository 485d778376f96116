"""Operational counters for ``GET /metrics``, kept the Prometheus way (``prometheus-client``).

Every app may count here (the rate limiter its refusals, the gateway its upstream
latency, ``metrics.middleware`` every response); the ``metrics`` app, on the top
floor, serves the scrape. This module imports no app, so any app may import it.

Two sources feed the exposition (see ``metrics.views``):

* Business totals (governed actions by outcome, credits debited and refunded,
  swept actions, audit appends) are read from PostgreSQL at scrape time. They
  are exact whichever process answers the scrape, and need nothing here.
* What only a process sees (requests by route and status, upstream latency,
  rate-limit refusals) is counted in memory by ``prometheus-client``: an
  increment is a few hundred nanoseconds and touches no cache or database.

Under gunicorn (``config/gunicorn.py``) the client runs in its multiprocess
mode: every worker writes its counters to memory-mapped files in
``PROMETHEUS_MULTIPROC_DIR`` (one directory per gunicorn instance, emptied when
the instance starts), and a scrape, whichever worker answers it, sums the files
of every worker, live or exited. Prometheus itself aggregates across instances
(one scrape target per instance), the ecosystem's convention. Without that
directory (``manage.py runserver``, tests) the counters are those of the one
process. ``tollgate_metrics_store_info`` says which mode answered.
"""

from __future__ import annotations

import os

from django.conf import settings
from django.http import HttpRequest
from django.urls import Resolver404, resolve
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client import multiprocess as _multiprocess

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Upstream latency buckets in seconds: the gateway's own overhead sits in the first ones, the
# upstream read timeout (15 s by default) and the total timeout (twice that) in the last ones.
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0)
REFUSAL_KINDS = ("key", "anonymous", "public", "rejected_credentials", "scrape")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

disable_created_metrics()  # no ``_created`` series: nothing here reads them

# The process's own registry (the default one would add process and platform collectors that
# mean nothing summed over workers). In multiprocess mode the values live in the mmap files.
REGISTRY = CollectorRegistry(auto_describe=True)
HTTP_REQUESTS = Counter(
    "tollgate_http_requests",
    "HTTP responses by method, URL pattern and status (all workers of this instance).",
    ("method", "route", "status"),
    registry=REGISTRY,
)
UPSTREAM_LATENCY = Histogram(
    "tollgate_upstream_latency_seconds",
    "Upstream tools/call latency in seconds, by upstream server (slug) and result kind (all workers of this instance).",
    ("server", "kind"),
    buckets=UPSTREAM_BUCKETS,
    registry=REGISTRY,
)
# The result kinds of an upstream tools/call that are the upstream's (or the way to it's) failure:
# everything but an answer (``success``) and the tool's own error (``tool_error``, a normal answer).
UPSTREAM_ERROR_CLASSES = ("not_sent", "http_error", "jsonrpc_error", "invalid_response", "uncertain")
UPSTREAM_ERRORS = Counter(
    "tollgate_upstream_errors",
    "Upstream tools/call failures by upstream server (slug) and class (all workers of this instance).",
    ("server", "class"),
    registry=REGISTRY,
)
# Only with METRICS_TOOL_LABELS: one series per tool (docs/decisions.md, "Metrics and traces").
UPSTREAM_TOOL_CALLS = Counter(
    "tollgate_upstream_tool_calls",
    "Upstream tools/call by server, tool and result kind; only with METRICS_TOOL_LABELS (all workers of this "
    "instance).",
    ("server", "tool", "kind"),
    registry=REGISTRY,
)
RATE_LIMIT_REFUSALS = Counter(
    "tollgate_rate_limit_refusals",
    "Requests refused with 429 by the rate limiter, by bucket kind (all workers of this instance).",
    ("kind",),
    registry=REGISTRY,
)
for _kind in REFUSAL_KINDS:  # every kind is exposed, at 0 until it happens
    RATE_LIMIT_REFUSALS.labels(kind=_kind)


def multiprocess_dir() -> str:
    """The directory of the multiprocess mode, or "" when the counters are this process's alone."""
    return os.environ.get(MULTIPROC_ENV, "")


def observe_upstream(seconds: float, *, kind: str, server: str, tool: str = "") -> None:
    """Record one upstream ``tools/call`` to ``server`` (its slug; "" for no server record): its latency
    (seconds) and result kind (``CallResult.kind``), a failure by class, and with ``METRICS_TOOL_LABELS``
    the call by ``tool``. The labels are bounded: servers are operator records, kinds a fixed set."""
    UPSTREAM_LATENCY.labels(server=server, kind=kind).observe(max(0.0, seconds))
    if kind in UPSTREAM_ERROR_CLASSES:
        UPSTREAM_ERRORS.labels(server=server, **{"class": kind}).inc()
    if getattr(settings, "METRICS_TOOL_LABELS", False):
        UPSTREAM_TOOL_CALLS.labels(server=server, tool=tool, kind=kind).inc()


def count_refusal(kind: str) -> None:
    """Record one 429 from the rate limiter; ``kind`` is the bucket kind (``key``, ``anonymous``...)."""
    RATE_LIMIT_REFUSALS.labels(kind=kind).inc()


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
    HTTP_REQUESTS.labels(method=str(method), route=route_of(request), status=str(status)).inc()


def exposition() -> str:
    """The process-side families in the text format: summed over every worker in multiprocess mode."""
    directory = multiprocess_dir()
    if directory:
        registry = CollectorRegistry()
        _multiprocess.MultiProcessCollector(registry, path=directory)
        return generate_latest(registry).decode()
    return generate_latest(REGISTRY).decode()
