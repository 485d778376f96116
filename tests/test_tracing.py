"""OpenTelemetry traces of the governed call (common.tracing): the spans, their structure and attributes, the
W3C trace context continued from the agent and sent to the upstream, the OTLP/HTTP export of a real gunicorn
instance, and nothing at all while tracing is off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from billing.services import tool_price_set
from common import tracing
from mcpgateway.models import UpstreamServer
from mcpgateway.services.upstreams import upstream_credential_set, upstream_server_create, upstream_server_sync
from tests.conftest import Tenant, make_tenant
from tests.gateway_helpers import issue_permit, setup_caller, tools_call_body
from tests.upstream_server import FaultUpstream, SdkUpstream, running_sdk_upstream

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]

SECRET_ARGUMENT = "argument-value-that-must-not-leak"
UPSTREAM_TOKEN = "upstream-token-that-must-not-leak"
AGENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
AGENT_SPAN_ID = "00f067aa0ba902b7"
AGENT_TRACEPARENT = f"00-{AGENT_TRACE_ID}-{AGENT_SPAN_ID}-01"


def _server(slug: str, url: str, *, token: str | None = None) -> None:
    server = upstream_server_create(
        slug=slug,
        name=slug,
        url=url,
        tool_prefix=slug,
        connect_timeout=2.0,
        read_timeout=5.0,
        credentials_required=token is not None,
        actor="test",
    )
    if token is not None:
        upstream_credential_set(
            server_id=server.server_id, tenant_id=None, kind="bearer", secret={"token": token}, actor="test"
        )
    report = upstream_server_sync(server=UpstreamServer.objects.get(pk=server.pk), actor="test")
    for name in report.created:
        tool_price_set(tool=name, credits=Decimal("2"))


@pytest.fixture
def upstreams(settings: Any) -> Iterator[tuple[SdkUpstream, FaultUpstream]]:
    """``alpha``: an SDK server behind a bearer token; ``beta``: the fault server; tools priced at 2."""
    settings.ENABLE_DOGFOOD_TOOL = False
    with running_sdk_upstream("alpha", tokens={UPSTREAM_TOKEN}) as alpha, FaultUpstream() as beta:
        _server("alpha", alpha.url, token=UPSTREAM_TOKEN)
        _server("beta", beta.url)
        yield alpha, beta


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.tracing_use(exporter)
    try:
        yield exporter
    finally:
        tracing.tracing_use(None)


def _call(tenant: Tenant, permit_id: str, tool: str, arguments: dict[str, Any], **headers: str) -> dict[str, Any]:
    body = tools_call_body(tool, arguments, permit_id=permit_id)
    answer = tenant.agent_client.post("/mcp/messages", body, format="json", headers=headers)
    assert answer.status_code == 200, answer.content
    return dict(answer.json())


def _tree(exported: tuple[ReadableSpan, ...]) -> tuple[ReadableSpan, dict[str, ReadableSpan]]:
    """The one root span and its children by name, all of one trace, each child's parent the root."""
    roots = [s for s in exported if s.kind == SpanKind.SERVER]
    assert len(roots) == 1, [s.name for s in exported]
    root = roots[0]
    children = {s.name: s for s in exported if s is not root}
    assert len(children) == len(exported) - 1
    for child in children.values():
        assert child.context.trace_id == root.context.trace_id
        assert child.parent is not None
        assert child.parent.span_id == root.context.span_id
    return root, children


def _no_secrets(exported: tuple[ReadableSpan, ...], tenant: Tenant) -> None:
    for span in exported:
        for value in (span.attributes or {}).values():
            for secret in (SECRET_ARGUMENT, UPSTREAM_TOKEN, tenant.agent_secret, tenant.agent_key_id):
                assert secret not in str(value), (span.name, value)


