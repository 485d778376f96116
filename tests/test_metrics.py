"""GET /metrics: who may read it, the exposition format, and counters that move with the traffic."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from rest_framework.test import APIClient

from audit.models import AuditEvent
from common import metrics
from mcpgateway.models import Action
from mcpgateway.services import action_sweep
from metrics.views import metrics_exposition
from tests.conftest import client_for
from tests.gateway_helpers import register_upstream, setup_caller
from tests.upstream_server import FaultUpstream

pytestmark = pytest.mark.django_db

TOKEN = "scrape-" + "s" * 40
ROOT = Path(__file__).resolve().parent.parent
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A small parser of the text format: every non-comment line is ``name{labels} value``."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            assert parts[1] in ("HELP", "TYPE"), line
            if parts[1] == "TYPE":
                assert parts[3] in ("counter", "gauge", "histogram"), line
                types[parts[2]] = parts[3]
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, raw_labels, value = match.groups()
        labels: list[tuple[str, str]] = []
        if raw_labels:
            consumed = "".join(m.group(0) for m in LABEL.finditer(raw_labels))
            assert consumed == raw_labels, f"bad labels: {raw_labels!r}"
            labels = [(m.group(1), m.group(2)) for m in LABEL.finditer(raw_labels)]
        key = (name, frozenset(labels))
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in types or family in types, f"sample without # TYPE: {name}"
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(autouse=True)
def fresh_counters():
    """The process-side counters live for the process; each test starts them at zero."""
    for family in (
        metrics.HTTP_REQUESTS,
        metrics.UPSTREAM_LATENCY,
        metrics.UPSTREAM_ERRORS,
        metrics.UPSTREAM_TOOL_CALLS,
        metrics.RATE_LIMIT_REFUSALS,
    ):
        family.clear()
    for kind in metrics.REFUSAL_KINDS:
        metrics.RATE_LIMIT_REFUSALS.labels(kind=kind)


@pytest.fixture
def scrape_token(settings) -> str:
    settings.METRICS_SCRAPE_TOKEN = TOKEN
    return TOKEN


def scraper(token: str = TOKEN) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def scrape(client: APIClient) -> dict:
    r = client.get("/metrics")
    assert r.status_code == 200, r.content
    return parse(r.content.decode())


# --- Who may read it -------------------------------------------------------------------------------


def test_auth_matrix(scrape_token, tenant, operator_client, anon_client):
    none = anon_client.get("/metrics")
    assert none.status_code == 401
    assert none.json()["detail"]["error"] == "not_authenticated"

    wallet = tenant.sponsor_client.get("/metrics")
    assert wallet.status_code == 403
    assert wallet.json()["detail"]["error"] == "operator_key_required"

    for client in (operator_client, scraper()):
        ok = client.get("/metrics")
        assert ok.status_code == 200
        assert ok["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"

    wrong = scraper("scrape-" + "x" * 40).get("/metrics")
    assert wrong.status_code == 401
    assert wrong.json()["detail"]["error"] == "invalid_api_key"


def test_without_a_configured_token_a_bearer_is_just_an_unknown_key(settings):
    settings.METRICS_SCRAPE_TOKEN = ""
    assert scraper().get("/metrics").status_code == 401
    assert scraper("").get("/metrics").status_code == 401


def test_errors_are_json_even_when_the_scraper_accepts_only_text(anon_client):
    r = anon_client.get("/metrics", HTTP_ACCEPT="text/plain;version=0.0.4")
    assert r.status_code == 401
    assert r["Content-Type"] == "application/json"


def test_a_scrape_with_the_token_is_no_rejected_credential(scrape_token):
    # The limiter would otherwise charge the token as a bad API key and audit every scrape.
    for _ in range(15):
        assert scraper().get("/metrics").status_code == 200
    assert not AuditEvent.objects.filter(event="auth.credential_rejected").exists()


# --- Format ------------------------------------------------------------------------------------------


def test_exposition_parses_and_names_every_family(scrape_token, django_assert_max_num_queries):
    # Every figure from PostgreSQL costs a fixed number of queries, whatever the traffic.
    with django_assert_max_num_queries(5):
        text = metrics_exposition()
    samples = parse(text)
    assert text.endswith("\n")
    for family in (
        "tollgate_governed_actions_total",
        "tollgate_governed_actions_in_flight",
        "tollgate_sweeper_swept_actions_total",
        "tollgate_ledger_debits_total",
        "tollgate_ledger_debited_credits_total",
        "tollgate_ledger_refunds_total",
        "tollgate_ledger_refunded_credits_total",
        "tollgate_audit_appends_total",
        "tollgate_http_requests_total",
        "tollgate_upstream_latency_seconds",
        "tollgate_upstream_errors_total",
        "tollgate_rate_limit_refusals_total",
        "tollgate_metrics_store_info",
    ):
        assert f"# TYPE {family} " in text, family
    for outcome in ("success", "tool_error", "failed_refunded", "delivery_uncertain", "denied"):
        assert ("tollgate_governed_actions_total", frozenset({("outcome", outcome), ("server", "")})) in samples
    for kind in metrics.REFUSAL_KINDS:
        assert value(samples, "tollgate_rate_limit_refusals_total", kind=kind) == 0
    assert value(samples, "tollgate_metrics_store_info", backend="process", shared="false") == 1


def test_requests_are_counted_by_route_pattern_not_path(scrape_token, tenant):
    for wallet_id in ("spn_a", "spn_b", tenant.sponsor.wallet_id):
        tenant.sponsor_client.get(f"/v1/api-keys/{wallet_id}")
    APIClient().get("/no/such/page")
    samples = scrape(scraper())
    route = "/v1/api-keys/<str:wallet_id>"
    assert value(samples, "tollgate_http_requests_total", method="GET", route=route, status="200") == 1
    assert value(samples, "tollgate_http_requests_total", method="GET", route=route, status="403") == 2
    assert value(samples, "tollgate_http_requests_total", method="GET", route="unmatched", status="404") == 1
    assert not any("spn_a" in str(labels) for _, labels in samples)


def test_label_values_are_escaped():
    from metrics.views import Family, render

    text = render([Family("x_total", "counter", "help").add(1, (("route", 'a"b\\c\nd'),))])
    assert parse(text) == {("x_total", frozenset({("route", 'a\\"b\\\\c\\nd')})): 1.0}


# --- Counters move -----------------------------------------------------------------------------------


@pytest.fixture
def fault(settings):
    settings.UPSTREAM_READ_TIMEOUT = 0.5
    settings.UPSTREAM_CONNECT_TIMEOUT = 0.5
    with FaultUpstream(hang_seconds=3) as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        register_upstream(upstream.url, price="2")
        yield upstream


def test_counters_move_after_governed_calls(scrape_token, fault, tenant):
    caller = setup_caller(tenant)
    before = scrape(scraper())

    assert "result" in caller.rpc("echo", {"x": 1}).json()
    assert caller.rpc("rpc_error", {"x": 1}).json()["error"]["data"]["outcome"] == "failed_refunded"
    after = scrape(scraper())

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # Tools registered without a server record (UPSTREAM_MCP_URL's client) count under server "".
    assert moved("tollgate_governed_actions_total", outcome="success", server="") == 1
    assert moved("tollgate_governed_actions_total", outcome="failed_refunded", server="") == 1
    assert moved("tollgate_ledger_debits_total") == 2
    assert moved("tollgate_ledger_debited_credits_total") == 4
    assert moved("tollgate_ledger_refunds_total") == 1
    assert moved("tollgate_ledger_refunded_credits_total") == 2
    assert moved("tollgate_audit_appends_total") >= 2
    assert moved("tollgate_http_requests_total", method="POST", route="/mcp/messages", status="200") == 2
    for kind in ("success", "jsonrpc_error"):
        assert moved("tollgate_upstream_latency_seconds_count", server="", kind=kind) == 1
        assert moved("tollgate_upstream_latency_seconds_bucket", server="", kind=kind, le="+Inf") == 1
        assert value(after, "tollgate_upstream_latency_seconds_sum", server="", kind=kind) > 0
    assert moved("tollgate_upstream_errors_total", server="", **{"class": "jsonrpc_error"}) == 1
    assert moved("tollgate_upstream_errors_total", server="", **{"class": "success"}) == 0
    # Buckets are cumulative.
    bounds = [repr(float(b)) for b in metrics.UPSTREAM_BUCKETS] + ["+Inf"]
    counts = [
        value(after, "tollgate_upstream_latency_seconds_bucket", server="", kind="success", le=le) for le in bounds
    ]
    assert counts == sorted(counts)


def test_swept_and_in_flight_actions(scrape_token, fault, tenant, monkeypatch, tmp_path):
    caller = setup_caller(tenant)
    # The worker "dies" right after claiming the dispatch: the action stays dispatch_claimed.
    monkeypatch.setenv("TOLLGATE_FAULTS", "after_claim=raise")
    monkeypatch.setenv("TOLLGATE_FAULT_DIR", str(tmp_path))
    client = tenant.agent_client
    client.raise_request_exception = False
    r = client.post(
        "/mcp/messages",
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "echo",
                "arguments": {},
                "_meta": {"permit_id": caller.permit_id, "idempotency_key": "k"},
            },
        },
        format="json",
    )
    assert r.status_code == 500
    monkeypatch.delenv("TOLLGATE_FAULTS")
    assert Action.objects.filter(state="dispatch_claimed").count() == 1
    mid = scrape(scraper())
    assert value(mid, "tollgate_governed_actions_in_flight") == 1
    assert value(mid, "tollgate_sweeper_swept_actions_total") == 0

    assert len(action_sweep(older_than=timedelta(0))) == 1
    after = scrape(scraper())
    assert value(after, "tollgate_governed_actions_in_flight") == 0
    assert value(after, "tollgate_sweeper_swept_actions_total") == 1
    assert value(after, "tollgate_governed_actions_total", outcome="delivery_uncertain", server="") == 1
    assert value(after, "tollgate_http_requests_total", method="POST", route="/mcp/messages", status="500") == 1


def test_a_429_bumps_rate_limit_refusals(scrape_token, tenant, settings):
    settings.RATE_LIMIT_REQUESTS = 2
    url = f"/v1/api-keys/{tenant.sponsor.wallet_id}"
    statuses = [tenant.sponsor_client.get(url).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    settings.RATE_LIMIT_REQUESTS = 120
    samples = scrape(scraper())
    assert value(samples, "tollgate_rate_limit_refusals_total", kind="key") == 1
    assert value(samples, "tollgate_rate_limit_refusals_total", kind="anonymous") == 0
    # The refused request is counted under its route, though no view ran.
    route = "/v1/api-keys/<str:wallet_id>"
    assert value(samples, "tollgate_http_requests_total", method="GET", route=route, status="429") == 1


WORKER = """
import sys
from common import metrics
for _ in range(int(sys.argv[1])):
    metrics.count_refusal("anonymous")
