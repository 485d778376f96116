"""Transparency-log integration lag under load, and what the pending-leaf trigger adds to a statement's INSERT.

    .venv/bin/python bench/tlog_integrate.py [--seconds 5] [--writers 2] [--interval 2] [--json PATH]

Creates a throwaway database (``bench_tlog_integrate``), then for ``--seconds`` runs ``--writers``
threads appending audit events (``audit_record``: each INSERT fires the tlog_leaf_pending trigger)
while the integrator loop (``tlog_integrate``'s pass, every ``--interval`` seconds) indexes them and
signs checkpoints. The lag of a leaf is from its event's ``created_at`` to its integration (the
leaf's ``created_at``, taken in the transaction that signs its checkpoint): median, p99 and max. The
trigger's cost is the median time of one ``audit_record`` with the trigger on and with it disabled
(``ALTER TABLE audit_event DISABLE TRIGGER``), sequential, in alternating blocks, same database.
Prints a markdown table; ``--json PATH`` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup(db_name: str, key_dir: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["TOLLGATE_TEST_DB"] = db_name
    os.environ["SIGNING_KEY_FILE"] = str(Path(key_dir) / "signing-keys.json")
    os.environ["SIGNING_KEY_PRIVATE"] = ""
    os.environ["TLOG_KEY_FILE"] = str(Path(key_dir) / "tlog-key.json")
    os.environ["TLOG_KEY_PRIVATE"] = ""
    if not os.environ.get("DATABASE_URL"):
        from devtools import pg  # the settings only point at the embedded server; start it

        pg.ensure_running()
    import django

    django.setup()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _insert_us(tenant: str, n: int) -> float:
    from audit.services import audit_record

    timings = []
    for _ in range(n):
        started = time.perf_counter()
        audit_record(event="bench.insert", ok=True, tenant_id=tenant, detail={"n": 1})
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--interval", type=float, default=2.0, help="the integrator's pause between passes")
    parser.add_argument("--inserts", type=int, default=500, help="sequential inserts per trigger on/off sample")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--database", default="bench_tlog_integrate")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tollgate-bench-keys-") as key_dir:
        _setup(args.database, key_dir)
        from django.db import connection, connections

        from audit.services import audit_record
        from tlog.management.commands.tlog_integrate import integrate_pass
        from tlog.models import Leaf

        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            tenants = [f"spn_bench{i:017d}" for i in range(args.writers)]
            stop = threading.Event()
            written = [0] * args.writers

            def write(n: int) -> None:
                try:
                    while not stop.is_set():
                        audit_record(event="bench.load", ok=True, tenant_id=tenants[n], detail={"i": written[n]})
                        written[n] += 1
                finally:
                    connections.close_all()

            checkpoints = [0]

            def integrate() -> None:
                try:
                    while not stop.is_set():
                        if integrate_pass():
                            checkpoints[0] += 1
                        stop.wait(args.interval)
                    integrate_pass()  # what the writers left
                finally:
                    connections.close_all()

            threads = [threading.Thread(target=write, args=(n,)) for n in range(args.writers)]
            threads.append(threading.Thread(target=integrate))
            for thread in threads:
                thread.start()
            time.sleep(args.seconds)
            stop.set()
            for thread in threads:
                thread.join()
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT EXTRACT(EPOCH FROM l.created_at - e.created_at) FROM tlog_leaf l "
                    "JOIN audit_event e ON e.event_id = l.statement_id AND e.chain = l.tenant_id "
                    "WHERE l.kind = 'audit_event'"
                )
                lags = [float(row[0]) for row in cursor.fetchall()]
            leaves = Leaf.objects.count()
            _insert_us(tenants[0], 50)  # warm-up
            # Alternating blocks, so that other work on the machine weighs on both alike.
            on: list[float] = []
            off: list[float] = []
            for _ in range(10):
                on.append(_insert_us(tenants[0], args.inserts // 10))
                with connection.cursor() as cursor:
                    cursor.execute("ALTER TABLE audit_event DISABLE TRIGGER tlog_leaf_audit_event")
                off.append(_insert_us(tenants[0], args.inserts // 10))
                with connection.cursor() as cursor:
                    cursor.execute("ALTER TABLE audit_event ENABLE TRIGGER tlog_leaf_audit_event")
            with_trigger, without_trigger = statistics.median(on), statistics.median(off)
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)

    figures = {
        "benchmark": "tlog_integrate",
        "seconds": args.seconds,
        "writers": args.writers,
        "interval_seconds": args.interval,
        "statements": sum(written),
        "statements_per_second": round(sum(written) / args.seconds),
        "leaves": leaves,
        "integrating_passes": checkpoints[0],
        "lag_ms_median": round(statistics.median(lags) * 1000, 1),
        "lag_ms_p99": round(_percentile(lags, 0.99) * 1000, 1),
        "lag_ms_max": round(max(lags) * 1000, 1),
        "insert_us_with_trigger": round(with_trigger, 1),
        "insert_us_without_trigger": round(without_trigger, 1),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    print("| load | statements/s | lag median | lag p99 | lag max | audit_record with / without the trigger |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {args.writers} writers, {args.seconds:g} s, a pass every {args.interval:g} s | "
        f"{figures['statements_per_second']:,} | {figures['lag_ms_median']} ms | {figures['lag_ms_p99']} ms | "
        f"{figures['lag_ms_max']} ms | {figures['insert_us_with_trigger']} / "
        f"{figures['insert_us_without_trigger']} µs |"
    )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