def test_a_successful_call_is_one_server_span_with_its_phases(upstreams, spans, tenant):
    alpha, _ = upstreams
    caller = setup_caller(tenant)
    answer = _call(tenant, caller.permit_id, "alpha.charge", {"amount": 3, "note": SECRET_ARGUMENT})
    exported = spans.get_finished_spans()
    root, children = _tree(exported)

    assert root.name == "tools/call alpha.charge"
    attributes = dict(root.attributes or {})
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["gen_ai.tool.name"] == "alpha.charge"
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["tollgate.outcome"] == "success"
    assert Decimal(str(attributes["tollgate.credits.charged"])) == 2
    assert attributes["tollgate.action.id"] == answer["result"]["_meta"]["io.tollgate/action-id"]
    assert attributes["tollgate.upstream.server"] == "alpha"
    assert "error.type" not in attributes
    assert root.status.status_code == StatusCode.UNSET
    assert root.parent is None  # no trace context from the agent: a new trace

    assert set(children) == {"tollgate.claim", "tools/call charge", "tollgate.finish"}
    dispatch = children["tools/call charge"]
    assert dispatch.kind == SpanKind.CLIENT
    sent = dict(dispatch.attributes or {})
    assert sent["server.address"] == "127.0.0.1"
    assert sent["server.port"] == int(alpha.url.split(":")[2].split("/")[0])
    assert sent["gen_ai.tool.name"] == "charge"
    assert sent["tollgate.upstream.server"] == "alpha"
    assert sent["tollgate.upstream.result"] == "success"
    assert sent["jsonrpc.request.id"] == attributes["tollgate.action.id"]
    # The phases in order: claimed, then sent, then finished.
    order = sorted(children.values(), key=lambda s: s.start_time or 0)
    assert [s.name for s in order] == ["tollgate.claim", "tools/call charge", "tollgate.finish"]
    _no_secrets(exported, tenant)

    # (c) The upstream received the dispatch span's context, as a header and in params._meta.
    call = [r for r in alpha.requests if r.method == "tools/call"][-1]
    context = dispatch.context
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert call.headers["traceparent"] == expected
    assert call.meta["traceparent"] == expected


def test_the_agents_traceparent_is_continued(upstreams, spans, tenant):
    alpha, _ = upstreams
    caller = setup_caller(tenant)
    _call(tenant, caller.permit_id, "alpha.quick", {}, traceparent=AGENT_TRACEPARENT, baggage="k=v")
    root, _children = _tree(spans.get_finished_spans())
    assert f"{root.context.trace_id:032x}" == AGENT_TRACE_ID
    assert root.parent is not None
    assert f"{root.parent.span_id:016x}" == AGENT_SPAN_ID
    assert root.parent.is_remote
    call = [r for r in alpha.requests if r.method == "tools/call"][-1]
    assert call.headers["traceparent"].split("-")[1] == AGENT_TRACE_ID
    assert "baggage" not in call.headers  # only the W3C trace context goes upstream


def test_a_refused_call_has_no_dispatch_and_is_no_gateway_error(upstreams, spans, tenant):
    alpha, _ = upstreams
    setup_caller(tenant)
    permit_id = issue_permit(tenant, tools=["beta.echo"])
    answer = _call(tenant, permit_id, "alpha.charge", {"amount": 1})
    assert answer["error"]["data"]["outcome"] == "denied"
    root, children = _tree(spans.get_finished_spans())
    attributes = dict(root.attributes or {})
    assert attributes["tollgate.outcome"] == "denied"
    assert attributes["error.type"] == "denied"
    assert Decimal(str(attributes["tollgate.credits.charged"])) == 0
    assert root.status.status_code == StatusCode.UNSET  # the gateway answered as it should
    assert set(children) == {"tollgate.claim"}
    assert not [r for r in alpha.requests if r.method == "tools/call"]


def test_an_upstream_error_marks_the_dispatch_and_the_call(upstreams, spans, tenant):
    _, beta = upstreams
    caller = setup_caller(tenant)
    answer = _call(tenant, caller.permit_id, "beta.rpc_error", {"x": SECRET_ARGUMENT})
    assert answer["error"]["data"]["outcome"] == "failed_refunded"
    exported = spans.get_finished_spans()
    root, children = _tree(exported)
    attributes = dict(root.attributes or {})
    assert attributes["tollgate.outcome"] == "failed_refunded"
    assert attributes["error.type"] == "failed_refunded"
    assert Decimal(str(attributes["tollgate.credits.charged"])) == 0
    assert root.status.status_code == StatusCode.ERROR
    dispatch = children["tools/call rpc_error"]
    assert dispatch.status.status_code == StatusCode.ERROR
    assert dict(dispatch.attributes or {})["error.type"] == "jsonrpc_error"
    assert set(children) == {"tollgate.claim", "tools/call rpc_error", "tollgate.finish"}
    sent = [m for m in beta.messages if m.method == "tools/call"][-1]
    assert sent.headers["traceparent"].split("-")[1] == f"{root.context.trace_id:032x}"
    _no_secrets(exported, tenant)


