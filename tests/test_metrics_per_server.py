"""GET /metrics per upstream server: calls by outcome, upstream latency and upstream errors carry the server's
slug, and no tool or tenant label unless METRICS_TOOL_LABELS enables the per-tool family."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from billing.services import tool_price_set
from common import metrics
from mcpgateway.models import UpstreamServer
from mcpgateway.services.upstreams import upstream_server_create, upstream_server_sync
from tests.gateway_helpers import Caller, setup_caller
from tests.test_metrics import parse, scraper, value
from tests.upstream_server import FaultUpstream, SdkUpstream, running_sdk_upstream

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]

TOKEN = "scrape-" + "t" * 40
SECRET_ARGUMENT = "argument-value-that-must-not-leak"


@pytest.fixture(autouse=True)
def fresh_counters(settings: Any) -> None:
    settings.METRICS_SCRAPE_TOKEN = TOKEN
    settings.ENABLE_DOGFOOD_TOOL = False
    for family in (metrics.UPSTREAM_LATENCY, metrics.UPSTREAM_ERRORS, metrics.UPSTREAM_TOOL_CALLS):
        family.clear()


@dataclass
class Two:
    alpha: SdkUpstream
    beta: FaultUpstream


def _server(slug: str, url: str) -> None:
    server = upstream_server_create(
        slug=slug, name=slug, url=url, tool_prefix=slug, connect_timeout=2.0, read_timeout=5.0, actor="test"
    )
    report = upstream_server_sync(server=UpstreamServer.objects.get(pk=server.pk), actor="test")
    for name in report.created:
        tool_price_set(tool=name, credits=Decimal("2"))


@pytest.fixture
def two() -> Iterator[Two]:
    """``alpha``: an SDK server (``alpha.charge``, ``alpha.quick``); ``beta``: the fault server (``beta.echo``,
    ``beta.rpc_error``...); both records with a prefix, their tools priced at 2."""
    with running_sdk_upstream("alpha") as alpha, FaultUpstream() as beta:
        _server("alpha", alpha.url)
        _server("beta", beta.url)
        yield Two(alpha, beta)


def _calls(caller: Caller) -> None:
    for _ in range(2):
        assert "result" in caller.rpc("alpha.charge", {"amount": 3}).json()
    assert "result" in caller.rpc("beta.echo", {"x": SECRET_ARGUMENT}).json()
    assert caller.rpc("beta.rpc_error", {}).json()["error"]["data"]["outcome"] == "failed_refunded"


def test_calls_latency_and_errors_are_labelled_by_server(two: Two, tenant: Any) -> None:
    caller = setup_caller(tenant)
    before = parse(scraper(TOKEN).get("/metrics").content.decode())
    _calls(caller)
    # A refusal is sent nowhere: it counts under server "".
    refused = setup_caller(tenant, tools=["beta.echo"]).rpc
    assert refused("alpha.charge", {"amount": 1}).json()["error"]["data"]["outcome"] == "denied"
    text = scraper(TOKEN).get("/metrics").content.decode()
    after = parse(text)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    actions = "tollgate_governed_actions_total"
    assert moved(actions, outcome="success", server="alpha") == 2
    assert moved(actions, outcome="success", server="beta") == 1
    assert moved(actions, outcome="failed_refunded", server="beta") == 1
    assert moved(actions, outcome="failed_refunded", server="alpha") == 0
    assert moved(actions, outcome="denied", server="") == 1
    # Every outcome of every server is exposed, at 0 until it happens.
    assert (actions, frozenset({("outcome", "delivery_uncertain"), ("server", "alpha")})) in after

    latency = "tollgate_upstream_latency_seconds_count"
    assert value(after, latency, server="alpha", kind="success") == 2
    assert value(after, latency, server="beta", kind="success") == 1
    assert value(after, latency, server="beta", kind="jsonrpc_error") == 1
    assert value(after, "tollgate_upstream_latency_seconds_sum", server="alpha", kind="success") > 0
    errors = "tollgate_upstream_errors_total"
    assert value(after, errors, server="beta", **{"class": "jsonrpc_error"}) == 1
    assert value(after, errors, server="alpha", **{"class": "jsonrpc_error"}) == 0
    assert not any(name == errors and ("class", "success") in labels for name, labels in after)

    # Bounded cardinality: no tool, tenant or wallet label, nor an argument, anywhere by default.
    assert not any(label in ("tool", "tenant", "tenant_id", "wallet") for _, labels in after for label, _ in labels)
    for leaked in ("alpha.charge", "beta.echo", tenant.agent.tenant_id, tenant.agent.wallet_id, SECRET_ARGUMENT):
        assert leaked not in text
    assert "tollgate_upstream_tool_calls_total{" not in text


def test_metrics_tool_labels_adds_the_per_tool_family(two: Two, tenant: Any, settings: Any) -> None:
    settings.METRICS_TOOL_LABELS = True
    _calls(setup_caller(tenant))
    after = parse(scraper(TOKEN).get("/metrics").content.decode())
    family = "tollgate_upstream_tool_calls_total"
    assert value(after, family, server="alpha", tool="alpha.charge", kind="success") == 2
    assert value(after, family, server="beta", tool="beta.echo", kind="success") == 1
    assert value(after, family, server="beta", tool="beta.rpc_error", kind="jsonrpc_error") == 1
    # The bounded families keep their labels.
    assert value(after, "tollgate_upstream_latency_seconds_count", server="alpha", kind="success") == 2
