"""A governed tool call through a local gateway with the official MCP Python SDK.

    .venv/bin/python examples/sdk_call.py [--gateway http://127.0.0.1:8000] [--credentials FILE]

Uses the demo agent key and permit that `make run` writes to .data/demo-credentials.json, and the
gateway address written there (the port `make run` serves on); --gateway overrides it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client


async def call(gateway: str, creds: dict[str, Any]) -> None:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A governed tool call through the gateway with the MCP SDK.")
    parser.add_argument("--gateway", help="the gateway's address (default: the one in the credentials file)")
    parser.add_argument("--credentials", default=".data/demo-credentials.json")
    args = parser.parse_args(argv)
    try:
        creds = json.loads(Path(args.credentials).read_text())
    except (OSError, ValueError) as err:
        print(f"error: cannot read {args.credentials} ({err}); `make run` writes it on first start.", file=sys.stderr)
        return 1
    gateway = (args.gateway or creds.get("gateway") or "http://127.0.0.1:8000").rstrip("/")
    try:
        httpx.get(f"{gateway}/health", timeout=5).raise_for_status()
    except httpx.HTTPError as err:
        print(f"error: no gateway answers at {gateway} ({type(err).__name__}); is `make run` running?", file=sys.stderr)
        return 1
    try:
        asyncio.run(call(gateway, creds))
    except Exception as err:  # one readable line, not the SDK's task-group traceback
        print(f"error: the governed call failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
