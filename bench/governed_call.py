"""Governed tools/call throughput and latency through /mcp, beside a direct call to the same upstream.

    .venv/bin/python bench/governed_call.py [--seconds 10] [--workers 2] [--threads 4] [--json PATH]

Starts, on this machine: a throwaway database on the embedded PostgreSQL server
(or the server of DATABASE_URL), the bundled demo upstream (official MCP SDK),
and gunicorn serving the gateway on 127.0.0.1. Provisions a funded agent, a
key and a permit, then measures at concurrency 1 and 8:

* governed ``tools/call`` of ``math.add`` through ``POST /mcp`` (2026-07-28
  stateless requests, a fresh idempotency key per call: the full loop of
  authorize, reserve, debit, dispatch, receipt, audit);
* the same ``tools/call`` sent directly to the upstream (the in-run reference);
* at concurrency 8, the governed call spread over 8 agent wallets of one tenant (each
  worker its own wallet, key and permit): calls on one wallet serialize on its row lock;
* at concurrency 8, the governed call spread over three upstream servers (the demo upstream
  three times, in three processes: the server ``default`` and two records with the tool
  prefixes ``s2`` and ``s3``), the load generator cycling ``math.add``, ``s2.math.add`` and
  ``s3.math.add``, against the one-server call, in alternating windows (target: throughput
  within 10 % of one server, as a ratio);
* at concurrency 8, the governed call with tracing on (a second gunicorn instance with
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a local OTLP/HTTP sink process that reads and
  discards every export) against tracing off (the first instance), in alternating windows;
  the gateway party counts both instances (the idle one adds about nothing);
* at concurrency 8, the governed call with the transparency log on (the pending-leaf triggers of
  tlog/sql/tlog_leaf_pending.sql present) against off (the triggers dropped), same gateway, in
  alternating windows (target: throughput with the log at least 0.95 of without, as a ratio);
* with ``--history N``, at concurrency 8, the measured wallet after N earlier calls copied
  into its tenant's tables, against an agent wallet of a second tenant without history,
  in alternating windows so that a drift of the host's speed weighs on both alike;
* every "in alternating windows" pair: each case twice ``--seconds`` in all, in six windows
  (A B, B A, A B, ...; ``ALTERNATING_ROUNDS``);
* CPU per call of every party, in every case (the references' too), over each measured
  window: the gateway (utime + stime of the gunicorn master and workers, from /proc),
  PostgreSQL (the backends of the throwaway database and the server's own processes),
  the upstream (the demo upstream's process), the load generator (this process,
  ``getrusage``), their total, the calls/s the machine's cores would reach at that total,
  and the rest of the machine's busy CPU (other work, kernel threads).

The load generator is bench/loadgen.py, the same for the governed calls and for the direct
reference: one thread per unit of concurrency, each with one persistent HTTP/1.1
connection; a call is good only with status 200 and a JSON-RPC body carrying ``result``,
and every failure is counted. Each path is warmed up (figures discarded) before it is
measured.

Everything (gateway, PostgreSQL, upstream, load generator) shares the machine,
as the targets assume. Stops everything and drops the database at the end.
The rate limit is raised for the run (RATE_LIMIT_REQUESTS) and the tool is
priced at 0.0001 credits so the velocity freeze does not trigger.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import loadgen  # noqa: E402
from loadgen import postgres_pid, process_tree_cpu  # noqa: E402, F401  (kept importable from here)


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


def database_url(name: str) -> tuple[str, str]:
    """(admin URL, URL of the throwaway database ``name``) on DATABASE_URL's server or the embedded one."""
    base = os.environ.get("DATABASE_URL")
    if not base:
        from devtools import pg

        base = pg.start()
    import psycopg
    from psycopg import conninfo

    info = conninfo.conninfo_to_dict(base)
    admin = conninfo.make_conninfo(base, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    del info
    return admin, conninfo.make_conninfo(base, dbname=name)


def to_url(dsn: str) -> str:
    from psycopg import conninfo

    d = conninfo.conninfo_to_dict(dsn)
    host = str(d.get("host") or "")
    user, password, dbname = d.get("user", "postgres"), d.get("password", ""), d["dbname"]
    if host.startswith("/"):
        return f"postgresql://{user}:{password}@/{dbname}?host={host}"
    return f"postgresql://{user}:{password}@{host}:{d.get('port', 5432)}/{dbname}"


def call_body(tool: str, args: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": args,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                **meta,
            },
        },
    }


