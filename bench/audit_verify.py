"""Audit chain verification throughput, beside the machine's raw SHA-256 rate.

    .venv/bin/python bench/audit_verify.py                      # 100,000 events, 3 runs
    .venv/bin/python bench/audit_verify.py --events 20000 --runs 5 --json bench-audit.json

Creates a throwaway database (``bench_audit_verify`` on the configured
PostgreSQL server, the embedded one when ``DATABASE_URL`` is unset), runs the
migrations, writes one chain of ``--events`` events hashed exactly as
``audit_record`` hashes them (bulk COPY, to keep setup short), then times
``audit_chain_verify`` over the whole chain: rows streamed from PostgreSQL,
canonical bytes rebuilt, SHA-256 recomputed, links and head checked, and a
checkpoint signed. The same run measures hashlib SHA-256 over inputs of the
same sizes (previous hash + canonical event) and the verification loop alone
over rows already in memory (the pure-Python reference loop an offline
verifier uses), so the figures can be compared across machines.
The database is dropped at the end; signing keys go to a temporary key file.

Prints a markdown table row; ``--json PATH`` also writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup(db_name: str, key_dir: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["TOLLGATE_TEST_DB"] = db_name
    os.environ["SIGNING_KEY_FILE"] = str(Path(key_dir) / "signing-keys.json")
    os.environ["SIGNING_KEY_PRIVATE"] = ""
    if not os.environ.get("DATABASE_URL"):
        from devtools import pg  # the settings only point at the embedded server; start it

        pg.ensure_running()
    import django

    django.setup()


def _fill(chain: str, n: int) -> tuple[list[tuple[Any, ...]], list[int]]:
    """Write ``n`` chained events with COPY; return the rows (verification order) and hash input sizes."""
    from django.db import connection
    from django.utils import timezone
    from psycopg.types.json import Jsonb

    from audit.evidence_core import GENESIS_HASH
    from audit.models import ChainHead
    from common.canonical import event_bytes, iso_utc
    from common.ids import new_id

    prev_hex = GENESIS_HASH
    prev_raw = bytes.fromhex(prev_hex)
    base = timezone.now() - timedelta(hours=1)
    rows: list[tuple[Any, ...]] = []
    sizes: list[int] = []
    events = ["tool.called", "ledger.charge", "api_key.created", "permit.issued"]
    for seq in range(1, n + 1):
        created_at = base + timedelta(microseconds=seq * 7)
        fields = (
            new_id("evt"),
            events[seq % 4],
            chain,
            f"agt_{seq % 50:022d}",
            f"key_{seq % 90:022d}",
            "search.web" if seq % 2 else None,
            "/mcp",
            None,
            new_id("req"),
            seq % 17 != 0,
            {"receipt_id": new_id("rcpt"), "credits": "0.25000000", "outcome": "success"},
            created_at,
        )
        event_id, event, tenant_id, wallet_id, key_id, tool, endpoint, decision, request_id, ok, detail, _ = fields
        payload = event_bytes(chain, seq, event_id, event, tenant_id, wallet_id, key_id, tool, endpoint,
                              decision, request_id, ok, detail, iso_utc(created_at))  # fmt: skip
        digest = hashlib.sha256(prev_raw + payload).digest()
        sizes.append(len(prev_raw) + len(payload))
        rows.append((seq, event_id, event, tenant_id, wallet_id, key_id, tool, endpoint, decision, request_id, ok,
                     detail, created_at, prev_hex, digest.hex()))  # fmt: skip
        prev_raw, prev_hex = digest, digest.hex()
    columns = ("seq, event_id, event, tenant_id, wallet_id, key_id, tool, endpoint, policy_decision_id, "
               "request_id, ok, detail, created_at, prev_hash, hash, chain")  # fmt: skip
    connection.ensure_connection()
    raw = connection.connection
    assert raw is not None
    with raw.cursor() as cursor, cursor.copy(f"COPY audit_event ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row((*row[:11], Jsonb(row[11]), *row[12:], chain))
    raw.commit()
    ChainHead.objects.update_or_create(chain=chain, defaults={"seq": n, "head_hash": prev_hex})
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE audit_event")
    return rows, sizes


def _sha256_rate(sizes: list[int]) -> float:
    """Hashes per second of hashlib SHA-256 over inputs of the given sizes (one call per input)."""
    inputs = [os.urandom(size) for size in sizes]
    sha256 = hashlib.sha256
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for data in inputs:
            sha256(data).digest()
        best = min(best, time.perf_counter() - started)
    return len(inputs) / best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", dest="json_path", help="also write the figures to this JSON file")
    parser.add_argument("--database", default="bench_audit_verify", help="throwaway database name")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tollgate-bench-keys-") as key_dir:
        _setup(args.database, key_dir)
        from django.db import connection

        from audit.chain_verification import audit_chain_verify
        from audit.evidence_core import verify_chain_rows

        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            chain = "spn_" + "b" * 22
            started = time.perf_counter()
            rows, sizes = _fill(chain, args.events)
            fill_seconds = time.perf_counter() - started
            audit_chain_verify(chain=chain)  # warm-up: signing key, caches, plans
            timings = []
            for _ in range(args.runs):
                started = time.perf_counter()
                result = audit_chain_verify(chain=chain)
                timings.append(time.perf_counter() - started)
                if not result.valid or result.checked_events != args.events:
                    print(f"verification failed: {result}", file=sys.stderr)
                    return 1
            started = time.perf_counter()
            core = verify_chain_rows(chain, rows)
            core_seconds = time.perf_counter() - started
            assert core.valid
            sha_rate = _sha256_rate(sizes)
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)

    best, median = min(timings), statistics.median(timings)
    figures = {
        "benchmark": "audit_verify",
        "events": args.events,
        "runs": args.runs,
        "verify_seconds_best": round(best, 4),
        "verify_seconds_median": round(median, 4),
        "verify_events_per_second_best": round(args.events / best),
        "verify_events_per_second_median": round(args.events / median),
        "core_events_per_second_in_memory": round(args.events / core_seconds),
        "sha256_hashes_per_second_same_size": round(sha_rate),
        "mean_hash_input_bytes": round(sum(sizes) / len(sizes), 1),
        "verify_vs_sha256": round((args.events / median) / sha_rate, 4),
        "fill_seconds": round(fill_seconds, 2),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    print(
        "| benchmark | events | verify (median) | verify (best) | reference loop, in memory | "
        "SHA-256 same-size inputs | verify / SHA-256 |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| audit verify-chain | {args.events:,} | {figures['verify_events_per_second_median']:,} events/s | "
        f"{figures['verify_events_per_second_best']:,} events/s | "
        f"{figures['core_events_per_second_in_memory']:,} events/s | "
        f"{figures['sha256_hashes_per_second_same_size']:,} hashes/s ({figures['mean_hash_input_bytes']} B) | "
        f"{figures['verify_vs_sha256']:.1%} |"
    )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
