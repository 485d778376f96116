"""OpenTelemetry traces of the governed call (docs/decisions.md, "Metrics and traces").

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. Off costs nothing measurable: ``ENABLED`` is
False, no SDK is imported, no tracer provider exists, and every hook below returns a shared
no-op before building a name or an attribute. The callers test ``ENABLED`` (a module attribute)
where a hook would otherwise take arguments that cost something to build.

On, ``tracing_setup`` builds once per process (gunicorn's ``post_fork``, ``config/gunicorn.py``;
``config/wsgi.py`` for any other WSGI server) a tracer provider of the gateway's own (the
global one is left alone) with one ``BatchSpanProcessor`` exporting over OTLP/HTTP protobuf to
``$OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces``; the exporter's other ``OTEL_EXPORTER_OTLP_*``
variables (headers, timeout, compression) apply as the SDK documents them.

The spans follow the MCP and GenAI semantic conventions: the agent's ``tools/call`` is a SERVER
span ``tools/call <tool>`` (continuing the agent's ``traceparent``), its phases are children
(``tollgate.claim``, the upstream request as a CLIENT span ``tools/call <upstream tool>``,
``tollgate.finish``), and the W3C trace context goes to the upstream on the dispatch request,
as the ``traceparent`` header and in ``params._meta`` (where the MCP conventions carry it).
Only the W3C trace context is read and sent: never baggage, credentials, API keys or arguments, and
of the agent's context only its ``traceparent`` (its ``tracestate`` is dropped: docs/decisions.md).

This module imports no app, so any app may import it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from common.errors import ApplicationError, RequestValidationError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
SERVICE_NAME = "tollgate"
INSTRUMENTATION = "tollgate.gateway"

# W3C trace context only (docs/decisions.md): no baggage is read from the agent or passed upstream, and
# of the agent's context only ``traceparent``: its ``tracestate`` is free text of the agent's choosing that
# the dispatch would pass to the upstream as the gateway's own (and that the SDK logs when malformed).
_PROPAGATOR = TraceContextTextMapPropagator()
_CONTEXT_HEADERS = ("traceparent",)

ENABLED = False
"""True once this process exports spans (``tracing_setup``, or ``tracing_use`` in tests)."""

_tracer: trace.Tracer = trace.NoOpTracer()
_provider: TracerProvider | None = None
_setup_pid: int | None = None
_setup_lock = threading.Lock()


# --- Setup ----------------------------------------------------------------------------------------


def tracing_setup() -> bool:
    """Once per process: export spans over OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.

    Idempotent within a process (gunicorn's ``post_fork`` and ``config/wsgi.py`` both call it); a
    forked child sets up its own. Reads the environment only, so it runs before Django is set up.
    Returns whether spans are exported.
    """
    global _setup_pid
    endpoint = os.environ.get(ENDPOINT_ENV, "").strip()
    with _setup_lock:
        if _setup_pid == os.getpid():
            return ENABLED
        _setup_pid = os.getpid()
        if not endpoint:
            _install(None)
            return False
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = _new_provider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")))
        _install(provider)
        return True


def tracing_use(exporter: SpanExporter | None) -> TracerProvider | None:
    """Tests: export every span to ``exporter`` at once (``SimpleSpanProcessor``), or, with None, switch
    tracing off. Replaces whatever ``tracing_setup`` installed (shut down first)."""
    if exporter is None:
        _install(None)
        return None
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = _new_provider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _install(provider)
    return provider


def _new_provider() -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, when set, win over the default name.
    defaults = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
    return TracerProvider(resource=Resource.create(defaults))


def _install(provider: TracerProvider | None) -> None:
    global ENABLED, _tracer, _provider
    previous = _provider
    _provider = provider
    _tracer = provider.get_tracer(INSTRUMENTATION) if provider is not None else trace.NoOpTracer()
    ENABLED = provider is not None
    if previous is not None and previous is not provider:
        previous.shutdown()


# --- Hooks of the governed call -------------------------------------------------------------------

_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


def incoming_context(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The agent's W3C ``traceparent`` to continue (never its ``tracestate``), or None when off."""
    if not ENABLED:
        return None
    found = {name: value for name in _CONTEXT_HEADERS if (value := headers.get(name))}
    return found or None


@contextlib.contextmanager
def call_span(carrier: Mapping[str, str] | None) -> Iterator[Span]:
    """The SERVER span of the agent's ``tools/call``, child of the agent's trace context if any.

    Named ``tools/call`` until the call is answered (``call_outcome`` names the tool): a tool name
    the agent makes up (refused ``unknown_tool``) never becomes a span name or an attribute. Exceptions
    leave through it unrecorded but for their code: an error the gateway answers with (4xx) is not a
    failure of the gateway.
    """
    parent = _PROPAGATOR.extract(dict(carrier)) if carrier else None
    with _tracer.start_as_current_span(
        "tools/call",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool"},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except ApplicationError as exc:  # answered with its code (4xx): the agent's error, not the gateway's
            span.set_attribute("error.type", exc.code)
            raise
        except RequestValidationError as exc:  # 422: the first error's type (a fixed set: unknown_tool...)
            span.set_attribute("error.type", str(exc.errors[0].get("type", "validation_error")))
            raise
        except Exception as exc:  # the gateway failed (500)
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR))
            span.record_exception(exc)
            raise


