"""End to end: a live gunicorn gateway, a live upstream built with the official MCP SDK, and the SDK client."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from receipts.verify import verify_portable
from tests import factories
from tests.conftest import make_tenant
from tests.gateway_helpers import issue_permit, register_upstream
from tests.live import running_gateway
from tests.upstream_server import running_demo_upstream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


async def sdk_session(url: str, key: str, mode: str, permit_id: str, idem: str) -> dict[str, Any]:
    http = httpx2.AsyncClient(headers={"X-API-Key": key}, timeout=30)
    async with Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as client:
        tools = await client.list_tools()
        result = await client.call_tool(
            "notes.append",
            {"text": f"hello from {mode}"},
            meta={"permit_id": permit_id, "idempotency_key": idem},  # type: ignore[arg-type]
        )
        replay = await client.call_tool(
            "notes.append",
            {"text": f"hello from {mode}"},
            meta={"permit_id": permit_id, "idempotency_key": idem},  # type: ignore[arg-type]
        )
    await http.aclose()
    return {"tools": [t.name for t in tools.tools], "result": result, "replay": replay}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28", "auto"])
def test_sdk_client_lists_and_calls_through_the_gateway(tmp_path, mode):
    with running_demo_upstream() as demo:
        register_upstream(demo.url, price="0.5")
        tenant = make_tenant(f"e2e-{mode}")
        factories.top_up(tenant.agent, 10)
        permit_id = issue_permit(tenant, tools=["notes.*"], max_credits="5")
        with running_gateway(tmp_path, UPSTREAM_MCP_URL=demo.url) as gw:
            out = asyncio.run(sdk_session(gw.url, tenant.agent_secret, mode, permit_id, f"e2e-{mode}"))
            assert "notes.append" in out["tools"]
            result = out["result"]
            assert result.is_error is False
            assert result.structured_content["text"] == f"hello from {mode}"
            meta = result.meta or {}
            receipt_id = meta["io.tollgate/receipt-id"]
            assert meta["io.tollgate/outcome"] == "success"
            assert meta["io.tollgate/replayed"] is False
            assert out["replay"].meta["io.tollgate/replayed"] is True
            assert out["replay"].meta["io.tollgate/receipt-id"] == receipt_id
            # The upstream ran the tool once and saw the forwarded idempotency key.
            stats = httpx.get(demo.stats_url).json()
            assert stats["tool_calls"]["notes.append"] == 1
            assert stats["notebook_size"] == 1
            forwarded = f"{tenant.agent.wallet_id}:e2e-{mode}"
            assert stats["sightings"][-1] == {"tool": "notes.append", "header_key": forwarded, "meta_key": forwarded}

            headers = {"X-API-Key": tenant.agent_secret}
            evidence = httpx.get(f"{gw.url}/v1/evidence/{receipt_id}", headers=headers).json()
            assert evidence["verified"] is True, evidence["verification"]
            assert evidence["receipt"]["credits_charged"] == "0.50000000"
            portable = httpx.get(f"{gw.url}/v1/receipts/{receipt_id}/portable", headers=headers).json()
            assert verify_portable(portable).valid
