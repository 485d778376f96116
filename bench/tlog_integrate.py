"""Transparency-log integration lag under load, and what the pending-leaf trigger adds to a statement's INSERT.

    .venv/bin/python bench/tlog_integrate.py [--seconds 5] [--rate 500] [--writers 2] [--interval 2] [--json PATH]

Creates a throwaway database (``bench_tlog_integrate``), then for ``--seconds`` runs ``--writers``
threads appending audit events (``audit_record``: each INSERT fires the tlog_leaf_pending trigger) at
``--rate`` statements per second in all (each writer paced to its share; a machine that cannot keep
up writes as fast as it can, and the figure is then the highest rate it sustained, reported as such),
while the integrator runs as ``make run`` runs it: ``manage.py tlog_integrate``, its own process,
a pass every ``--interval`` seconds. After the writers stop, the integrator runs until no leaf is
pending. The lag of a leaf is from its event's ``created_at`` to its integration (the leaf's
``created_at``, taken in the transaction that signs its checkpoint): median, p99 and max (target:
p99 under 10 s at 500 statements/s). The trigger's cost is the median time of one ``audit_record``
with the trigger on and with it disabled (``ALTER TABLE audit_event DISABLE TRIGGER``), sequential,
in alternating blocks, same database. Prints a markdown table; ``--json PATH`` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from governed_call import to_url  # noqa: E402


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
    parser.add_argument("--rate", type=float, default=500.0, help="target statements per second, all writers")
    parser.add_argument("--interval", type=float, default=2.0, help="the integrator's pause between passes")
    parser.add_argument("--inserts", type=int, default=500, help="sequential inserts per trigger on/off sample")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--database", default="bench_tlog_integrate")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tollgate-bench-keys-") as key_dir:
        _setup(args.database, key_dir)
        from django.db import connection, connections
        from psycopg import conninfo

        from audit.services import audit_record
        from devtools import pg
        from tlog.models import Leaf, PendingLeaf

        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            tenants = [f"spn_bench{i:017d}" for i in range(args.writers)]
            stop = threading.Event()
            written = [0] * args.writers

            per_writer = args.rate / args.writers

            def write(n: int) -> None:
                started = time.monotonic()
                try:
                    while not stop.is_set():
                        audit_record(event="bench.load", ok=True, tenant_id=tenants[n], detail={"i": written[n]})
                        written[n] += 1
                        ahead = started + written[n] / per_writer - time.monotonic()
                        if ahead > 0:
                            stop.wait(ahead)
                finally:
                    connections.close_all()

            # The integrator as `make run` starts it (devtools/run.py), on this database.
            base = os.environ.get("DATABASE_URL") or pg.start()
            env = {
                **os.environ,
                "DATABASE_URL": to_url(conninfo.make_conninfo(base, dbname=connection.settings_dict["NAME"])),
                "TLOG_CHECKPOINT_INTERVAL": str(args.interval),
            }
            audit_record(event="bench.start", ok=True, tenant_id=tenants[0], detail={})
            integrator = subprocess.Popen([sys.executable, "manage.py", "tlog_integrate"], cwd=ROOT, env=env)
            try:
                # The writers start once the integrator has made its first pass: its start-up is no lag.
                while PendingLeaf.objects.exists() and integrator.poll() is None:
                    time.sleep(0.2)
                threads = [threading.Thread(target=write, args=(n,)) for n in range(args.writers)]
                for thread in threads:
                    thread.start()
                time.sleep(args.seconds)
                stop.set()
                for thread in threads:
                    thread.join()
                while PendingLeaf.objects.exists() and integrator.poll() is None:  # what the writers left
                    time.sleep(0.2)
            finally:
                integrator.send_signal(signal.SIGTERM)
                integrator.wait(60)
            if integrator.returncode not in (0, -signal.SIGTERM):
                raise SystemExit(f"the integrator exited with {integrator.returncode}")
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(DISTINCT created_at) FROM tlog_leaf")
                passes = int(cursor.fetchone()[0])
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT EXTRACT(EPOCH FROM l.created_at - e.created_at) FROM tlog_leaf l "
                    "JOIN audit_event e ON e.event_id = l.statement_id AND e.chain = l.tenant_id "
                    "WHERE l.kind = 'audit_event' AND e.event = 'bench.load'"
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
        "target_statements_per_second": args.rate,
        # The target rate kept (within 5 %), or the highest rate this machine sustained.
        "rate_sustained": sum(written) / args.seconds >= 0.95 * args.rate,
        "leaves": leaves,
        "integrating_passes": passes,
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
        f"| {args.writers} writers at {args.rate:g}/s, {args.seconds:g} s, a pass every {args.interval:g} s | "
        f"{figures['statements_per_second']:,} | {figures['lag_ms_median']} ms | {figures['lag_ms_p99']} ms | "
        f"{figures['lag_ms_max']} ms | {figures['insert_us_with_trigger']} / "
        f"{figures['insert_us_without_trigger']} µs |"
    )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
