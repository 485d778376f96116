"""Charge throughput through HTTP, with GET /health as the framework's floor.

Run from the project root:

    .venv/bin/python bench/charge.py                     # prints a table
    .venv/bin/python bench/charge.py --json bench.json   # also writes the figures as JSON

What it does, in about 30 seconds: creates a throwaway database on the
embedded PostgreSQL server (or on the server of ``DATABASE_URL``), migrates it,
provisions a sponsor and an agent wallet with an API key, starts gunicorn
(gthread) on a free 127.0.0.1 port with ``RATE_LIMIT_REQUESTS`` raised so the
limiter never refuses, then measures requests per second and p50/p99 latency of
``GET /health`` and of ``POST /v1/billing/charge`` (each with a fresh
Idempotency-Key) at concurrency 1 and 8, and for each the CPU per request of
every party over the same window: gunicorn (master and workers), PostgreSQL
(the backends of the benchmark's database and the server's own processes), the
load generator itself, their total and the requests/s the machine's cores
would reach at that total. It stops the server and drops the database at the
end. Each charge costs 0.0001 credits, far below the velocity limit. Options:
``--seconds`` per measurement (default 5), ``--workers`` and ``--threads`` for
gunicorn (default 2 and 4).

The load generator is bench/loadgen.py, the same for the charge and for its
``GET /health`` reference: one thread per unit of concurrency, each with one
persistent HTTP/1.1 connection, a request counted good only with status 200
and the expected body (a ledger entry; ``{"status": "ok"}``), failures counted.
Each path is warmed up for a second (figures discarded) before it is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
PY = sys.executable

import loadgen  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def server_url() -> str:
    """A URL of the server to benchmark on (any database of it)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    from devtools import pg

    return pg.start()


def admin_sql(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as conn:
        conn.execute(statement)


def setup_data(env: dict[str, str]) -> dict[str, str]:
    """Migrate, then create a funded agent wallet and its key (in a child process with the bench database)."""
    subprocess.run([PY, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True)
    script = (
        "import json\n"
        "from decimal import Decimal\n"
        "from billing import services\n"
        "from access import services as key_services\n"
        "s = services.wallet_create_sponsor(name='bench', initial_credits=Decimal(100000))\n"
        "a = services.wallet_create_agent(parent=s, name='bench-agent', initial_balance=Decimal(50000))\n"
        "k = key_services.api_key_create(wallet=a, name='bench')\n"
        "print(json.dumps({'wallet_id': a.wallet_id, 'secret': k.secret}))\n"
    )
    out = subprocess.run(
        [PY, "manage.py", "shell", "-c", script], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def start_server(env: dict[str, str], port: int, workers: int, threads: int) -> subprocess.Popen[bytes]:
    cmd = [
        PY,
        "-m",
        "gunicorn",
        "-c",
        "python:config.gunicorn",
        "config.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("gunicorn exited during start-up")
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("gunicorn did not answer /health within 30 s")


def measure(
    name: str,
    port: int,
    concurrency: int,
    seconds: float,
    make_request: Callable[[int], loadgen.Request],
    check: Callable[[loadgen.Response], bool],
    parties: dict[str, loadgen.CpuMeter | None],
) -> dict[str, Any]:
    """``make_request`` from ``concurrency`` workers for ``seconds`` (bench/loadgen.py); latency in milliseconds,
    CPU per request of each party."""
    result = loadgen.run(
        "127.0.0.1", port, make_request, check, concurrency=concurrency, seconds=seconds, parties=parties
    )
    result["requests"], result["requests_per_second"] = result.pop("calls"), result.pop("calls_per_s")
    return {"endpoint": name, **result}


def main() -> int:
    parser = argparse.ArgumentParser(description="Charge throughput through HTTP.")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--json", dest="json_path", help="write the results to this file")
    args = parser.parse_args()

    base = server_url()
    db_name = f"tollgate_bench_{secrets.token_hex(4)}"
    admin_sql(base, f'CREATE DATABASE "{db_name}"')
    env = {
        **os.environ,
        "DATABASE_URL": with_database(base, db_name),
        "RATE_LIMIT_REQUESTS": str(10**9),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "LOG_LEVEL": "WARNING",
    }
    server: subprocess.Popen[bytes] | None = None
    results: list[dict[str, Any]] = []
    try:
        data = setup_data(env)
        port = free_port()
        server = start_server(env, port, args.workers, args.threads)
        parties: dict[str, loadgen.CpuMeter | None] = {
            "gateway": loadgen.ProcessTree(server.pid),
            "postgres": loadgen.postgres_meter(env["DATABASE_URL"]),
        }
        headers = {"X-API-Key": data["secret"]}
        charge_path = f"/v1/billing/charge?wallet_id={data['wallet_id']}&service_category=tooling&units=0.001"

        def health(index: int) -> loadgen.Request:
            return loadgen.Request("GET", "/health")

        def health_ok(response: loadgen.Response) -> bool:
            return response.status == 200 and json.loads(response.body).get("status") == "ok"

        def charge(index: int) -> loadgen.Request:
            return loadgen.Request("POST", charge_path, {**headers, "Idempotency-Key": secrets.token_hex(12)})

        def charge_ok(response: loadgen.Response) -> bool:
            return response.status == 200 and "entry_id" in json.loads(response.body)

        for name, request, check in (
            ("GET /health", health, health_ok),
            ("POST /v1/billing/charge", charge, charge_ok),
        ):
            loadgen.run("127.0.0.1", port, request, check, concurrency=4, seconds=1)  # warm up the code path
            for concurrency in (1, 8):
                results.append(measure(name, port, concurrency, args.seconds, request, check, parties))
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
        admin_sql(base, f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')

    header = f"{'endpoint':<26}{'conc':>5}{'requests':>10}{'errors':>8}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['endpoint']:<26}{r['concurrency']:>5}{r['requests']:>10}{r['errors']:>8}"
            f"{r['requests_per_second']:>10}{r['p50_ms']:>10}{r['p99_ms']:>10}"
        )
    by_case = {f"{r['endpoint']} c{r['concurrency']}": {**r, "calls_per_s": r["requests_per_second"]} for r in results}
    print("\n" + loadgen.cpu_table(by_case).replace("per call", "per request"))
    loadgen.report_errors({k: {**r, "calls": r["requests"]} for k, r in by_case.items()})
    if args.json_path:
        meta = {
            "workers": args.workers,
            "threads": args.threads,
            "seconds": args.seconds,
            "cpus": os.cpu_count(),
            "load_generator": loadgen.DESCRIPTION,
        }
        Path(args.json_path).write_text(json.dumps({"config": meta, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