def test_a_call_refused_before_acceptance_records_the_error_code(upstreams, spans, tenant):
    caller = setup_caller(tenant)
    answer = tenant.agent_client.post(
        "/mcp/messages", tools_call_body("alpha.nope", {}, permit_id=caller.permit_id), format="json"
    )
    assert answer.json()["error"]["data"]["error"] == "unknown_tool"
    (root,) = spans.get_finished_spans()
    # A name the agent made up becomes neither the span's name nor an attribute (bounded names).
    assert root.name == "tools/call"
    assert "alpha.nope" not in str(dict(root.attributes or {}))
    assert dict(root.attributes or {})["error.type"] == "unknown_tool"
    assert "tollgate.action.id" not in dict(root.attributes or {})  # nothing was accepted
    assert root.status.status_code == StatusCode.UNSET
    assert not root.events  # no exception recorded: the agent's error, not the gateway's


def test_off_no_span_no_header(upstreams, tenant):
    alpha, _ = upstreams
    assert not tracing.ENABLED
    exporter = InMemorySpanExporter()  # attached to nothing: tracing is off
    caller = setup_caller(tenant)
    _call(tenant, caller.permit_id, "alpha.quick", {}, traceparent=AGENT_TRACEPARENT)
    call = [r for r in alpha.requests if r.method == "tools/call"][-1]
    assert "traceparent" not in call.headers
    assert "traceparent" not in call.meta
    assert exporter.get_finished_spans() == ()
    assert tracing.incoming_context({"traceparent": AGENT_TRACEPARENT}) is None


# --- (b) A real OTLP/HTTP receiver and a real gunicorn instance -------------------------------------------


