"""CPU per ``tools/call`` of the gateway's upstream client, beside a plain httpx client, in one run.

    .venv/bin/python bench/upstream_client.py [--calls 2000] [--rounds 5] [--json PATH]

Starts the bundled demo upstream (``python -m mcpgateway.demo_upstream --port P
--stateless``, the official MCP SDK under uvicorn) on 127.0.0.1, then sends
``--calls`` sequential ``tools/call`` requests of ``math.add`` per round with:

* ``UpstreamClient.call_tool`` as phase 2 of the governed call uses it (request
  id, idempotency key, extra ``_meta``, the tool's outputSchema checked);
* the same without an outputSchema (the client's wire and classification only);
* a plain ``httpx.Client`` posting the same JSON-RPC request and decoding the
  JSON answer (the in-run reference: what an httpx-based client cannot go below);
* a bare HTTP/1.1 exchange on one kept-alive socket (``sendall`` then ``recv``
  until Content-Length is satisfied): the floor of any client.

The variants alternate within each round so that noise from other work on the
machine spreads over all of them. Reported per variant: CPU microseconds per
call in this process (``time.process_time``: user + system of every thread,
which excludes the upstream's own process), the median over rounds, and wall
p50 / p99 of the calls. The upstream's work is in the wall times, not in CPU.
Stops the upstream at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcpgateway.upstream import UpstreamClient  # noqa: E402

ARGUMENTS = {"a": 1, "b": 2}
WARMUP = 200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def rpc_body(rid: str, key: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": "math.add", "arguments": ARGUMENTS, "_meta": {"io.tollgate/idempotency-key": key}},
    }


class Variants:
    """One callable per variant; each sends one ``tools/call`` with a fresh key and checks the answer."""

    def __init__(self, url: str, port: int) -> None:
        self.n = 0
        self.client = UpstreamClient(url, connect_timeout=2.0, read_timeout=10.0, total_timeout=20.0)
        tools = {tool["name"]: tool for tool in self.client.list_tools()}
        self.schema = tools["math.add"]["outputSchema"]
        self.session = self.client.initialize()
        self.httpx = httpx.Client(timeout=10.0, trust_env=False, follow_redirects=False)
        self.url = url
        self.port = port
        self.sock = self.connect()
        self.head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json, text/event-stream\r\n"
            f"Content-Type: application/json\r\nMCP-Protocol-Version: {self.session.protocol_version}\r\n"
        )

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def fresh_socket(self) -> None:
        """A new bare socket before each batch: uvicorn closes connections idle for 5 s."""
        self.sock.close()
        self.sock = self.connect()

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise SystemExit("the upstream closed the bare socket")
        return data

    def _key(self) -> str:
        self.n += 1
        return f"bench-{os.getpid()}-{self.n}"

    def client_schema(self) -> None:
        key = self._key()
        result = self.client.call_tool(
            "math.add",
            ARGUMENTS,
            idempotency_key=key,
            request_id=key,
            extra_meta={"io.tollgate/action-id": key},
            output_schema=self.schema,
        )
        if result.kind != "success":
            raise SystemExit(f"call_tool failed: {result}")

    def client_plain(self) -> None:
        key = self._key()
        result = self.client.call_tool("math.add", ARGUMENTS, idempotency_key=key, request_id=key)
        if result.kind != "success":
            raise SystemExit(f"call_tool failed: {result}")

    def httpx_post(self) -> None:
        key = self._key()
        response = self.httpx.post(
            self.url,
            json=rpc_body(key, key),
            headers={
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": self.session.protocol_version,
                "Idempotency-Key": key,
            },
        )
        if response.status_code != 200 or "result" not in response.json():
            raise SystemExit(f"httpx call failed: {response.status_code} {response.text[:200]}")

    def raw_socket(self) -> None:
        key = self._key()
        body = json.dumps(rpc_body(key, key), separators=(",", ":")).encode()
        self.sock.sendall(f"{self.head}Idempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self._recv()
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            rest += self._recv()
        if not head.startswith(b"HTTP/1.1 200") or b'"result"' not in rest:
            raise SystemExit(f"raw call failed: {head[:100]!r}")

    def close(self) -> None:
        self.client.close()
        self.httpx.close()
        self.sock.close()


def measure(fn: Callable[[], None], calls: int, variants: Variants) -> tuple[float, list[float]]:
    """(CPU seconds of this process over ``calls`` calls, wall seconds of each call)."""
    if fn == variants.raw_socket:
        variants.fresh_socket()
    walls: list[float] = []
    cpu0 = time.process_time()
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - started)
    return time.process_time() - cpu0, walls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "mcpgateway.demo_upstream", "--port", str(port), "--stateless"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/stats")
        variants = Variants(f"http://127.0.0.1:{port}/mcp", port)
        plan: dict[str, Callable[[], None]] = {
            "UpstreamClient.call_tool (outputSchema checked)": variants.client_schema,
            "UpstreamClient.call_tool (no outputSchema)": variants.client_plain,
            "httpx.Client.post + json (reference)": variants.httpx_post,
            "bare socket exchange (floor)": variants.raw_socket,
        }
        for fn in plan.values():
            measure(fn, WARMUP, variants)
        cpu: dict[str, list[float]] = {name: [] for name in plan}
        walls: dict[str, list[float]] = {name: [] for name in plan}
        for _ in range(args.rounds):
            for name, fn in plan.items():
                spent, wall = measure(fn, args.calls, variants)
                cpu[name].append(spent / args.calls)
                walls[name].extend(wall)
        variants.close()
    finally:
        upstream.terminate()
        upstream.wait(15)

    report: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "calls_per_round": args.calls,
        "rounds": args.rounds,
        "variants": {},
    }
    print(f"{args.rounds} rounds x {args.calls} sequential tools/call of math.add per variant")
    print(f"{'variant':50} {'CPU us/call':>12} {'(rounds)':>22} {'p50 us':>8} {'p99 us':>8}")
    for name in plan:
        wall = sorted(walls[name])
        row: dict[str, Any] = {
            "cpu_us_per_call": round(statistics.median(cpu[name]) * 1e6, 1),
            "cpu_us_per_call_rounds": [round(c * 1e6, 1) for c in cpu[name]],
            "p50_us": round(statistics.median(wall) * 1e6, 1),
            "p99_us": round(wall[min(len(wall) - 1, int(len(wall) * 0.99))] * 1e6, 1),
        }
        report["variants"][name] = row
        rounds = " ".join(f"{c:.0f}" for c in row["cpu_us_per_call_rounds"])
        print(f"{name:50} {row['cpu_us_per_call']:12.1f} {rounds:>22} {row['p50_us']:8.0f} {row['p99_us']:8.0f}")
    client = report["variants"]["UpstreamClient.call_tool (no outputSchema)"]["cpu_us_per_call"]
    reference = report["variants"]["httpx.Client.post + json (reference)"]["cpu_us_per_call"]
    report["client_to_httpx_cpu_ratio"] = round(client / reference, 2)
    print(f"UpstreamClient (no outputSchema) / httpx CPU per call: {report['client_to_httpx_cpu_ratio']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