MCP_HEADERS = {
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "math.add",
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}


def tools_call(headers: dict[str, str], meta: dict[str, Any], tool: str = "math.add") -> loadgen.Request:
    """``tools/call`` of ``tool`` (the demo's ``math.add``, under a server's prefix or none) as ``POST /mcp``
    (the gateway's path and the upstream's alike)."""
    body = json.dumps(call_body(tool, {"a": 1, "b": 2}, meta), separators=(",", ":")).encode()
    return loadgen.Request("POST", "/mcp", {**headers, "Mcp-Name": tool} if tool != "math.add" else headers, body)


# The three-server case: the server ``default`` (UPSTREAM_MCP_URL, no prefix) and two records with prefixes.
EXTRA_SERVERS = ("s2", "s3")
THREE_SERVER_TOOLS = ("math.add", *(f"{prefix}.math.add" for prefix in EXTRA_SERVERS))


def start_upstream(port: int, env: dict[str, str], procs: list[subprocess.Popen[bytes]]) -> int:
    """Start one demo upstream process on ``port`` (appended to ``procs``); returns its pid once it answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcpgateway.demo_upstream", "--port", str(port), "--stateless"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs.append(proc)
    wait_http(f"http://127.0.0.1:{port}/stats")
    return proc.pid


SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
"""
"""A local OTLP/HTTP receiver that reads and discards every export (the traced case's collector)."""


def has_result(response: loadgen.Response) -> bool:
    """A call is good only when it is a 200 whose JSON-RPC body carries ``result`` (not ``error``)."""
    return response.status == 200 and "result" in json.loads(response.body)


def run_load(
    port: int,
    make_request: Callable[[int], loadgen.Request],
    concurrency: int,
    seconds: float,
    parties: dict[str, loadgen.CpuMeter | None] | None = None,
) -> dict[str, Any]:
    """``tools/call`` from ``concurrency`` workers for ``seconds`` (bench/loadgen.py); worker i sends
    ``make_request(i)``. With ``parties`` also reports each party's CPU per call over the window."""
    return loadgen.run(
        "127.0.0.1", port, make_request, has_result, concurrency=concurrency, seconds=seconds, parties=parties
    )


def provision(env: dict[str, str], upstream_port: int, procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    """Migrate the throwaway database, start the demo upstream (appended to ``procs``), sync and price
    its tools, and create the funded agents, keys and permits of SETUP; returns their credentials."""
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run([*manage, "ensure_signing_key"], cwd=ROOT, env=env, check=True, capture_output=True)
    start_upstream(upstream_port, env, procs)
    subprocess.run([*manage, "sync_tools"], cwd=ROOT, env=env, check=True, capture_output=True)
    subprocess.run([*manage, "set_tool_price", "math.add", "0.0001"], cwd=ROOT, env=env, check=True)
    setup = subprocess.run(
        [*manage, "shell", "-c", SETUP], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    )
    return dict(json.loads(setup.stdout.strip().splitlines()[-1]))


# A ratio between two cases of one run is the figure a target reads (three servers / one, tracing on / off,
# the log on / off, history / fresh): each case gets twice --seconds, in six windows taken in turn and
# reversed every round (A B B A A B ...), so a drift of a shared host's speed during the run, which moved the
# ratio by 0.2 between two runs with two windows of --seconds / 2 each, weighs on both cases alike.
ALTERNATING_FACTOR = 2
ALTERNATING_ROUNDS = 6


def _rate_ratio(results: dict[str, Any], case: str, reference: str) -> float | None:
    """calls/s of ``case`` over ``reference``'s (None when either is missing or the reference is 0)."""
    if case not in results or reference not in results or not results[reference]["calls_per_s"]:
        return None
    return round(results[case]["calls_per_s"] / results[reference]["calls_per_s"], 3)


def _columns(conn: Any, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        [table],
    ).fetchall()
    return [r[0] for r in rows]


def log_triggers(dsn: str, *, on: bool) -> None:
    """The transparency log on: tlog/sql/tlog_leaf_pending.sql applied (each trigger dropped and created
    anew); off: its triggers dropped, so a governed call's statements append no pending leaf."""
    import psycopg

    sql = (Path(__file__).resolve().parent.parent / "tlog" / "sql" / "tlog_leaf_pending.sql").read_text()
    with psycopg.connect(dsn, autocommit=True) as conn:
        if on:
            conn.execute(sql.encode())
            return
        for trigger, table in re.findall(r"CREATE TRIGGER (\w+) AFTER INSERT ON (\w+)", sql):
            conn.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}".encode())