class Receiver:
    """A small OTLP/HTTP receiver on 127.0.0.1: decodes every ``/v1/traces`` protobuf body it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.arrived:
                    receiver.paths.append(self.path)
                    for resource_spans in request.resource_spans:
                        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                        for scope in resource_spans.scope_spans:
                            for span in scope.spans:
                                receiver.spans.append(span)
                                receiver.resources.append(resource)
                    receiver.arrived.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int) -> list[Any]:
        """Wait until ``count`` spans arrived (the test's timeout bounds the wait)."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.spans) >= count)
            return list(self.spans)


@pytest.mark.django_db(transaction=True)
def test_gunicorn_exports_over_otlp_http_to_a_real_receiver(tmp_path, settings):
    from tests.live import running_gateway

    settings.ENABLE_DOGFOOD_TOOL = False
    with running_sdk_upstream("alpha") as alpha, Receiver() as receiver:
        _server("alpha", alpha.url)
        tenant = make_tenant("otlp")
        caller = setup_caller(tenant)
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        with running_gateway(tmp_path, workers=1, threads=2, extra_env=env) as gateway:
            answer = httpx.post(
                f"{gateway.url}/mcp/messages",
                json=tools_call_body("alpha.charge", {"amount": 5}, permit_id=caller.permit_id),
                headers={"X-API-Key": tenant.agent_secret, "traceparent": AGENT_TRACEPARENT},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            assert "result" in answer.json(), answer.text
            exported = receiver.wait_for(4)
    assert set(receiver.paths) == {"/v1/traces"}
    by_name = {span.name: span for span in exported}
    assert set(by_name) == {"tools/call alpha.charge", "tollgate.claim", "tools/call charge", "tollgate.finish"}
    root = by_name["tools/call alpha.charge"]
    assert root.trace_id.hex() == AGENT_TRACE_ID
    assert root.parent_span_id.hex() == AGENT_SPAN_ID
    assert all(span.trace_id == root.trace_id for span in exported)
    assert all(by_name[name].parent_span_id == root.span_id for name in by_name if name != root.name)
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["gen_ai.operation.name"].string_value == "execute_tool"
    assert attributes["tollgate.outcome"].string_value == "success"
    assert attributes["tollgate.action.id"].string_value == answer.json()["result"]["_meta"]["io.tollgate/action-id"]
    assert receiver.resources[0]["service.name"] == "tollgate"
    dispatch = by_name["tools/call charge"]
    call = [r for r in alpha.requests if r.method == "tools/call"][-1]
    assert call.headers["traceparent"].split("-")[1:3] == [AGENT_TRACE_ID, dispatch.span_id.hex()]


def test_a_malformed_trace_context_from_the_agent_starts_a_new_trace(upstreams, spans, tenant):
    alpha, _ = upstreams
    caller = setup_caller(tenant)
    hostile = {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "tracestate": "x=" + "y" * 5000}
    answer = _call(tenant, caller.permit_id, "alpha.quick", {}, **hostile)
    assert answer["result"]["_meta"]["io.tollgate/outcome"] == "success"
    root, _ = _tree(spans.get_finished_spans())
    assert root.parent is None  # an all-zero trace id is invalid: not continued
    assert root.context.trace_id != 0
    call = [r for r in alpha.requests if r.method == "tools/call"][-1]
    assert call.headers["traceparent"].split("-")[1] == f"{root.context.trace_id:032x}"
    assert "tracestate" not in call.headers  # the agent's oversized tracestate went nowhere


def test_the_agents_tracestate_reaches_neither_the_upstream_nor_the_logs(upstreams, spans, tenant, caplog):
    """The trace is continued (``traceparent``), but the agent's ``tracestate``, free text of its own
    choosing, is not carried to the upstream (header or ``_meta``) as if the gateway had written it, and a
    malformed one is not written into the logs."""
    alpha, _ = upstreams
    caller = setup_caller(tenant)
    forged = "tollgate=forged,dd=s:2;o:rum"
    answer = _call(tenant, caller.permit_id, "alpha.quick", {}, traceparent=AGENT_TRACEPARENT, tracestate=forged)
    assert answer["result"]["_meta"]["io.tollgate/outcome"] == "success"
    root, children = _tree(spans.get_finished_spans())
    assert f"{root.context.trace_id:032x}" == AGENT_TRACE_ID  # the trace is continued
    assert all(not span.context.trace_state for span in (root, *children.values()))
    call = [r for r in alpha.requests if r.method == "tools/call"][-1]
    assert call.headers["traceparent"].split("-")[1] == AGENT_TRACE_ID
    assert "tracestate" not in call.headers
    assert "tracestate" not in call.meta
    _call(tenant, caller.permit_id, "alpha.quick", {}, traceparent=AGENT_TRACEPARENT, tracestate="ACCESS DENIED x")
    assert "ACCESS DENIED" not in caplog.text


SETUP_PROBE = """
import json, os, sys
from common import tracing
first = tracing.tracing_setup()
again = tracing.tracing_setup()  # once per process
processors = []
if tracing._provider is not None:
    processors = [type(p).__name__ for p in tracing._provider._active_span_processor._span_processors]
print(json.dumps({"enabled": first, "again": again, "flag": tracing.ENABLED, "processors": processors,
                  "sdk_loaded": any(name.startswith("opentelemetry.sdk") for name in sys.modules)}))
"""


@pytest.mark.parametrize("endpoint", ["", "http://127.0.0.1:9"])
def test_setup_builds_one_batch_exporter_only_with_an_endpoint(endpoint):
    """Off: no SDK module is even imported. On: one BatchSpanProcessor, however often setup is called."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    if endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    out = subprocess.run(
        [sys.executable, "-c", SETUP_PROBE],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    probe = json.loads(out.strip().splitlines()[-1])
    if endpoint:
        assert probe == {
            "enabled": True, "again": True, "flag": True, "processors": ["BatchSpanProcessor"], "sdk_loaded": True
        }  # fmt: skip
    else:
        assert probe == {"enabled": False, "again": False, "flag": False, "processors": [], "sdk_loaded": False}


def test_the_rest_invoke_continues_the_agents_traceparent_too(upstreams, spans, tenant):
    caller = setup_caller(tenant)
    body = {"arguments": {}, "permit_id": caller.permit_id, "idempotency_key": "rest-traced-1"}
    answer = tenant.agent_client.post(
        "/mcp/tools/alpha.quick/invoke", body, format="json", headers={"traceparent": AGENT_TRACEPARENT}
    )
    assert answer.status_code == 200, answer.content
    root, children = _tree(spans.get_finished_spans())
    assert root.name == "tools/call alpha.quick"
    assert f"{root.context.trace_id:032x}" == AGENT_TRACE_ID
    assert dict(root.attributes or {})["tollgate.action.id"] == answer.json()["action_id"]
    assert "tools/call quick" in children
