"""CPU per ``tools/call`` of the gateway's upstream client and of the upstream, in both protocol eras, in one run.

    .venv/bin/python bench/upstream_client.py [--calls 2000] [--rounds 5] [--json PATH]

Starts the bundled demo upstream (``python -m mcpgateway.demo_upstream --port P
--stateless``, the official MCP SDK under uvicorn, which serves both protocol
eras) on 127.0.0.1, then sends ``--calls`` sequential ``tools/call`` requests of
``math.add`` per round with:

* ``UpstreamClient.call_tool`` as phase 2 of the governed call uses it (request
  id, idempotency key, extra ``_meta``, the tool's outputSchema checked), once in
  the stateless 2026-07-28 era (what ``era="auto"`` negotiates with this
  upstream: the ``_meta`` envelope, ``Mcp-Method``/``Mcp-Name``) and once in the
  handshake era (``era="handshake"``: ``MCP-Protocol-Version: 2025-11-25``, as
  the client spoke before it knew the stateless revision);
* the same without an outputSchema (the client's wire and classification only),
  in both eras;
* a plain ``httpx.Client`` posting the same JSON-RPC request in the handshake era
  and decoding the JSON answer (the in-run reference: what an httpx-based client
  cannot go below);
* a bare HTTP/1.1 exchange on one kept-alive socket in the handshake era
  (``sendall`` then ``recv`` until Content-Length is satisfied): the floor of any
  client.

The variants alternate within each round so that noise from other work on the
machine spreads over all of them. Reported per variant: CPU microseconds per
call of this process (``time.process_time``: user + system of every thread) and
of the upstream's process (utime + stime from ``/proc/<pid>/stat``), the median
over rounds, and wall p50 / p99 of the calls. Stops the upstream at the end.
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

sys.path.insert(0, str(ROOT / "bench"))
from governed_call import free_port, wait_http  # noqa: E402

from mcpgateway.upstream.client import UpstreamClient  # noqa: E402

ARGUMENTS = {"a": 1, "b": 2}
WARMUP = 200


def rpc_body(rid: str, key: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": "math.add", "arguments": ARGUMENTS, "_meta": {"io.tollgate/idempotency-key": key}},
    }


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (utime + stime) the process ``pid`` has used, from ``/proc/<pid>/stat``.

    Counted in clock ticks (10 ms at the usual 100 Hz): over a round of 2000 calls
    that is 5 us per call, so rounds much shorter than the default are coarse.
    """
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; fields[0] is the state (field 3)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime and stime: fields 14 and 15


class Variants:
    """One callable per variant; each sends one ``tools/call`` with a fresh key and checks the answer."""

    def __init__(self, url: str, port: int) -> None:
        self.n = 0
        options: dict[str, Any] = {"connect_timeout": 2.0, "read_timeout": 10.0, "total_timeout": 20.0}
        self.stateless = UpstreamClient(url, **options)
        self.handshake = UpstreamClient(url, **options, era="handshake")
        tools = {tool["name"]: tool for tool in self.stateless.list_tools()}
        self.schema = tools["math.add"]["outputSchema"]
        if not self.stateless.initialize().stateless:
            raise SystemExit("the upstream did not negotiate the stateless era")
        self.session = self.handshake.initialize()
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

    def _governed(self, client: UpstreamClient) -> None:
        key = self._key()
        result = client.call_tool(
            "math.add",
            ARGUMENTS,
            idempotency_key=key,
            request_id=key,
            extra_meta={"io.tollgate/action-id": key},
            output_schema=self.schema,
        )
        if result.kind != "success":
            raise SystemExit(f"call_tool failed: {result}")

    def _plain(self, client: UpstreamClient) -> None:
        key = self._key()
        result = client.call_tool("math.add", ARGUMENTS, idempotency_key=key, request_id=key)
        if result.kind != "success":
            raise SystemExit(f"call_tool failed: {result}")

    def stateless_schema(self) -> None:
        self._governed(self.stateless)

    def stateless_plain(self) -> None:
        self._plain(self.stateless)

    def handshake_schema(self) -> None:
        self._governed(self.handshake)

    def handshake_plain(self) -> None:
        self._plain(self.handshake)

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
        self.stateless.close()
        self.handshake.close()
        self.httpx.close()
        self.sock.close()


