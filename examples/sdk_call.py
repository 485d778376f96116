"""A governed tool call through a local gateway with the official MCP Python SDK.

    .venv/bin/python examples/sdk_call.py [--gateway http://127.0.0.1:8000]

Uses the demo agent key and permit that `make run` writes to .data/demo-credentials.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from pathlib import Path

import httpx
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client


async def main(gateway: str, creds: dict[str, str]) -> None:
    http = httpx2.AsyncClient(headers={"X-API-Key": creds["agent_api_key"]})
    async with Client(streamable_http_client(f"{gateway}/mcp", http_client=http)) as client:
        tools = await client.list_tools()
        print("tools:", [t.name for t in tools.tools])
        result = await client.call_tool(
            "notes.append",
            {"text": "hello through the gateway"},
            # One logical action = one idempotency key; a retry with the same key is never charged twice.
            meta={"permit_id": creds["permit_id"], "idempotency_key": str(uuid.uuid4())},  # type: ignore[arg-type]
        )
        print("result:", result.structured_content)
        meta = result.meta or {}
        print("outcome:", meta["io.tollgate/outcome"], "receipt:", meta["io.tollgate/receipt-id"])
    await http.aclose()
    evidence = httpx.get(
        f"{gateway}/v1/evidence/{meta['io.tollgate/receipt-id']}", headers={"X-API-Key": creds["agent_api_key"]}
    ).json()
    print("evidence verification:", evidence["verification"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", default="http://127.0.0.1:8000")
    parser.add_argument("--credentials", default=".data/demo-credentials.json")
    args = parser.parse_args()
    asyncio.run(main(args.gateway, json.loads(Path(args.credentials).read_text())))
