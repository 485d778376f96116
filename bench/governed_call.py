"""Governed tools/call throughput and latency through /mcp, beside a direct call to the same upstream.

    .venv/bin/python bench/governed_call.py [--seconds 10] [--workers 2] [--threads 8] [--json PATH]

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
* gateway CPU per governed call (utime + stime of the gunicorn master and workers over the
  run, divided by the calls) and PostgreSQL CPU per call (the server's processes), read
  from /proc.

Everything (gateway, PostgreSQL, upstream, load generator) shares the machine,
as the targets assume. Stops everything and drops the database at the end.
The rate limit is raised for the run (RATE_LIMIT_REQUESTS) and the tool is
priced at 0.0001 credits so the velocity freeze does not trigger.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree_cpu(root_pid: int) -> float:
    """CPU seconds (user + system) of ``root_pid`` and its direct children, from /proc."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == root_pid or ppid == root_pid:
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def postgres_pid(dsn: str) -> int | None:
    """The PostgreSQL server's main process, when it runs on this machine."""
    import psycopg

    try:
        with psycopg.connect(dsn) as conn:
            data_dir = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
        return int(Path(data_dir, "postmaster.pid").read_text().splitlines()[0])
    except Exception:  # a remote server, or no permission: report nothing rather than a wrong figure
        return None