def add_history(dsn: str, wallet_id: str, calls: int) -> dict[str, Any]:
    """Give ``wallet_id`` (and its tenant) ``calls`` earlier governed calls, by copying its real ones.

    Every row a governed call leaves (action, receipt, the charge's two ledger entries, the
    wallet's audit events) is copied with suffixed ids and idempotency keys, as many times as
    it takes, in one transaction, so the tables and their indexes hold ``calls`` more calls'
    worth of rows. The copies keep their original times (spend counters are per hour and do
    not grow with history either way). Copied audit events get new sequence numbers at the
    head of the tenant's chain; their hashes are copies, so this database's chain no longer
    verifies (it is dropped after the run).
    """
    import psycopg

    started = time.monotonic()
    with psycopg.connect(dsn) as conn:
        conn.execute("SET synchronous_commit = off")
        (existing,) = conn.execute(
            "SELECT count(*) FROM mcpgateway_action WHERE wallet_id = %s AND receipt_id IS NOT NULL", [wallet_id]
        ).fetchone()  # type: ignore[misc]
        if not existing:
            raise SystemExit("add_history: the wallet has no finished calls to copy")
        copies = -(-calls // existing)
        suffixed = {
            "mcpgateway_action": {"action_id", "idempotency_key", "ledger_entry_id", "receipt_id"},
            "receipts_receipt": {"receipt_id", "action_id", "ledger_entry_id", "refund_entry_id", "audit_event_id"},
            "billing_ledger_entry": {"entry_id", "transaction_id", "refund_of_id"},
        }
        where = {
            "mcpgateway_action": "t.wallet_id = %(w)s AND t.receipt_id IS NOT NULL",
            "receipts_receipt": "t.wallet_id = %(w)s",
            "billing_ledger_entry": (
                "t.transaction_id IN (SELECT e.transaction_id FROM billing_ledger_entry e "
                "JOIN mcpgateway_action a ON a.ledger_entry_id = e.entry_id "
                "WHERE a.wallet_id = %(w)s AND a.receipt_id IS NOT NULL)"
            ),
        }
        for table, ids in suffixed.items():
            cols = _columns(conn, table)
            exprs = [f"t.{c} || 'h' || g" if c in ids else f"t.{c}" for c in cols]
            conn.execute(
                f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(exprs)} "
                f"FROM {table} t CROSS JOIN generate_series(1, %(n)s) AS g WHERE {where[table]}",
                {"w": wallet_id, "n": copies},
            )
        (chain, head) = conn.execute(
            "SELECT h.chain, h.seq FROM audit_chain_head h JOIN billing_wallet w ON w.tenant_id = h.chain "
            "WHERE w.wallet_id = %s FOR UPDATE OF h",
            [wallet_id],
        ).fetchone()  # type: ignore[misc]
        cols = _columns(conn, "audit_event")
        exprs = [
            "t.event_id || 'h' || g" if c == "event_id" else
            "%(head)s + row_number() OVER (ORDER BY g, t.seq)" if c == "seq" else f"t.{c}"
            for c in cols
        ]  # fmt: skip
        conn.execute(
            f"INSERT INTO audit_event ({', '.join(cols)}) SELECT {', '.join(exprs)} "
            "FROM audit_event t CROSS JOIN generate_series(1, %(n)s) AS g "
            "WHERE t.chain = %(c)s AND t.wallet_id = %(w)s",
            {"w": wallet_id, "n": copies, "c": chain, "head": head},
        )
        conn.execute(
            "UPDATE audit_chain_head SET seq = (SELECT max(seq) FROM audit_event WHERE chain = %(c)s) "
            "WHERE chain = %(c)s",
            {"c": chain},
        )
        conn.commit()
        conn.execute("ANALYZE")
        (actions,) = conn.execute("SELECT count(*) FROM mcpgateway_action WHERE wallet_id = %s", [wallet_id]).fetchone()  # type: ignore[misc]
    return {"earlier_calls": int(actions), "copies": copies, "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)  # what `make run` deploys (GUNICORN_THREADS)
    parser.add_argument(
        "--history",
        type=int,
        default=100_000,
        help="earlier calls to give the measured wallet before the long-history case (0: skip it)",
    )
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    admin_dsn, dsn = database_url("bench_governed_call")
    db_url = to_url(dsn)
    upstream_port, gateway_port, traced_port, sink_port = free_port(), free_port(), free_port(), free_port()
    extra_ports = {prefix: free_port() for prefix in EXTRA_SERVERS}
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "RATE_LIMIT_REQUESTS": "100000000",
        "UPSTREAM_MCP_URL": f"http://127.0.0.1:{upstream_port}/mcp",
        "LOG_LEVEL": "WARNING",
        "PUBLIC_BASE_URL": f"http://127.0.0.1:{gateway_port}",
        "SIGNING_KEY_FILE": str(ROOT / ".data" / "bench-keys" / "signing-keys.json"),
    }
    env.pop("TOLLGATE_TESTING", None)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        creds = provision(env, upstream_port, procs)
        spread = creds["spread"]  # 8 agent wallets of the same tenant, each with its key and permit
        upstream_pids = [procs[0].pid]  # provision() started the first upstream
        # The three-server case: two more demo upstreams, recorded as servers with a tool prefix each.
        upstream_pids += [start_upstream(port, env, procs) for port in extra_ports.values()]
        urls = {prefix: f"http://127.0.0.1:{port}/mcp" for prefix, port in extra_ports.items()}
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", SERVERS],
            cwd=ROOT,
            env={**env, "BENCH_SERVERS": json.dumps(urls)},
            check=True,
            capture_output=True,
        )

        def gunicorn(port: int, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "gunicorn", "-c", "python:config.gunicorn", "config.wsgi:application",
                    "--bind", f"127.0.0.1:{port}",
                    "--workers", str(args.workers), "--threads", str(args.threads), "--log-level", "warning",
                ],
                cwd=ROOT,
                # Each instance its own metrics directory (config/gunicorn.py makes one when unset).
                env={**{k: v for k, v in env.items() if k != "PROMETHEUS_MULTIPROC_DIR"}, **extra_env},
            )  # fmt: skip
            procs.append(proc)
            wait_http(f"http://127.0.0.1:{port}/health")
            return proc

        # The traced instance's collector: reads and discards every export.
        procs.append(subprocess.Popen([sys.executable, "-c", SINK, str(sink_port)], cwd=ROOT))
        wait_http(f"http://127.0.0.1:{sink_port}/")
        gateway = gunicorn(gateway_port, {})
        traced = gunicorn(traced_port, {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}"})
        # Every party's CPU is measured in every case, the references' too: an idle party shows as ~0.
        parties: dict[str, loadgen.CpuMeter | None] = {
            "gateway": loadgen.ProcessTree(gateway.pid),
            "postgres": loadgen.postgres_meter(dsn),
            "upstream": loadgen.ProcessTree(upstream_pids[0]),
        }
        three_parties = {**parties, "upstream": loadgen.ProcessTrees(upstream_pids)}
        both_parties = {**parties, "gateway": loadgen.ProcessTrees([gateway.pid, traced.pid])}

        gateway_headers = {**MCP_HEADERS, "X-API-Key": creds["secret"]}
        spread_headers = [{**MCP_HEADERS, "X-API-Key": w["secret"]} for w in spread]

        def governed(index: int) -> loadgen.Request:
            return tools_call(gateway_headers, {"permit_id": creds["permit_id"], "idempotency_key": uuid.uuid4().hex})

        def direct(index: int) -> loadgen.Request:
            return tools_call(MCP_HEADERS, {"io.tollgate/idempotency-key": uuid.uuid4().hex})

        fresh_headers = {**MCP_HEADERS, "X-API-Key": creds["fresh"]["secret"]}

        def governed_fresh(index: int) -> loadgen.Request:
            meta = {"permit_id": creds["fresh"]["permit_id"], "idempotency_key": uuid.uuid4().hex}
            return tools_call(fresh_headers, meta)

        turns = itertools.count()

        def governed_three(index: int) -> loadgen.Request:
            tool = THREE_SERVER_TOOLS[next(turns) % len(THREE_SERVER_TOOLS)]  # the servers in turn
            return tools_call(
                gateway_headers, {"permit_id": creds["permit_id"], "idempotency_key": uuid.uuid4().hex}, tool
            )

        def governed_spread(index: int) -> loadgen.Request:
            wallet = spread[index % len(spread)]  # each worker its own wallet, key and permit
            meta = {"permit_id": wallet["permit_id"], "idempotency_key": uuid.uuid4().hex}
            return tools_call(spread_headers[index % len(spread)], meta)

        # Warm up both paths (connections, caches, the workers' first requests).
        run_load(gateway_port, governed, 4, 2)
        run_load(upstream_port, direct, 4, 1)
        run_load(gateway_port, governed_three, 4, 2)
        run_load(traced_port, governed, 4, 2)
        results = {}
        for c in (1, 8):
            results[f"direct_c{c}"] = run_load(upstream_port, direct, c, args.seconds, parties)
            results[f"governed_c{c}"] = run_load(gateway_port, governed, c, args.seconds, parties)
        results["governed_spread_c8"] = run_load(gateway_port, governed_spread, 8, args.seconds, parties)

        def alternating(
            cases: dict[str, Callable[[int], loadgen.Request]],
            meters: dict[str, loadgen.CpuMeter | None],
            ports: dict[str, int] | None = None,
            before: dict[str, Callable[[], None]] | None = None,
        ) -> None:
            """``cases`` at concurrency 8 in alternating windows (the gateway's port unless ``ports`` says): each
            case ``ALTERNATING_FACTOR`` times ``--seconds`` in all, in ``ALTERNATING_ROUNDS`` windows."""
            results.update(
                loadgen.run_alternating(
                    "127.0.0.1",
                    gateway_port,
                    cases,
                    has_result,
                    concurrency=8,
                    seconds=args.seconds * ALTERNATING_FACTOR,
                    parties=meters,
                    ports=ports,
                    before=before,
                    rounds=ALTERNATING_ROUNDS,
                )
            )

        # Three upstream servers against one; the upstream party is all three.
        alternating({"governed_one_server_c8": governed, "governed_three_servers_c8": governed_three}, three_parties)
        # The transparency log on (its pending-leaf triggers present) against off (dropped), same gateway.
        alternating(
            {"governed_log_on_c8": governed, "governed_log_off_c8": governed},
            parties,
            before={"governed_log_on_c8": lambda: log_triggers(dsn, on=True),
                    "governed_log_off_c8": lambda: log_triggers(dsn, on=False)},
        )  # fmt: skip
        log_triggers(dsn, on=True)
        # Tracing on (the second instance, exporting to the sink) against off.
        alternating(
            {"governed_untraced_c8": governed, "governed_traced_c8": governed},
            both_parties,
            {"governed_traced_c8": traced_port},
        )
        history: dict[str, Any] = {}
        if args.history:
            # The long-history case: the same wallet and tenant after ``--history`` earlier calls.
            print(f"adding {args.history:,} earlier calls to the measured wallet ...", file=sys.stderr, flush=True)
            history = add_history(dsn, creds["wallet_id"], args.history)
            run_load(gateway_port, governed, 4, 2)  # warm up after the bulk insert
            run_load(gateway_port, governed_fresh, 4, 2)
            # Against a wallet of a tenant without history, in alternating windows (history, fresh,
            # fresh, history, ...): the host's speed drifts within a run, and the fresh figure measured a
            # minute earlier is no reference then.
            alternating({"governed_history_c8": governed, "governed_fresh_c8": governed_fresh}, parties)
        report = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "date": time.strftime("%Y-%m-%d"),
            "gunicorn": f"{args.workers} workers x {args.threads} threads",
            "load_generator": loadgen.DESCRIPTION,
            "results": results,
            "overhead_ratio_p50_c1": round(results["governed_c1"]["p50_ms"] / results["direct_c1"]["p50_ms"], 2),
            "throughput_ratio_c8": round(
                results["governed_c8"]["calls_per_s"] / results["direct_c8"]["calls_per_s"], 2
            ),
            "three_servers_ratio_c8": _rate_ratio(results, "governed_three_servers_c8", "governed_one_server_c8"),
            "traced_ratio_c8": _rate_ratio(results, "governed_traced_c8", "governed_untraced_c8"),
            "log_ratio_c8": _rate_ratio(results, "governed_log_on_c8", "governed_log_off_c8"),
            "history": history,
            "history_ratio_c8": (
                round(results["governed_history_c8"]["calls_per_s"] / results["governed_fresh_c8"]["calls_per_s"], 3)
                if "governed_history_c8" in results
                else None
            ),
            "targets": {
                "governed_c8_calls_per_s": 400,
                "governed_spread_c8_calls_per_s": 400,
                "governed_c1_p50_ms": 6,
                "gateway_cpu_ms_per_call": 3,
                "history_ratio_c8_min": 0.9,
                "three_servers_ratio_c8_min": 0.9,
                "traced_ratio_c8_min": 0.9,
                "log_ratio_c8_min": 0.95,
            },
        }
        print("| path | concurrency | calls/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|")
        for name, r in results.items():
            cells = [name.rsplit("_", 1)[0], r["concurrency"], r["calls_per_s"], r["p50_ms"], r["p99_ms"], r["errors"]]
            print("| " + " | ".join(str(c) for c in cells) + " |")
        print(f"\np50 overhead ratio at c=1 (governed / direct): {report['overhead_ratio_p50_c1']}")
        print(f"throughput ratio at c=8 (governed / direct): {report['throughput_ratio_c8']}")
        print(f"throughput ratio at c=8 (three servers / one): {report['three_servers_ratio_c8']}")
        print(f"throughput ratio at c=8 (tracing on / off): {report['traced_ratio_c8']}")
        print(f"throughput ratio at c=8 (transparency log on / off): {report['log_ratio_c8']}")
        print("\n" + loadgen.cpu_table(results))
        loadgen.report_errors(results)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        return 0
    finally:
        # Last started, first stopped: the traced gateway flushes its spans while the sink still listens.
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        import psycopg

        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute('DROP DATABASE IF EXISTS "bench_governed_call" WITH (FORCE)')


