"""Helpers for gateway tests: register an upstream's tools with prices, fund a tenant, issue a permit."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings

from billing.services import tool_price_set
from common.ids import new_id
from mcpgateway import services
from mcpgateway.upstream.client import UpstreamClient
from tests import factories
from tests.conftest import Tenant
from tests.upstream_server import FaultUpstream

_ids = itertools.count(1)


def register_upstream(url: str, *, price: str = "1") -> list[str]:
    """Sync the upstream's tools and give each the same price."""
    with UpstreamClient(url, connect_timeout=2, read_timeout=5) as client:
        tools = client.list_tools()
    services.tools_sync(remote_tools=tools)
    for spec in tools:
        tool_price_set(tool=spec["name"], credits=Decimal(price))
    return [t["name"] for t in tools]


def register_tools(tools: list[dict[str, Any]], *, price: str) -> None:
    """What ``sync_tools`` plus pricing would do, without asking the upstream (its tools/list is static)."""
    services.tools_sync(remote_tools=tools)
    for spec in tools:
        tool_price_set(tool=spec["name"], credits=Decimal(price))


def fresh_upstream(test_settings: Any, upstream: FaultUpstream, *, timeout: float, price: str = "2") -> FaultUpstream:
    """Point the gateway at a module's scripted upstream with fresh counters, its tools registered at ``price``.

    ``test_settings``: pytest-django's ``settings`` fixture (restored after the test); ``timeout``: the
    upstream connect and read timeouts.
    """
    test_settings.UPSTREAM_READ_TIMEOUT = timeout
    test_settings.UPSTREAM_CONNECT_TIMEOUT = timeout
    test_settings.UPSTREAM_MCP_URL = upstream.url
    with upstream.lock:
        upstream.messages.clear()
        upstream.received.clear()
        upstream.executed.clear()
        upstream.meta_keys.clear()
    register_tools(upstream.tools(), price=price)
    return upstream


def issue_permit(tenant: Tenant, *, tools: list[str] | None = None, max_credits: str = "100", **extra: Any) -> str:
    r = tenant.sponsor_client.post(
        "/v1/permits",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": tools or ["*"], "max_credits": max_credits, **extra},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )
    assert r.status_code == 201, r.content
    return str(r.json()["permit_id"])


def tools_call_body(
    tool: str, arguments: dict[str, Any] | None = None, *, permit_id: str, key: str | None = None, **meta: Any
) -> dict[str, Any]:
    """A JSON-RPC ``tools/call`` request naming ``permit_id`` and an idempotency key (a new one by default)."""
    return {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments or {},
            "_meta": {"permit_id": permit_id, "idempotency_key": key or new_id("k"), **meta},
        },
    }


@dataclass
class Caller:
    tenant: Tenant
    permit_id: str

    def rpc(self, tool: str, arguments: dict[str, Any] | None = None, *, key: str | None = None, **meta: Any) -> Any:
        """tools/call over the deprecated /mcp/messages endpoint (plain JSON-RPC, same governed path)."""
        body = tools_call_body(tool, arguments, permit_id=meta.pop("permit_id", self.permit_id), key=key, **meta)
        return self.tenant.agent_client.post("/mcp/messages", body, format="json")

    def invoke(
        self, tool: str, arguments: dict[str, Any] | None = None, *, key: str | None = None, **extra: Any
    ) -> Any:
        body = {
            "arguments": arguments or {},
            "permit_id": self.permit_id,
            "idempotency_key": key or new_id("k"),
            **extra,
        }
        return self.tenant.agent_client.post(f"/mcp/tools/{tool}/invoke", body, format="json")


def setup_caller(tenant: Tenant, *, balance: int = 100, **permit: Any) -> Caller:
    factories.top_up(tenant.agent, balance)
    return Caller(tenant, issue_permit(tenant, **permit))


def upstream_configured() -> str:
    return str(settings.UPSTREAM_MCP_URL)
