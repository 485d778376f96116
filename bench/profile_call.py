"""Where one governed tools/call spends its time: a profile of the hot path, in one process.

    .venv/bin/python bench/profile_call.py [--calls 300] [--top 25] [--json PATH]

Sets up a throwaway database (as bench/governed_call.py does) and the bundled
demo upstream, then sends governed ``tools/call`` requests through Django's
WSGI handler in this process (no HTTP server in front: the figures are the
gateway's own work plus its waits on PostgreSQL and the upstream). Reports:

* SQL statements and database round trips per call (every statement Django
  sends, counted by a connection execute wrapper; a statement is one round trip);
* WAL bytes per call (``pg_current_wal_insert_lsn()`` before and after the timed calls: every
  row and index entry the calls write, the server's autovacuum included) and Python function
  calls per call (cProfile): figures that do not move with the host's load;
* CPU and wall time per call in this process;
* the top entries of a cProfile of the calls, by cumulative and by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))
from governed_call import call_body, database_url, free_port, provision, to_url  # noqa: E402

DB_NAME = "bench_profile_call"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    admin_dsn, dsn = database_url(DB_NAME)
    upstream_port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": to_url(dsn),
        "RATE_LIMIT_REQUESTS": "100000000",
        "UPSTREAM_MCP_URL": f"http://127.0.0.1:{upstream_port}/mcp",
        "LOG_LEVEL": "WARNING",
        "PUBLIC_BASE_URL": "http://127.0.0.1:8000",
        "SIGNING_KEY_FILE": str(ROOT / ".data" / "bench-keys" / "signing-keys.json"),
    }
    env.pop("TOLLGATE_TESTING", None)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        creds = provision(env, upstream_port, procs)
        os.environ.update(env)
        report = profile(creds, args.calls, args.top)
        print(report["text"])
        if args.json:
            Path(args.json).write_text(json.dumps({k: v for k, v in report.items() if k != "text"}, indent=2) + "\n")
        return 0
    finally:
        for upstream in procs:
            upstream.terminate()
            upstream.wait(15)
        import psycopg

        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def profile(creds: dict[str, Any], calls: int, top: int) -> dict[str, Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.db import connection
    from django.test import Client

    client = Client(
        HTTP_X_API_KEY=creds["secret"],
        HTTP_MCP_PROTOCOL_VERSION="2026-07-28",
        HTTP_MCP_METHOD="tools/call",
        HTTP_MCP_NAME="math.add",
        HTTP_ACCEPT="application/json, text/event-stream",
    )

    def one() -> None:
        meta = {"permit_id": creds["permit_id"], "idempotency_key": uuid.uuid4().hex}
        body = json.dumps(call_body("math.add", {"a": 1, "b": 2}, meta))
        r = client.post("/mcp", data=body, content_type="application/json")
        if r.status_code != 200 or b'"result"' not in r.content:
            raise SystemExit(f"call failed: {r.status_code} {r.content[:300]!r}")

    for _ in range(20):  # warm up: connections, caches, imports
        one()

    statements: Counter[str] = Counter()

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements[" ".join(sql.split())[:90]] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        for _ in range(20):
            one()
    per_call = sum(statements.values()) / 20

    def wal_position() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_insert_lsn()")
            return str(cursor.fetchone()[0])

    wal0 = wal_position()
    cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(calls):
        one()
    cpu1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    wal1 = wal_position()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(%s, %s)", [wal1, wal0])
        wal_bytes = float(cursor.fetchone()[0]) / calls
    cpu_ms = ((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)) / calls * 1000
    wall_ms = (wall1 - wall0) / calls * 1000

    sections = _time_sections(calls, one)

    _CALLS[0] = calls
    profiler = cProfile.Profile(time.process_time)  # CPU time, not waits
    profiler.enable()
    for _ in range(calls):
        one()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    function_calls = stats.total_calls / calls  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"/(audit|billing|config|mcpgateway|permits|receipts)/", top)
    stats.sort_stats("tottime").print_stats(top)

    lines = [
        f"governed tools/call in one process, {calls} calls",
        f"CPU per call (this process): {cpu_ms:.2f} ms; wall per call: {wall_ms:.2f} ms",
        f"SQL statements (= database round trips) per call: {per_call:.1f}",
        f"WAL bytes per call (the server's, over the {calls} timed calls): {wal_bytes:.0f}",
        f"Python function calls per call (cProfile): {function_calls:.0f}",
        "",
        "CPU per call by section (inclusive; process_time around each function, no profiler):",
        *[f"  {ms:6.2f} ms  {name}" for name, ms in sections.items()],
        "",
        "statements per call:",
        *[f"  {n / 20:4.1f}  {sql}" for sql, n in statements.most_common()],
        "",
        out.getvalue(),
    ]
    return {
        "calls": calls,
        "cpu_ms_per_call": round(cpu_ms, 2),
        "wall_ms_per_call": round(wall_ms, 2),
        "statements_per_call": per_call,
        "wal_bytes_per_call": round(wal_bytes),
        "function_calls_per_call": round(function_calls),
        "statements": {sql: n / 20 for sql, n in statements.most_common()},
        "sections_cpu_ms": sections,
        "top_own_time": _top_own_time(profiler, top),
        "text": "\n".join(lines),
    }


def _top_own_time(profiler: cProfile.Profile, top: int) -> list[str]:
    """The ``top`` entries by own CPU time, one line each: own ms per call, calls per call, function."""
    stats = pstats.Stats(profiler)
    total_calls = max(1, _CALLS[0])
    entries = []
    for (filename, line, name), (_cc, ncalls, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = filename.replace(str(ROOT) + "/", "").replace(".venv/lib/python3.11/site-packages/", "")
        entries.append((tottime, ncalls, f"{where}:{line}({name})"))
    entries.sort(reverse=True)
    return [
        f"{tottime / total_calls * 1000:7.3f} ms {ncalls / total_calls:7.1f}x  {where}"
        for tottime, ncalls, where in entries[:top]
    ]


_CALLS = [0]

SECTIONS = [
    ("config.wsgi", None),  # placeholder: the whole request is timed around the client call
    ("access.ratelimit", "charge_request"),
    ("access.selectors", "api_key_authenticate_charging"),
    ("mcpgateway.services.governed", "governed_call"),
    ("mcpgateway.services.lookup", "_cached"),
    ("mcpgateway.services.lookup", "_lookup"),  # ~0 once the process's cache holds the call's rows
    ("mcpgateway.services.governed", "_governed"),
    ("mcpgateway.services.claim", "_phase1"),
    ("permits.services.authorization", "authorize"),
    ("audit.services", "audit_event_prepare"),
    ("mcpgateway.services.claim", "_claim"),
    ("mcpgateway.services.dispatch", "_dispatch"),
    ("mcpgateway.services.finish", "_phase3"),
    ("mcpgateway.services.finish", "_finish"),
    ("receipts.services", "receipt_prepare"),
    ("audit.signing", "sign_statement"),
    ("receipts.services", "receipt_statement"),
    ("mcpgateway.services.call", "request_document"),
    ("common.canonical", "check_round_trip"),
    ("common.canonical", "event_bytes"),
    ("mcpgateway.services.dispatch", "upstream_client"),
]


def _time_sections(calls: int, one: Any) -> dict[str, float]:
    """CPU ms per call spent inside each function of SECTIONS (inclusive of what it calls)."""
    import importlib

    spent: dict[str, float] = {"whole request": 0.0}
    originals = []
    for module_name, attr in SECTIONS:
        if attr is None:
            continue
        module = importlib.import_module(module_name)
        original = getattr(module, attr)
        label = f"{module_name}.{attr}"
        spent[label] = 0.0

        def timed(*args: Any, __original: Any = original, __label: str = label, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return __original(*args, **kwargs)
            finally:
                spent[__label] += time.process_time() - started

        originals.append((module, attr, original))
        # Patch the name everywhere it was imported (``from x import f`` copies the reference).
        for other in list(sys.modules.values()):
            if other is not None and getattr(other, attr, None) is original:
                setattr(other, attr, timed)
                originals.append((other, attr, original))
    try:
        for _ in range(calls):
            started = time.process_time()
            one()
            spent["whole request"] += time.process_time() - started
    finally:
        for module, attr, original in originals:
            setattr(module, attr, original)
    return {name: round(total / calls * 1000, 3) for name, total in spent.items()}


if __name__ == "__main__":
    raise SystemExit(main())
