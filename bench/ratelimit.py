"""Per-request cost of the rate limiter's default store (one upsert into an UNLOGGED PostgreSQL table).

    .venv/bin/python bench/ratelimit.py [--seconds 3] [--json PATH]

Charges a key's window with ``billing.ratelimit.bucket_charge`` in a loop, as the
middleware does once per request (autocommit, no transaction), beside the round trip
of ``SELECT 1`` on the same connection in the same run: the ratio is the limiter's
cost in database round trips. A per-process memory cache is measured too, as the
floor a shared store cannot reach. Needs the database (``DATABASE_URL``, or the
embedded server ``make bench`` starts), which it migrates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
if not os.environ.get("DATABASE_URL"):
    from devtools import pg  # the settings only point at the embedded server; start it

    pg.ensure_running()

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from billing.ratelimit import bucket_charge  # noqa: E402


def per_call_us(fn: Callable[[], object], seconds: float) -> tuple[float, int]:
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            fn()
        count += 50
    return (time.perf_counter() - start) / count * 1e6, count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    bucket = f"bench:{os.getpid()}"
    call_command("migrate", interactive=False, verbosity=0)

    def select_one() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    settings.RATE_LIMIT_BACKEND = "database"
    database_us, n1 = per_call_us(lambda: bucket_charge(bucket, 1, 60), args.seconds)
    select_us, n2 = per_call_us(select_one, args.seconds)
    settings.RATE_LIMIT_BACKEND = "cache"
    memory_us, n3 = per_call_us(lambda: bucket_charge(bucket, 1, 60), args.seconds)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM billing_rate_limit_window WHERE bucket = %s", [bucket])
    result = {
        "database_us_per_request": round(database_us, 1),
        "select_one_us": round(select_us, 1),
        "memory_cache_us_per_request": round(memory_us, 2),
        "round_trips": round(database_us / select_us, 2),
        "samples": {"database": n1, "select_one": n2, "memory": n3},
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
