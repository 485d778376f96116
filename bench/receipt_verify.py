"""Offline receipt verification throughput (target: at least 5,000 verifications/s on one core).

    .venv/bin/python bench/receipt_verify.py [--seconds 3] [--json PATH]

Verifies the committed golden portable receipt (tests/golden/portable/valid.json)
with ``receipts.verify.verify_portable`` in a loop on one core, beside the raw
Ed25519 verification rate of the same machine measured in the same run, so the
ratio shows the verifier's own overhead. Imports no Django; needs no database.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit.evidence_core import load_public_key  # noqa: E402
from common.canonical import b64url_decode_strict  # noqa: E402
from receipts.verify import verify_portable  # noqa: E402


def rate(fn: Callable[[], object], seconds: float) -> tuple[float, int]:
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            fn()
        count += 100
    return count / (time.perf_counter() - start), count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    document = json.loads((ROOT / "tests/golden/portable/valid.json").read_text())
    assert verify_portable(document).valid, "golden receipt must verify"
    public = load_public_key(document["keys"]["keys"][0]["x"])
    signed = b64url_decode_strict(document["signed_bytes"])
    signature = b64url_decode_strict(document["signature"])

    portable_rate, n1 = rate(lambda: verify_portable(document), args.seconds)
    raw_rate, n2 = rate(lambda: public.verify(signature, signed), args.seconds)
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''} python {platform.python_version()}".strip(),
        "portable_verifications_per_s": round(portable_rate),
        "raw_ed25519_verifications_per_s": round(raw_rate),
        "overhead_ratio": round(raw_rate / portable_rate, 2),
        "target_per_s": 5000,
        "meets_target": portable_rate >= 5000,
        "samples": {"portable": n1, "raw": n2},
    }
    print("| figure | value |\n|---|---|")
    print(f"| offline receipt verifications/s (one core) | {result['portable_verifications_per_s']:,} |")
    print(f"| reference: raw Ed25519 verifications/s | {result['raw_ed25519_verifications_per_s']:,} |")
    print(f"| ratio raw / full | {result['overhead_ratio']} |")
    print(f"| target 5,000/s met | {'yes' if result['meets_target'] else 'NO'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