SERVERS = """
import json, os
from decimal import Decimal
from billing.services import tool_price_set
from mcpgateway.models import UpstreamServer
from mcpgateway.services.upstreams import upstream_server_create, upstream_server_sync
for prefix, url in json.loads(os.environ["BENCH_SERVERS"]).items():
    server = upstream_server_create(slug=prefix, name=prefix, url=url, tool_prefix=prefix, actor="bench")
    report = upstream_server_sync(server=UpstreamServer.objects.get(pk=server.pk), actor="bench")
    for name in report.created:
        tool_price_set(tool=name, credits=Decimal("0.0001"))
"""
"""Two more upstream servers (``BENCH_SERVERS``: prefix -> URL), their tools synced and priced as ``math.add``."""


SETUP = """
import json
from datetime import timedelta
from decimal import Decimal
from django.utils import timezone
from access.services import api_key_create
from billing.services import wallet_create_agent, wallet_create_sponsor
from permits.services import PermitTerms, permit_issue
sponsor = wallet_create_sponsor(name="bench", initial_credits=Decimal("200000"))
agent = wallet_create_agent(parent=sponsor, name="bench agent", initial_balance=Decimal("50000"))
key = api_key_create(wallet=agent, name="bench")
permit = permit_issue(terms=PermitTerms(wallet=agent, issuer_wallet=sponsor, allowed_tools=["*"],
    max_credits=Decimal("50000"), max_calls=None, expires_at=timezone.now() + timedelta(days=1)),
    idempotency_scope=sponsor.wallet_id, idempotency_key="bench", request_hash="bench").permit
# A second tenant, left without history: the long-history case's reference (measured in alternation).
fresh_sponsor = wallet_create_sponsor(name="bench fresh", initial_credits=Decimal("200000"))
fresh_agent = wallet_create_agent(parent=fresh_sponsor, name="bench fresh agent", initial_balance=Decimal("50000"))
fresh_key = api_key_create(wallet=fresh_agent, name="bench fresh")
fresh_permit = permit_issue(terms=PermitTerms(wallet=fresh_agent, issuer_wallet=fresh_sponsor, allowed_tools=["*"],
    max_credits=Decimal("50000"), max_calls=None, expires_at=timezone.now() + timedelta(days=1)),
    idempotency_scope=fresh_sponsor.wallet_id, idempotency_key="bench-fresh",
    request_hash="bench-fresh").permit
fresh = {"secret": fresh_key.secret, "permit_id": fresh_permit.permit_id}
spread = []
for i in range(8):
    w = wallet_create_agent(parent=sponsor, name=f"bench agent {i}", initial_balance=Decimal("5000"))
    k = api_key_create(wallet=w, name="bench")
    p = permit_issue(terms=PermitTerms(wallet=w, issuer_wallet=sponsor, allowed_tools=["*"],
        max_credits=Decimal("5000"), max_calls=None, expires_at=timezone.now() + timedelta(days=1)),
        idempotency_scope=sponsor.wallet_id, idempotency_key=f"bench-{i}",
        request_hash=f"bench-{i}").permit
    spread.append({"secret": k.secret, "permit_id": p.permit_id})
print(json.dumps({"secret": key.secret, "permit_id": permit.permit_id, "wallet_id": agent.wallet_id, "spread": spread,
    "fresh": fresh}))
"""


if __name__ == "__main__":
    raise SystemExit(main())
