"""`make bench`: run every benchmark under bench/ and write BENCHMARKS.md at the repository root.

    .venv/bin/python -m devtools.bench                  # what `make bench` runs
    .venv/bin/python -m devtools.bench --seconds 10     # longer load measurements
    .venv/bin/python -m devtools.bench --output /tmp/b.md

Each benchmark runs as its own process with ``--json``; every figure is written
beside the reference measured in the same run (a direct upstream call,
``GET /health``, the SHA-256 rate, raw Ed25519 verification) with the ratio,
so the figures can be compared across machines. The report also records the
machine (CPU model, cores, memory, Python, PostgreSQL), the date, the load
average at the start and at the end (other work on the machine shows there),
the targets and whether they were met (never with failed requests), and the
exact commands. For the HTTP benchmarks (governed call, charge) it adds per
case the CPU per call of every party (gateway, PostgreSQL, upstream, the load
generator bench/loadgen.py), their total, the calls/s the cores would reach at
that total and the rest of the machine's busy CPU.

With ``DATABASE_URL`` unset the embedded PostgreSQL server is used, started
for the run and stopped afterwards unless it was already running. The whole
run takes about three minutes with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devtools import pg

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# Targets (bench/governed_call.py and bench/receipt_verify.py state them).
GOVERNED_C8_CALLS_PER_S = 400
GOVERNED_C1_P50_MS = 6.0
GATEWAY_CPU_MS_PER_CALL = 3.0
RECEIPT_VERIFICATIONS_PER_S = 5000
TLOG_PROOF_MS = 5.0  # bench/tlog_proofs.py: one proof at 1,000,000 leaves
CHARGE_C8_REQUESTS_PER_S = 1000
HISTORY_RATIO_MIN = 0.9  # throughput after the long history / fresh, one wallet, concurrency 8
THREE_SERVERS_RATIO_MIN = 0.9  # throughput over three upstream servers / one server, concurrency 8
TRACED_RATIO_MIN = 0.9  # throughput with tracing on (OTLP to a local sink) / off, concurrency 8
LOG_RATIO_MIN = 0.95  # throughput with the transparency log's triggers / without, concurrency 8
TLOG_LAG_P99_S = 10.0  # integration lag p99 at TLOG_TARGET_RATE statements/s, the integrator as `make run` runs it
TLOG_TARGET_RATE = 500


@dataclass
class Run:
    """One benchmark process: its command, figures (from ``--json``), output and duration."""

    name: str
    args: list[str]
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""

    @property
    def command(self) -> str:
        return shlex.join([".venv/bin/python", *self.args])


def run_benchmark(name: str, script: str, extra: list[str], env: dict[str, str]) -> Run:
    with tempfile.TemporaryDirectory(prefix="tollgate-bench-") as tmp:
        out = Path(tmp) / f"{name}.json"
        args = [f"bench/{script}", *extra]
        run = Run(name, args)
        print(f"\n=== {name}: {run.command}", flush=True)
        started = time.monotonic()
        result = subprocess.run([PY, *args, "--json", str(out)], cwd=ROOT, env=env)
        run.seconds = time.monotonic() - started
        if result.returncode != 0 or not out.exists():
            run.error = f"exit status {result.returncode}"
        else:
            run.figures = json.loads(out.read_text())
        print(f"=== {name}: {'failed, ' + run.error if run.error else 'done'} in {run.seconds:.0f} s", flush=True)
        return run


# --- Machine ----------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def postgres_version(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


def git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        # BENCHMARKS.md is the file a run rewrites: a change to it alone does not make the code measured dirty.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":!BENCHMARKS.md"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


# --- Report -----------------------------------------------------------------------------------------


def host_speed(seconds: float = 1.0) -> str:
    """Raw Ed25519 verifications per second on one core right now (bench/receipt_verify.py's reference).

    A shared virtual machine's speed drifts: on the development machine this figure has ranged
    from about 7,500 to 17,000 within a day, and every figure of a run moves with it. Read at the
    start and the end of a run, it tells which phase the run was measured in.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    public, message = key.public_key(), b"host speed " * 20
    signature = key.sign(message)
    count, started = 0, time.process_time()
    while time.process_time() - started < seconds:
        public.verify(signature, message)
        count += 1
    return f"{count / (time.process_time() - started):,.0f}"


def _n(value: Any, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int | float):
        return f"{value:,.{digits}f}"
    return str(value)


def _ratio(a: Any, b: Any) -> str:
    try:
        return f"{float(a) / float(b):.2f}"
    except (TypeError, ValueError, ZeroDivisionError):
        return "n/a"


def _met(ok: bool, *cases: dict[str, Any]) -> str:
    """The verdict; a figure measured with failed requests in its cases never meets its target."""
    failed = sum(int(c.get("errors") or 0) for c in cases)
    if failed:
        return f"**not met** ({failed:,} failed requests)"
    return "**met**" if ok else "**not met**"


@dataclass
class Row:
    figure: str
    value: str
    reference: str
    ratio: str
    target: str = "none set"


CPU_PARTIES = (
    ("gateway", "gateway"),
    ("postgres", "PostgreSQL"),
    ("upstream", "upstream"),
    ("loadgen", "load generator"),
)


def cpu_table(cases: list[tuple[str, dict[str, Any] | None]], unit: str) -> list[str]:
    """The per-case table of CPU per ``unit`` by party (bench/loadgen.py's figures), with how to read it."""
    rows = [(label, r) for label, r in cases if r is not None and "total_cpu_ms_per_call" in r]
    if not rows:
        return []
    titles = [title for _, title in CPU_PARTIES]
    lines = [
        f"CPU per {unit}, in ms (utime + stime of each party over the measured window / {unit}s):",
        "",
        f"| case | {unit}s/s measured | {' | '.join(titles)} | total | ceiling {unit}s/s | rest of the machine |",
        "|---|" + "---|" * (len(titles) + 4),
    ]
    for label, r in rows:
        rate = r.get("calls_per_s", r.get("requests_per_second"))
        cells = [label, _n(rate, 1)]
        for key, _title in CPU_PARTIES:
            key_ms = f"{key}_cpu_ms_per_call"
            cells.append(("n/a" if r[key_ms] is None else f"{r[key_ms]:.2f}") if key_ms in r else "–")
        cells += [
            f"{r['total_cpu_ms_per_call']:.2f}",
            _n(r.get("ceiling_calls_per_s")),
            _n(r.get("other_cpu_ms_per_call"), 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    cores = next((r.get("cores") for _, r in rows if r.get("cores")), "?")
    lines += [
        "",
        f"Every party is measured in every case, the references' too (an idle party shows about 0; – : not "
        f"part of this benchmark). Gateway: the gunicorn master and workers; PostgreSQL: the backends of the "
        f"benchmark's database and the server's own processes (other databases' backends left out); upstream: "
        f"the demo upstream's process; load generator: the benchmark's own process (`getrusage`), which does "
        f"nothing else during the window. Ceiling: the machine's {cores} cores / total CPU per {unit}, the rate "
        f"this machine would reach if CPU were the only limit. Rest of the machine: its busy CPU over the window "
        f"(/proc/stat) minus the parties' total, per {unit}: kernel threads and any other work on the machine; "
        f"a large figure means the run shared the machine with something else. /proc counts in 10 ms ticks, "
        f"so the per-party figures of short or slow cases carry that much uncertainty over all their {unit}s.",
    ]
    return lines


def _ratio_row(
    figure: str, cases: tuple[dict[str, Any], dict[str, Any]], reference: str, target: tuple[float, str]
) -> Row:
    """A throughput row whose target is a minimum ratio of ``cases`` (case, reference)."""
    case, base = cases
    minimum, of = target
    ratio = case["calls_per_s"] / base["calls_per_s"] if base["calls_per_s"] else 0.0
    return Row(
        figure,
        f"{_n(case['calls_per_s'], 1)} calls/s",
        f"{reference}: {_n(base['calls_per_s'], 1)} calls/s",
        f"{ratio:.2f}",
        f">= {minimum:g} of {of}: {_met(ratio >= minimum, case, base)}",
    )


def governed_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    r = f["results"]
    d1, g1, d8, g8 = r["direct_c1"], r["governed_c1"], r["direct_c8"], r["governed_c8"]
    p50_ok = g1["p50_ms"] is not None and g1["p50_ms"] <= GOVERNED_C1_P50_MS
    rate_ok = g8["calls_per_s"] >= GOVERNED_C8_CALLS_PER_S
    rows = [
        Row(
            "governed `tools/call` p50 latency, concurrency 1",
            f"{_n(g1['p50_ms'], 2)} ms",
            f"direct upstream call: {_n(d1['p50_ms'], 2)} ms",
            _ratio(g1["p50_ms"], d1["p50_ms"]),
            f"<= {GOVERNED_C1_P50_MS:g} ms: {_met(p50_ok, g1)}",
        ),
        Row(
            "governed `tools/call` p99 latency, concurrency 1",
            f"{_n(g1['p99_ms'], 2)} ms",
            f"direct upstream call: {_n(d1['p99_ms'], 2)} ms",
            _ratio(g1["p99_ms"], d1["p99_ms"]),
        ),
        Row(
            "governed `tools/call` throughput, concurrency 1",
            f"{_n(g1['calls_per_s'], 1)} calls/s",
            f"direct upstream call: {_n(d1['calls_per_s'], 1)} calls/s",
            _ratio(g1["calls_per_s"], d1["calls_per_s"]),
        ),
        Row(
            "governed `tools/call` throughput, concurrency 8",
            f"{_n(g8['calls_per_s'], 1)} calls/s",
            f"direct upstream call: {_n(d8['calls_per_s'], 1)} calls/s",
            _ratio(g8["calls_per_s"], d8["calls_per_s"]),
            f">= {GOVERNED_C8_CALLS_PER_S} calls/s: {_met(rate_ok, g8)}",
        ),
        Row(
            "governed `tools/call` p50 / p99 latency, concurrency 8",
            f"{_n(g8['p50_ms'], 2)} / {_n(g8['p99_ms'], 2)} ms",
            f"direct upstream call: {_n(d8['p50_ms'], 2)} / {_n(d8['p99_ms'], 2)} ms",
            _ratio(g8["p50_ms"], d8["p50_ms"]),
        ),
    ]
    spread = r.get("governed_spread_c8")
    if spread is not None:
        rows.append(
            Row(
                "governed `tools/call` throughput, concurrency 8 over 8 agent wallets of one tenant",
                f"{_n(spread['calls_per_s'], 1)} calls/s",
                f"direct upstream call: {_n(d8['calls_per_s'], 1)} calls/s",
                _ratio(spread["calls_per_s"], d8["calls_per_s"]),
                f">= {GOVERNED_C8_CALLS_PER_S} calls/s: "
                f"{_met(spread['calls_per_s'] >= GOVERNED_C8_CALLS_PER_S, spread)}",
            )
        )
    history = r.get("governed_history_c8")
    fresh = r.get("governed_fresh_c8") or g8  # runs before the alternating reference: the wallet fresh
    if history is not None:
        earlier = f.get("history", {}).get("earlier_calls")
        reference = (
            "a wallet of a tenant without history, in alternating windows"
            if fresh is not g8
            else "the same wallet fresh"
        )
        rows.append(
            _ratio_row(
                f"governed `tools/call` throughput, concurrency 8, after {_n(earlier)} earlier calls on the wallet",
                (history, fresh),
                reference,
                (HISTORY_RATIO_MIN, "fresh"),
            )
        )
    one, three = r.get("governed_one_server_c8"), r.get("governed_three_servers_c8")
    untraced, traced = r.get("governed_untraced_c8"), r.get("governed_traced_c8")
    log_on, log_off = r.get("governed_log_on_c8"), r.get("governed_log_off_c8")
    for case, base, figure, reference, target in (
        (
            log_on,
            log_off,
            "governed `tools/call` throughput, concurrency 8, transparency log on (pending-leaf triggers)",
            "the triggers dropped, in alternating windows",
            (LOG_RATIO_MIN, "off"),
        ),
        (
            three,
            one,
            "governed `tools/call` throughput, concurrency 8, cycling the tools of three upstream servers",
            "one server, in alternating windows",
            (THREE_SERVERS_RATIO_MIN, "one server"),
        ),
        (
            traced,
            untraced,
            "governed `tools/call` throughput, concurrency 8, tracing on (OTLP/HTTP to a local sink)",
            "tracing off, in alternating windows",
            (TRACED_RATIO_MIN, "off"),
        ),
    ):
        if case is not None and base is not None:
            rows.append(_ratio_row(figure, (case, base), reference, target))
    if untraced is not None and traced is not None:
        on_cpu, off_cpu = traced.get("gateway_cpu_ms_per_call"), untraced.get("gateway_cpu_ms_per_call")
        if on_cpu is not None and off_cpu is not None:
            rows.append(
                Row(
                    "gateway CPU per governed call, concurrency 8, tracing on",
                    f"{_n(on_cpu, 2)} ms",
                    f"tracing off: {_n(off_cpu, 2)} ms",
                    _ratio(on_cpu, off_cpu),
                )
            )
    runs_with_cpu = [("concurrency 1", g1), ("concurrency 8", g8)]
    if spread is not None:
        runs_with_cpu.append(("concurrency 8 over 8 wallets", spread))
    if history is not None:
        runs_with_cpu.append(("concurrency 8 after the long history", history))
    for label, run in runs_with_cpu:
        gateway_cpu, postgres_cpu = run.get("gateway_cpu_ms_per_call"), run.get("postgres_cpu_ms_per_call")
        if gateway_cpu is None:
            continue
        rows.append(
            Row(
                f"gateway CPU per governed call, {label} (gunicorn utime + stime / calls)",
                f"{_n(gateway_cpu, 2)} ms",
                f"PostgreSQL CPU per call: {_n(postgres_cpu, 2) if postgres_cpu is not None else 'n/a'} ms",
                _ratio(gateway_cpu, postgres_cpu),
                f"<= {GATEWAY_CPU_MS_PER_CALL:g} ms: {_met(gateway_cpu <= GATEWAY_CPU_MS_PER_CALL, run)}",
            )
        )
    errors = sum(int(x.get("errors") or 0) for x in r.values())
    notes = [
        f"gunicorn {f.get('gunicorn', '?')}; failed calls during the measurement: {errors}.",
    ]
    if f.get("load_generator"):
        notes.append(f"Load generator: {f['load_generator']}.")
    if three is not None:
        notes.append(
            "Three servers: the demo upstream in three processes, recorded as the server `default` and two "
            "servers with the tool prefixes `s2` and `s3`; the load generator cycles `math.add`, `s2.math.add` "
            "and `s3.math.add`, one wallet, against the same wallet calling one server, in alternating windows; "
            "the upstream party is the three processes."
        )
    if traced is not None:
        notes.append(
            "Tracing: a second gunicorn instance with `OTEL_EXPORTER_OTLP_ENDPOINT` set, exporting every span "
            "(a batch processor per worker) over OTLP/HTTP to a local sink process that reads and discards "
            "them, against the first instance (tracing off: one flag tested per hook, no SDK loaded), in "
            "alternating windows; the gateway party is both instances (the idle one adds about nothing), the "
            "sink's own CPU is not counted."
        )
    if f.get("history"):
        h = f["history"]
        notes.append(
            f"Long history: {_n(h['earlier_calls'])} calls on the measured wallet (its real calls copied "
            f"{h['copies']} times: actions, receipts, ledger entries, audit events) in {h['seconds']} s."
            + (
                " Measured against an agent wallet of a second tenant without history, in alternating windows"
                " (history, fresh, fresh, history, ...: six windows, as every alternating pair), so that a drift"
                " of the host's speed within the run weighs on both alike."
                if r.get("governed_fresh_c8")
                else ""
            )
        )
    cases = [
        ("governed, concurrency 1", g1),
        ("governed, concurrency 8", g8),
        ("governed, concurrency 8 over 8 wallets", spread),
        ("governed, concurrency 8, one server (alternating with three)", one),
        ("governed, concurrency 8, three servers", three),
        ("governed, concurrency 8, tracing off (alternating with on)", untraced),
        ("governed, concurrency 8, tracing on", traced),
        ("governed, concurrency 8 after the long history", history),
        ("governed, concurrency 8, a tenant without history (alternating with the above)", r.get("governed_fresh_c8")),
        ("direct upstream call (reference), concurrency 1", d1),
        ("direct upstream call (reference), concurrency 8", d8),
    ]
    table = cpu_table(cases, "call")
    return rows, notes + (["", *table] if table else [])


def charge_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    by = {(x["endpoint"], x["concurrency"]): x for x in f["results"]}
    rows: list[Row] = []
    for c in (1, 8):
        charge, health = by.get(("POST /v1/billing/charge", c)), by.get(("GET /health", c))
        if charge is None or health is None:
            continue
        target = "none set"
        if c == 8:
            ok = charge["requests_per_second"] >= CHARGE_C8_REQUESTS_PER_S
            target = f">= {CHARGE_C8_REQUESTS_PER_S:,} req/s: {_met(ok, charge)}"
        rows.append(
            Row(
                f"`POST /v1/billing/charge` throughput, concurrency {c}",
                f"{_n(charge['requests_per_second'], 1)} req/s",
                f"`GET /health`: {_n(health['requests_per_second'], 1)} req/s",
                _ratio(charge["requests_per_second"], health["requests_per_second"]),
                target,
            )
        )
        rows.append(
            Row(
                f"`POST /v1/billing/charge` p50 / p99 latency, concurrency {c}",
                f"{_n(charge['p50_ms'], 2)} / {_n(charge['p99_ms'], 2)} ms",
                f"`GET /health`: {_n(health['p50_ms'], 2)} / {_n(health['p99_ms'], 2)} ms",
                _ratio(charge["p50_ms"], health["p50_ms"]),
            )
        )
    cfg = f.get("config", {})
    errors = sum(int(x.get("errors") or 0) for x in f["results"])
    notes = [
        f"gunicorn {cfg.get('workers', '?')} workers x {cfg.get('threads', '?')} threads; "
        f"failed requests during the measurement: {errors}."
    ]
    if cfg.get("load_generator"):
        notes.append(f"Load generator: {cfg['load_generator']}.")
    cases: list[tuple[str, dict[str, Any] | None]] = [
        (f"`POST /v1/billing/charge`, concurrency {c}", by.get(("POST /v1/billing/charge", c))) for c in (1, 8)
    ]
    cases += [(f"`GET /health` (reference), concurrency {c}", by.get(("GET /health", c))) for c in (1, 8)]
    table = cpu_table(cases, "request")
    return rows, notes + (["", *table] if table else [])


def audit_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    rows = [
        Row(
            f"audit `verify-chain` over {f['events']:,} events (median of {f['runs']})",
            f"{_n(f['verify_events_per_second_median'])} events/s",
            f"SHA-256 of same-size inputs ({f['mean_hash_input_bytes']} B): "
            f"{_n(f['sha256_hashes_per_second_same_size'])} hashes/s",
            f"{f['verify_vs_sha256']:.3f}",
        ),
        Row(
            "audit verification loop alone, rows in memory",
            f"{_n(f['core_events_per_second_in_memory'])} events/s",
            f"SHA-256 of same-size inputs: {_n(f['sha256_hashes_per_second_same_size'])} hashes/s",
            _ratio(f["core_events_per_second_in_memory"], f["sha256_hashes_per_second_same_size"]),
        ),
    ]
    notes = [
        f"Whole chain verified in {f['verify_seconds_median']} s (median), {f['verify_seconds_best']} s (best): "
        "rows streamed from PostgreSQL, canonical bytes rebuilt, hashes recomputed, a checkpoint signed."
    ]
    return rows, notes


def receipt_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    rate = f["portable_verifications_per_s"]
    rows = [
        Row(
            "offline portable-receipt verification, one core",
            f"{_n(rate)} verifications/s",
            f"raw Ed25519 verification: {_n(f['raw_ed25519_verifications_per_s'])}/s",
            _ratio(rate, f["raw_ed25519_verifications_per_s"]),
            f">= {RECEIPT_VERIFICATIONS_PER_S:,}/s: {_met(rate >= RECEIPT_VERIFICATIONS_PER_S)}",
        )
    ]
    return rows, []


def tlog_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    rows = []
    for kind in ("inclusion", "consistency"):
        p99 = f[f"{kind}_ms_p99"]
        rows.append(
            Row(
                f"{kind} proof at {f['leaves']:,} leaves, generated from stored hashes and verified (p99)",
                f"{p99} ms (median {f[f'{kind}_ms_median']} ms, {f[f'{kind}_reads_max']} reads at most)",
                f"one SHA-256 of a tree node: {f['sha256_node_us']} µs",
                _ratio(p99 * 1000, f["sha256_node_us"]),
                f"< {TLOG_PROOF_MS:g} ms: {_met(p99 < TLOG_PROOF_MS)}",
            )
        )
    notes = [
        f"{f['proofs']:,} proofs of each kind over random leaves and sizes; the in-memory store of every "
        f"complete subtree's hash was built once in {f['build_seconds']} s."
    ]
    return rows, notes


def tlog_integrate_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    target_rate = f.get("target_statements_per_second", TLOG_TARGET_RATE)
    sustained = f.get("rate_sustained", False)
    load = (
        f"{f['statements_per_second']:,} statements/s, the target rate"
        if sustained
        else f"{f['statements_per_second']:,} statements/s, the highest this machine sustained "
        f"(target {target_rate:,g}/s)"
    )
    rows = [
        Row(
            f"integration lag, statement to signed checkpoint (p99; {f['writers']} writers, {load}; "
            "the integrator as `make run` runs it)",
            f"{f['lag_ms_p99']} ms (median {f['lag_ms_median']} ms, max {f['lag_ms_max']} ms)",
            f"the integrator's pause between passes: {f['interval_seconds'] * 1000:g} ms",
            _ratio(f["lag_ms_p99"], f["interval_seconds"] * 1000),
            f"< {TLOG_LAG_P99_S:g} s at {TLOG_TARGET_RATE} statements/s: "
            f"{_met(sustained and f['lag_ms_p99'] < TLOG_LAG_P99_S * 1000)}",
        ),
        Row(
            "one statement's INSERT (`audit_record`) with the pending-leaf trigger",
            f"{f['insert_us_with_trigger']} µs",
            f"the same with the trigger disabled: {f['insert_us_without_trigger']} µs",
            _ratio(f["insert_us_with_trigger"], f["insert_us_without_trigger"]),
        ),
    ]
    notes = [
        f"{f['statements']:,} audit events in {f['seconds']:g} s, {f['leaves']:,} leaves, "
        f"{f['integrating_passes']} passes that signed checkpoints; trigger on/off in alternating blocks."
    ]
    return rows, notes


def ratelimit_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    rows = [
        Row(
            "rate limiter, PostgreSQL windows (the default): cost per request",
            f"{f['database_us_per_request']} µs",
            f"`SELECT 1` round trip: {f['select_one_us']} µs",
            _ratio(f["database_us_per_request"], f["select_one_us"]),
        ),
        Row(
            "rate limiter, per-process memory (not shared: tests only)",
            f"{f['memory_cache_us_per_request']} µs",
            f"`SELECT 1` round trip: {f['select_one_us']} µs",
            _ratio(f["memory_cache_us_per_request"], f["select_one_us"]),
        ),
    ]
    return rows, ["One upsert per request into an UNLOGGED table, shared by every worker and instance."]


def argument_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    worst = f["worst_keyword"]
    rows = [
        Row(
            f"argument validation, worst keyword with the default bounds ({worst}): per 100 KB, one core",
            f"{f['worst_default_bounds_ms_per_100kb']} ms",
            f"`json.loads` of the same arguments: {f['worst_json_loads_ms_per_100kb']} ms",
            _ratio(f["worst_default_bounds_ms_per_100kb"], f["worst_json_loads_ms_per_100kb"]),
        )
    ]
    for keyword, case in f["cases"].items():
        rows.append(
            Row(
                f"argument validation, {keyword} ({case['engine']}): per 100 KB",
                f"{case['default_bounds_ms_per_100kb']} ms with the default bounds "
                f"({case['default_bounds_verdict']}); {case['ms_per_100kb']} ms without",
                f"memo validator without bounds: {case['memo_ms_per_100kb']} ms ({case['memo_steps']:,} steps)",
                _ratio(case["ms_per_100kb"], case["memo_ms_per_100kb"]),
            )
        )
    notes = [
        "The worst case the arguments can make of each keyword the gateway's validators support",
        "(`bench/argument_validation.py`, asserted in steps and engine by tests/test_argschema.py), about",
        "100 KB each, on the engine the gateway chooses for the schema (jsonschema-rs or the memo validator),",
        "with the default bounds (`TOOL_ARGUMENT_MAX_NODES`, `TOOL_ARGUMENT_MAX_ITEMS`,",
        "`TOOL_ARGUMENT_MAX_STEPS`: what a request costs, refused past a bound) and without them.",
    ]
    return rows, notes


def profile_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    rows = [
        Row(
            "gateway CPU per governed call in one process (no HTTP server)",
            f"{_n(f['cpu_ms_per_call'], 2)} ms",
            f"wall time per call: {_n(f['wall_ms_per_call'], 2)} ms",
            _ratio(f["cpu_ms_per_call"], f["wall_ms_per_call"]),
        ),
        Row(
            "SQL statements (database round trips) per governed call",
            _n(f["statements_per_call"], 1),
            "the direction of the hot path: one round trip per phase",
            "n/a",
        ),
    ]
    if "wal_bytes_per_call" in f:
        rows += [
            Row(
                "WAL bytes per governed call (rows and index entries written)",
                _n(f["wal_bytes_per_call"], 0),
                "n/a",
                "n/a",
            ),
            Row(
                "Python function calls per governed call (cProfile)", _n(f["function_calls_per_call"], 0), "n/a", "n/a"
            ),
        ]
    notes = ["CPU per call by section (inclusive of what each calls):", ""]
    notes += ["| section | CPU ms per call |", "|---|---|"]
    notes += [f"| `{name}` | {ms:.2f} |" for name, ms in f.get("sections_cpu_ms", {}).items()]
    notes += ["", "Statements per call:", "", "| per call | statement (start) |", "|---|---|"]
    notes += [f"| {n:g} | `{sql}` |" for sql, n in f.get("statements", {}).items()]
    notes += ["", "Top of the CPU profile (cProfile, by own time):", "", "```"]
    notes += f.get("top_own_time", [])
    notes += ["```"]
    return rows, notes


def upstream_rows(f: dict[str, Any]) -> tuple[list[Row], list[str]]:
    v = f["variants"]
    stateless = v["UpstreamClient.call_tool, stateless era (outputSchema checked)"]
    bare = v["UpstreamClient.call_tool, handshake era (no outputSchema)"]
    httpx_ref = v["httpx.Client.post + json, handshake era (reference)"]
    floor = v["bare socket exchange, handshake era (floor)"]
    handshake = v["UpstreamClient.call_tool, handshake era (outputSchema checked)"]
    rows = [
        Row(
            "upstream client CPU per `tools/call` as phase 2 runs it (stateless era, outputSchema checked)",
            f"{stateless['cpu_us_per_call']} µs",
            f"a plain `httpx.Client` post: {httpx_ref['cpu_us_per_call']} µs",
            _ratio(stateless["cpu_us_per_call"], httpx_ref["cpu_us_per_call"]),
        ),
        Row(
            "upstream client CPU per `tools/call`, wire and classification only (no outputSchema)",
            f"{bare['cpu_us_per_call']} µs",
            f"a bare kept-alive socket exchange: {floor['cpu_us_per_call']} µs",
            _ratio(bare["cpu_us_per_call"], floor["cpu_us_per_call"]),
        ),
        Row(
            "the SDK upstream's CPU per `tools/call` in the stateless 2026-07-28 era the client negotiates",
            f"{stateless['upstream_cpu_us_per_call']} µs",
            f"the same call in the handshake era: {handshake['upstream_cpu_us_per_call']} µs",
            _ratio(stateless["upstream_cpu_us_per_call"], handshake["upstream_cpu_us_per_call"]),
        ),
    ]
    notes = [
        f"{f['rounds']} rounds x {f['calls_per_round']:,} sequential calls per variant, medians over rounds; "
        "wall p50 stateless / handshake era: "
        f"{stateless['p50_us']} / {handshake['p50_us']} µs."
    ]
    return rows, notes


BENCHMARKS = (
    # name, script, title, rows
    ("governed_call", "governed_call.py", "Governed tool call through `/mcp`", governed_rows),
    ("profile_call", "profile_call.py", "Profile of one governed call", profile_rows),
    ("charge", "charge.py", "Charge through HTTP", charge_rows),
    ("upstream_client", "upstream_client.py", "Upstream client", upstream_rows),
    ("audit_verify", "audit_verify.py", "Audit chain verification", audit_rows),
    ("receipt_verify", "receipt_verify.py", "Offline receipt verification", receipt_rows),
    ("ratelimit", "ratelimit.py", "Rate limiter", ratelimit_rows),
    ("argument_validation", "argument_validation.py", "Argument validation (inputSchema)", argument_rows),
    ("tlog_proofs", "tlog_proofs.py", "Transparency-log proofs", tlog_rows),
    ("tlog_integrate", "tlog_integrate.py", "Transparency-log integration", tlog_integrate_rows),
)


def render(
    runs: list[Run],
    machine: dict[str, str],
    load: tuple[str, str],
    speed: tuple[str, str],
    started: datetime,
    took: float,
) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`.venv/bin/python -m devtools.bench`). Every figure stands beside a",
        "reference measured in the same run on the same machine; the ratio (figure / reference) is the",
        "part that carries over to other machines. The gateway, PostgreSQL, the upstream and the load",
        "generator all share the machine; the HTTP benchmarks report the CPU each of them spends per call",
        "(and what the machine's cores would allow at that cost) beside their figures. Their load generator",
        "(`bench/loadgen.py`) is the same for every figure and its reference.",
        "",
        "## Machine and run",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {machine['cpu']} |",
        f"| cores | {machine['cores']} |",
        f"| memory | {machine['memory']} |",
        f"| OS | {machine['os']} |",
        f"| Python | {machine['python']} |",
        f"| PostgreSQL | {machine['postgres']} |",
        f"| date | {started.strftime('%Y-%m-%d %H:%M UTC')} |",
        f"| commit | {machine['commit']} |",
        f"| duration | {took / 60:.1f} min |",
        f"| load average (1 / 5 / 15 min) at start | {load[0]} |",
        f"| load average (1 / 5 / 15 min) at end | {load[1]} |",
        f"| host speed at start / end: raw Ed25519 verifications/s, one core | {speed[0]} / {speed[1]} |",
        "",
        f"The load average is that of the whole machine ({machine['cores']} cores). A load above the core count",
        "at the start means other work was running during the measurements, and the absolute figures",
        "are lower than the machine can do alone; the ratios are less affected. The host speed is the",
        "virtual machine's own: on the development machine it has ranged from about 7,500 to 17,000",
        "verifications/s within a day, with nothing else running, and every absolute figure moves with it.",
        "",
    ]
    summary: list[str] = []
    for name, _script, title, rows_of in BENCHMARKS:
        run = next((r for r in runs if r.name == name), None)
        if run is None:
            continue
        lines += [f"## {title}", "", f"Command: `{run.command}` ({run.seconds:.0f} s)", ""]
        if run.error:
            lines += [f"**The benchmark failed ({run.error}); no figures.**", ""]
            summary.append(f"| {title} | failed | |")
            continue
        rows, notes = rows_of(run.figures)
        lines += ["| figure | value | in-run reference | ratio | target |", "|---|---|---|---|---|"]
        for row in rows:
            lines.append(f"| {row.figure} | {row.value} | {row.reference} | {row.ratio} | {row.target} |")
            if row.target != "none set":
                summary.append(f"| {row.figure} | {row.value} | {row.target} |")
        lines += ["", *notes, ""] if notes else [""]
    lines[lines.index("## Machine and run") : lines.index("## Machine and run")] = [
        "## Targets",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        *summary,
        "",
    ]
    lines += [
        "## Commands",
        "",
        "```sh",
        "make bench    # all of the below, then this file",
        *[run.command + " --json PATH" for run in runs],
        "```",
        "",
        "Each benchmark creates and drops its own throwaway database on the configured PostgreSQL",
        "server (the embedded one when `DATABASE_URL` is unset); see the docstring of each script.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run every benchmark and write BENCHMARKS.md.")
    parser.add_argument("--seconds", type=float, default=6.0, help="duration of each load measurement")
    parser.add_argument("--events", type=int, default=100_000, help="audit events to verify")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)

    env = dict(os.environ)
    env.pop("TOLLGATE_TESTING", None)
    started_db = False
    if not env.get("DATABASE_URL"):
        was_running = pg.running_url() is not None
        db_url = pg.start()
        started_db = not was_running
    else:
        db_url = env["DATABASE_URL"]

    started_at = datetime.now(UTC)
    began = time.monotonic()
    load_start = load_average()
    speed_start = host_speed()
    seconds = f"{args.seconds:g}"
    plan = {
        "governed_call": ["--seconds", seconds],
        "profile_call": ["--calls", "300", "--top", "15"],
        "charge": ["--seconds", seconds],
        "upstream_client": ["--calls", "1000", "--rounds", "3"],
        "audit_verify": ["--events", str(args.events), "--runs", "3"],
        "receipt_verify": ["--seconds", "3"],
        "ratelimit": ["--seconds", "3"],
        "argument_validation": ["--rounds", "5"],
        "tlog_proofs": ["--leaves", "1000000", "--proofs", "2000"],
        "tlog_integrate": ["--seconds", seconds, "--writers", "4", "--interval", "2", "--rate", str(TLOG_TARGET_RATE)],
    }
    runs: list[Run] = []
    try:
        machine = {
            "cpu": cpu_model(),
            "cores": str(os.cpu_count()),
            "memory": memory_gib(),
            "os": f"{platform.system()} {platform.release()} ({platform.machine()})",
            "python": platform.python_version(),
            "postgres": postgres_version(db_url),
            "commit": git_revision(),
        }
        for name, script, _title, _rows in BENCHMARKS:
            runs.append(run_benchmark(name, script, plan[name], env))
    finally:
        if started_db:
            pg.stop()
    load_end = load_average()
    speed = (speed_start, host_speed())
    text = render(runs, machine, (load_start, load_end), speed, started_at, time.monotonic() - began)
    Path(args.output).write_text(text, encoding="utf-8")
    print(f"\nwrote {args.output}")
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