metrics.observe_upstream(0.02, kind="success", server="default")
"""


def test_a_scrape_sums_every_worker_of_the_instance(scrape_token, tmp_path, monkeypatch):
    """Multiprocess mode (config/gunicorn.py): two worker processes count, any process's scrape sums both."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "DJANGO_SETTINGS_MODULE": "config.settings"}
    for count in (3, 4):
        subprocess.run([sys.executable, "-c", WORKER, str(count)], cwd=ROOT, env=env, check=True)
    assert len(list(directory.glob("counter_*.db"))) == 2  # one file per worker process
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    samples = scrape(scraper())
    assert value(samples, "tollgate_rate_limit_refusals_total", kind="anonymous") == 7
    assert value(samples, "tollgate_upstream_latency_seconds_count", server="default", kind="success") == 2
    assert value(samples, "tollgate_metrics_store_info", backend="multiprocess", shared="true") == 1
    # Business totals still come from PostgreSQL beside them.
    assert ("tollgate_ledger_debits_total", frozenset()) in samples


def test_gunicorn_workers_share_the_counters(scrape_token, tmp_path):
    """A real gunicorn instance of two workers: requests answered by either worker are all counted."""
    from tests.live import running_gateway

    with running_gateway(tmp_path, workers=2, threads=2, METRICS_SCRAPE_TOKEN=TOKEN) as gateway:

        def health_count() -> float:
            r = httpx.get(f"{gateway.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
            assert r.status_code == 200
            return value(parse(r.text), "tollgate_http_requests_total", method="GET", route="/health", status="200")

        before = health_count()
        for _ in range(40):  # new connections: gunicorn spreads them over both workers
            assert httpx.get(f"{gateway.url}/health", timeout=10).status_code == 200
        seen = {health_count() for _ in range(10)}  # each scrape on a new connection, either worker
        assert seen == {before + 40}, seen
        assert len(list((tmp_path).glob("metrics-*/counter_*.db"))) == 2


def test_operator_key_scrape_works_without_a_token(settings, operator_client):
    settings.METRICS_SCRAPE_TOKEN = ""
    samples = scrape(operator_client)
    assert value(samples, "tollgate_build_info", version="1.3.0") == 1


def test_wallet_key_bearer_is_still_a_wallet_key(scrape_token, tenant):
    r = client_for(None)
    r.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.agent_secret}")
    assert r.get("/metrics").status_code == 403