def measure(
    fn: Callable[[], None], calls: int, variants: Variants, upstream_pid: int
) -> tuple[float, float, list[float]]:
    """(CPU seconds of this process, CPU seconds of the upstream, wall seconds of each call) over ``calls`` calls."""
    if fn == variants.raw_socket:
        variants.fresh_socket()
    walls: list[float] = []
    upstream0 = process_cpu(upstream_pid)
    cpu0 = time.process_time()
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu0
    return cpu, process_cpu(upstream_pid) - upstream0, walls


CLIENT_STATELESS = "UpstreamClient.call_tool, stateless era (no outputSchema)"
CLIENT_HANDSHAKE = "UpstreamClient.call_tool, handshake era (no outputSchema)"
HTTPX = "httpx.Client.post + json, handshake era (reference)"


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
            "UpstreamClient.call_tool, stateless era (outputSchema checked)": variants.stateless_schema,
            CLIENT_STATELESS: variants.stateless_plain,
            "UpstreamClient.call_tool, handshake era (outputSchema checked)": variants.handshake_schema,
            CLIENT_HANDSHAKE: variants.handshake_plain,
            HTTPX: variants.httpx_post,
            "bare socket exchange, handshake era (floor)": variants.raw_socket,
        }
        for fn in plan.values():
            measure(fn, WARMUP, variants, upstream.pid)
        cpu: dict[str, list[float]] = {name: [] for name in plan}
        upstream_cpu: dict[str, list[float]] = {name: [] for name in plan}
        walls: dict[str, list[float]] = {name: [] for name in plan}
        for _ in range(args.rounds):
            for name, fn in plan.items():
                spent, upstream_spent, wall = measure(fn, args.calls, variants, upstream.pid)
                cpu[name].append(spent / args.calls)
                upstream_cpu[name].append(upstream_spent / args.calls)
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
    print(
        f"{'variant':64} {'client CPU us':>13} {'(rounds)':>24} {'upstream CPU us':>15} {'(rounds)':>29}"
        f" {'p50 us':>7} {'p99 us':>7}"
    )
    for name in plan:
        wall = sorted(walls[name])
        row: dict[str, Any] = {
            "cpu_us_per_call": round(statistics.median(cpu[name]) * 1e6, 1),
            "cpu_us_per_call_rounds": [round(c * 1e6, 1) for c in cpu[name]],
            "upstream_cpu_us_per_call": round(statistics.median(upstream_cpu[name]) * 1e6, 1),
            "upstream_cpu_us_per_call_rounds": [round(c * 1e6, 1) for c in upstream_cpu[name]],
            "p50_us": round(statistics.median(wall) * 1e6, 1),
            "p99_us": round(wall[min(len(wall) - 1, int(len(wall) * 0.99))] * 1e6, 1),
        }
        report["variants"][name] = row
        rounds = " ".join(f"{c:.0f}" for c in row["cpu_us_per_call_rounds"])
        upstream_rounds = " ".join(f"{c:.0f}" for c in row["upstream_cpu_us_per_call_rounds"])
        print(
            f"{name:64} {row['cpu_us_per_call']:13.1f} {rounds:>24} {row['upstream_cpu_us_per_call']:15.1f}"
            f" {upstream_rounds:>29} {row['p50_us']:7.0f} {row['p99_us']:7.0f}"
        )
    rows = report["variants"]
    report["client_to_httpx_cpu_ratio"] = round(
        rows[CLIENT_HANDSHAKE]["cpu_us_per_call"] / rows[HTTPX]["cpu_us_per_call"], 2
    )
    report["stateless_to_handshake_cpu_ratio"] = {
        "client": round(rows[CLIENT_STATELESS]["cpu_us_per_call"] / rows[CLIENT_HANDSHAKE]["cpu_us_per_call"], 2),
        "upstream": round(
            rows[CLIENT_STATELESS]["upstream_cpu_us_per_call"] / rows[CLIENT_HANDSHAKE]["upstream_cpu_us_per_call"], 2
        ),
    }
    print(
        f"UpstreamClient (handshake era, no outputSchema) / httpx CPU per call: {report['client_to_httpx_cpu_ratio']}"
    )
    ratios = report["stateless_to_handshake_cpu_ratio"]
    print(
        f"stateless / handshake era CPU per call (no outputSchema): client {ratios['client']},"
        f" upstream {ratios['upstream']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
