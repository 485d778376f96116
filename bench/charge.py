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
Idempotency-Key) at concurrency 1 and 8. It stops the server and drops the
database at the end. Each charge costs 0.0001 credits, far below the velocity
limit. Options: ``--seconds`` per measurement (default 5), ``--workers`` and
``--threads`` for gunicorn (default 2 and 4).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PY = sys.executable


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
        "s = services.wallet_create_sponsor(name='bench', initial_credits=Decimal(100000))\n"
        "a = services.wallet_create_agent(parent=s, name='bench-agent', initial_balance=Decimal(50000))\n"
        "k = services.api_key_create(wallet=a, name='bench')\n"
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
        "--worker-class",
        "gthread",
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


def measure(name: str, concurrency: int, seconds: float, request: Any) -> dict[str, Any]:
    """Run ``request(client)`` in ``concurrency`` threads for ``seconds``; latency in milliseconds."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker() -> None:
        mine: list[float] = []
        bad = 0
        with httpx.Client(timeout=10) as client:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                ok = request(client)
                mine.append((time.perf_counter() - started) * 1000)
                bad += 0 if ok else 1
        with lock:
            latencies.extend(mine)
            errors[0] += bad

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    latencies.sort()
    p99_index = max(0, min(len(latencies) - 1, round(0.99 * len(latencies)) - 1))
    return {
        "endpoint": name,
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors[0],
        "requests_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "p99_ms": round(latencies[p99_index], 2) if latencies else None,
    }


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
        url = f"http://127.0.0.1:{port}"
        headers = {"X-API-Key": data["secret"]}
        charge_url = f"{url}/v1/billing/charge?wallet_id={data['wallet_id']}&service_category=tooling&units=0.001"

        def health(client: httpx.Client) -> bool:
            return client.get(f"{url}/health").status_code == 200

        def charge(client: httpx.Client) -> bool:
            key = {"Idempotency-Key": secrets.token_hex(12)}
            return client.post(charge_url, headers={**headers, **key}).status_code == 200

        for name, request in (("GET /health", health), ("POST /v1/billing/charge", charge)):
            with httpx.Client() as warm:
                request(warm)  # warm up the code path
            for concurrency in (1, 8):
                results.append(measure(name, concurrency, args.seconds, request))
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
    if args.json_path:
        meta = {"workers": args.workers, "threads": args.threads, "seconds": args.seconds, "cpus": os.cpu_count()}
        Path(args.json_path).write_text(json.dumps({"config": meta, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
