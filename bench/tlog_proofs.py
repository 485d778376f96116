"""Transparency-log proofs from stored hashes (target: a proof in under 5 ms at 1,000,000 leaves).

    .venv/bin/python bench/tlog_proofs.py [--leaves 1000000] [--proofs 2000] [--json PATH]

Builds, once, an in-memory store of every complete subtree's hash of a tree of ``--leaves``
statements (what the gateway's log table holds), then times, per proof, the generation from that
store through the ``read(level, index)`` callback the server will use plus the verification
(``tollgate_client.tlog``): inclusion proofs of random leaves in the whole tree, and consistency
proofs between random sizes. Also counts the stored hashes read per proof (O(log n)) and, as the
in-run reference, the time of one SHA-256 of a 65-byte node input. Imports no Django; needs no database.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "client"))

from tollgate_client.tlog import (  # noqa: E402
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    tree_hash,
    verify_consistency,
    verify_inclusion,
)

TARGET_MS = 5.0


def build(leaves: int) -> list[list[bytes]]:
    """Every complete subtree's hash, ``levels[level][index]``, of ``leaves`` statements."""
    level = [leaf_hash(b'{"n":%d,"type":"receipt"}' % i) for i in range(leaves)]
    levels = [level]
    while len(level) > 1:
        level = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        levels.append(level)
    return levels


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leaves", type=int, default=1_000_000)
    parser.add_argument("--proofs", type=int, default=2000)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    started = time.perf_counter()
    levels = build(args.leaves)
    build_seconds = time.perf_counter() - started
    # The store stands for the gateway's table: keep the collector from rescanning its two million objects.
    gc.collect()
    gc.freeze()
    reads = 0

    def read(level: int, index: int) -> bytes:
        nonlocal reads
        reads += 1
        return levels[level][index]

    n = args.leaves
    rng = random.Random(6962)
    roots: dict[int, bytes] = {}

    def root(size: int) -> bytes:
        if size not in roots:
            roots[size] = tree_hash(size, lambda lv, ix: levels[lv][ix])
        return roots[size]

    root(n)
    inclusion_ms: list[float] = []
    inclusion_reads: list[int] = []
    for _ in range(args.proofs):
        index = rng.randrange(n)
        leaf = levels[0][index]
        reads = 0
        t0 = time.perf_counter()
        proof = inclusion_proof(index, n, read)
        verify_inclusion(index, n, leaf, proof, roots[n])
        inclusion_ms.append((time.perf_counter() - t0) * 1000)
        inclusion_reads.append(reads)
    consistency_ms: list[float] = []
    consistency_reads: list[int] = []
    pairs = [tuple(sorted(rng.sample(range(1, n + 1), 2))) for _ in range(args.proofs)]
    for old, new in pairs:
        root(old), root(new)
    for old, new in pairs:
        reads = 0
        t0 = time.perf_counter()
        proof = consistency_proof(old, new, read)
        verify_consistency(old, new, proof, roots[old], roots[new])
        consistency_ms.append((time.perf_counter() - t0) * 1000)
        consistency_reads.append(reads)
    node_input = b"\x01" + bytes(64)
    t0 = time.perf_counter()
    for _ in range(100_000):
        hashlib.sha256(node_input).digest()
    sha_us = (time.perf_counter() - t0) * 10  # µs per hash: seconds / 100,000 * 1e6
    result = {
        "machine": f"{platform.machine()} python {platform.python_version()}",
        "leaves": n,
        "proofs": args.proofs,
        "build_seconds": round(build_seconds, 1),
        "inclusion_ms_median": round(statistics.median(inclusion_ms), 3),
        "inclusion_ms_p99": round(percentile(inclusion_ms, 0.99), 3),
        "inclusion_reads_max": max(inclusion_reads),
        "consistency_ms_median": round(statistics.median(consistency_ms), 3),
        "consistency_ms_p99": round(percentile(consistency_ms, 0.99), 3),
        "consistency_reads_max": max(consistency_reads),
        "sha256_node_us": round(sha_us, 3),
        "target_ms": TARGET_MS,
        "meets_target": percentile(inclusion_ms, 0.99) < TARGET_MS and percentile(consistency_ms, 0.99) < TARGET_MS,
    }
    print("| figure | value |\n|---|---|")
    print(f"| tree of {n:,} leaves built in | {result['build_seconds']} s |")
    print(
        f"| inclusion proof, generate + verify: median / p99 | "
        f"{result['inclusion_ms_median']} / {result['inclusion_ms_p99']} ms "
        f"({result['inclusion_reads_max']} reads max) |"
    )
    print(
        f"| consistency proof, generate + verify: median / p99 | "
        f"{result['consistency_ms_median']} / {result['consistency_ms_p99']} ms "
        f"({result['consistency_reads_max']} reads max) |"
    )
    print(f"| reference: one SHA-256 of a node | {result['sha256_node_us']} µs |")
    print(f"| target p99 < {TARGET_MS:g} ms met | {'yes' if result['meets_target'] else 'NO'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