def call_outcome(
    span: Span, *, tool: str, action_id: str, outcome: str, credits_charged: str, replayed: bool, failed: bool
) -> None:
    """Record a call's answer on its span, named after ``tool`` (a registered tool: the call was accepted,
    or is a replay of one that was); ``failed`` (an upstream failure, 5xx) sets the ERROR status."""
    span.update_name(f"tools/call {tool}")
    span.set_attribute("gen_ai.tool.name", tool)
    span.set_attribute("tollgate.action.id", action_id)
    span.set_attribute("tollgate.outcome", outcome)
    span.set_attribute("tollgate.credits.charged", credits_charged)
    span.set_attribute("tollgate.replayed", replayed)
    if outcome != "success":
        span.set_attribute("error.type", outcome)
    if failed:
        span.set_status(Status(StatusCode.ERROR, outcome))


def phase(name: str) -> contextlib.AbstractContextManager[Any]:
    """An INTERNAL child span ``tollgate.<name>`` of the call, or the shared no-op when off."""
    if not ENABLED:
        return _NO_SPAN
    return _tracer.start_as_current_span(f"tollgate.{name}", attributes={"tollgate.phase": name})


class UpstreamTrace:
    """What the dispatch sends along (``headers``, ``meta``) and how it records the upstream's answer."""

    __slots__ = ("headers", "meta", "span")

    def __init__(self, span: Span | None, headers: dict[str, str]) -> None:
        self.span = span
        self.headers = headers
        self.meta = headers

    def answered(self, kind: str, status_code: int | None) -> None:
        """The upstream's answer, as the client classified it (``CallResult.kind``)."""
        if self.span is None:
            return
        self.span.set_attribute("tollgate.upstream.result", kind)
        if status_code is not None:
            self.span.set_attribute("http.response.status_code", status_code)
        if kind not in ("success", "tool_error"):
            self.span.set_attribute("error.type", kind)
            self.span.set_status(Status(StatusCode.ERROR, kind))
        elif kind == "tool_error":
            self.span.set_attribute("error.type", "tool_error")


_NO_UPSTREAM_TRACE = UpstreamTrace(None, {})
_NO_UPSTREAM: contextlib.nullcontext[UpstreamTrace] = contextlib.nullcontext(_NO_UPSTREAM_TRACE)


def upstream_span(
    *, tool: str, url: str | None, server: str, request_id: str
) -> contextlib.AbstractContextManager[UpstreamTrace]:
    """The dispatch: a CLIENT span ``tools/call <tool>`` (the upstream's name) and the trace context to send.

    The one place the dispatch path starts a span and builds the ``traceparent`` it injects; when
    off, the shared no-op whose ``headers`` and ``meta`` are empty.
    """
    if not ENABLED:
        return _NO_UPSTREAM
    return _upstream_span(tool, url, server, request_id)


@contextlib.contextmanager
def _upstream_span(tool: str, url: str | None, server: str, request_id: str) -> Iterator[UpstreamTrace]:
    attributes: dict[str, Any] = {
        "mcp.method.name": "tools/call",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "jsonrpc.request.id": request_id,
        "tollgate.phase": "dispatch",
        "tollgate.upstream.server": server,
    }
    if url:
        parts = urlsplit(url)
        if parts.hostname:
            attributes["server.address"] = parts.hostname
            attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
    with _tracer.start_as_current_span(f"tools/call {tool}", kind=SpanKind.CLIENT, attributes=attributes) as span:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        yield UpstreamTrace(span, carrier)


def current_set(key: str, value: str) -> None:
    """Set an attribute on the current span (a no-op when off)."""
    if ENABLED:
        trace.get_current_span().set_attribute(key, value)