def run_load(
    url: str,
    headers: dict[str, str] | list[dict[str, str]],
    make_meta: Any,
    concurrency: int,
    seconds: float,
    cpu_of: dict[str, int | None] | None = None,
) -> dict[str, Any]:
    """Calls from ``concurrency`` threads for ``seconds``; worker i uses ``headers[i]`` and ``make_meta(i)``
    when given lists/callables per worker. With ``cpu_of`` ({label: root pid}) also reports CPU ms per call."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    per_worker = isinstance(headers, list)
    cpu_before = {k: process_tree_cpu(pid) for k, pid in (cpu_of or {}).items() if pid}

    def worker(index: int) -> None:
        local: list[float] = []
        bad = 0
        worker_headers = headers[index % len(headers)] if isinstance(headers, list) else headers
        meta_of = (lambda: make_meta(index)) if per_worker else make_meta
        with httpx.Client(headers=worker_headers, timeout=30) as client:
            while time.monotonic() < stop_at:
                body = call_body("math.add", {"a": 1, "b": 2}, meta_of())
                started = time.perf_counter()
                r = client.post(url, json=body)
                local.append(time.perf_counter() - started)
                if r.status_code != 200 or "result" not in r.json():
                    bad += 1
        with lock:
            latencies.extend(local)
            errors[0] += bad

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    latencies.sort()
    n = len(latencies)
    result: dict[str, Any] = {
        "concurrency": concurrency,
        "calls": n,
        "errors": errors[0],
        "calls_per_s": round(n / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2) if n else None,
        "p99_ms": round(latencies[min(n - 1, int(n * 0.99))] * 1000, 2) if n else None,
    }
    for label, pid in (cpu_of or {}).items():
        if pid and n:
            result[f"{label}_cpu_ms_per_call"] = round((process_tree_cpu(pid) - cpu_before[label]) / n * 1000, 2)
    return result


def provision(env: dict[str, str], upstream_port: int, procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    """Migrate the throwaway database, start the demo upstream (appended to ``procs``), sync and price
    its tools, and create the funded agents, keys and permits of SETUP; returns their credentials."""
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run([*manage, "ensure_signing_key"], cwd=ROOT, env=env, check=True, capture_output=True)
    procs.append(
        subprocess.Popen(
            [sys.executable, "-m", "mcpgateway.demo_upstream", "--port", str(upstream_port), "--stateless"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    wait_http(f"http://127.0.0.1:{upstream_port}/stats")
    subprocess.run([*manage, "sync_tools"], cwd=ROOT, env=env, check=True, capture_output=True)
    subprocess.run([*manage, "set_tool_price", "math.add", "0.0001"], cwd=ROOT, env=env, check=True)
    setup = subprocess.run(
        [*manage, "shell", "-c", SETUP], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    )
    return dict(json.loads(setup.stdout.strip().splitlines()[-1]))


def _columns(conn: Any, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        [table],
    ).fetchall()
    return [r[0] for r in rows]


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
    parser.add_argument("--threads", type=int, default=8)
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
    upstream_port, gateway_port = free_port(), free_port()
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
        procs.append(
            subprocess.Popen(
                [
                    sys.executable, "-m", "gunicorn", "-c", "python:config.gunicorn", "config.wsgi:application",
                    "--bind", f"127.0.0.1:{gateway_port}", "--worker-class", "gthread",
                    "--workers", str(args.workers), "--threads", str(args.threads), "--log-level", "warning",
                ],
                cwd=ROOT,
                env=env,
            )
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{gateway_port}/health")
        cpu_of = {"gateway": procs[-1].pid, "postgres": postgres_pid(dsn)}

        gateway_headers = {
            "X-API-Key": creds["secret"],
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": "math.add",
            "Accept": "application/json, text/event-stream",
        }
        upstream_headers = {k: v for k, v in gateway_headers.items() if k != "X-API-Key"}

        def governed_meta() -> dict[str, Any]:
            return {"permit_id": creds["permit_id"], "idempotency_key": uuid.uuid4().hex}

        def direct_meta() -> dict[str, Any]:
            return {"io.tollgate/idempotency-key": uuid.uuid4().hex}

        gw_url, up_url = f"http://127.0.0.1:{gateway_port}/mcp", f"http://127.0.0.1:{upstream_port}/mcp"
        # Warm up both paths (connections, caches, the workers' first requests).
        run_load(gw_url, gateway_headers, governed_meta, 4, 2)
        run_load(up_url, upstream_headers, direct_meta, 4, 1)
        results = {}
        for c in (1, 8):
            results[f"direct_c{c}"] = run_load(up_url, upstream_headers, direct_meta, c, args.seconds)
            results[f"governed_c{c}"] = run_load(gw_url, gateway_headers, governed_meta, c, args.seconds, cpu_of=cpu_of)
        spread_headers = [{**gateway_headers, "X-API-Key": w["secret"]} for w in spread]

        def spread_meta(index: int) -> dict[str, Any]:
            return {"permit_id": spread[index % len(spread)]["permit_id"], "idempotency_key": uuid.uuid4().hex}

        results["governed_spread_c8"] = run_load(gw_url, spread_headers, spread_meta, 8, args.seconds, cpu_of=cpu_of)
        history: dict[str, Any] = {}
        if args.history:
            # The long-history case: the same wallet and tenant after ``--history`` earlier calls.
            print(f"adding {args.history:,} earlier calls to the measured wallet ...", file=sys.stderr, flush=True)
            history = add_history(dsn, creds["wallet_id"], args.history)
            run_load(gw_url, gateway_headers, governed_meta, 4, 2)  # warm up after the bulk insert
            results["governed_history_c8"] = run_load(
                gw_url, gateway_headers, governed_meta, 8, args.seconds, cpu_of=cpu_of
            )
        report = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "date": time.strftime("%Y-%m-%d"),
            "gunicorn": f"{args.workers} workers x {args.threads} threads",
            "results": results,
            "overhead_ratio_p50_c1": round(results["governed_c1"]["p50_ms"] / results["direct_c1"]["p50_ms"], 2),
            "throughput_ratio_c8": round(
                results["governed_c8"]["calls_per_s"] / results["direct_c8"]["calls_per_s"], 2
            ),
            "history": history,
            "history_ratio_c8": (
                round(results["governed_history_c8"]["calls_per_s"] / results["governed_c8"]["calls_per_s"], 3)
                if "governed_history_c8" in results
                else None
            ),
            "targets": {
                "governed_c8_calls_per_s": 400,
                "governed_spread_c8_calls_per_s": 400,
                "governed_c1_p50_ms": 6,
                "gateway_cpu_ms_per_call": 3,
                "history_ratio_c8_min": 0.9,
            },
        }
        print("| path | concurrency | calls/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|")
        for name, r in results.items():
            cells = [name.rsplit("_", 1)[0], r["concurrency"], r["calls_per_s"], r["p50_ms"], r["p99_ms"], r["errors"]]
            print("| " + " | ".join(str(c) for c in cells) + " |")
        print(f"\np50 overhead ratio at c=1 (governed / direct): {report['overhead_ratio_p50_c1']}")
        print(f"throughput ratio at c=8 (governed / direct): {report['throughput_ratio_c8']}")
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        import psycopg

        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute('DROP DATABASE IF EXISTS "bench_governed_call" WITH (FORCE)')


SETUP = """
import json
from datetime import timedelta
from decimal import Decimal
from django.utils import timezone
from billing.services import api_key_create, wallet_create_agent, wallet_create_sponsor
from permits.services import permit_issue
sponsor = wallet_create_sponsor(name="bench", initial_credits=Decimal("200000"))
agent = wallet_create_agent(parent=sponsor, name="bench agent", initial_balance=Decimal("50000"))
key = api_key_create(wallet=agent, name="bench")
permit = permit_issue(wallet=agent, issuer_wallet=sponsor, issued_by_key_id="", allowed_tools=["*"],
    max_credits=Decimal("50000"), max_calls=None, expires_at=timezone.now() + timedelta(days=1),
    subject_key_id=None, idempotency_scope=sponsor.wallet_id, idempotency_key="bench", request_hash="bench").permit
spread = []
for i in range(8):
    w = wallet_create_agent(parent=sponsor, name=f"bench agent {i}", initial_balance=Decimal("5000"))
    k = api_key_create(wallet=w, name="bench")
    p = permit_issue(wallet=w, issuer_wallet=sponsor, issued_by_key_id="", allowed_tools=["*"],
        max_credits=Decimal("5000"), max_calls=None, expires_at=timezone.now() + timedelta(days=1),
        subject_key_id=None, idempotency_scope=sponsor.wallet_id, idempotency_key=f"bench-{i}",
        request_hash=f"bench-{i}").permit
    spread.append({"secret": k.secret, "permit_id": p.permit_id})
print(json.dumps({"secret": key.secret, "permit_id": permit.permit_id, "wallet_id": agent.wallet_id, "spread": spread}))
"""


if __name__ == "__main__":
    raise SystemExit(main())
