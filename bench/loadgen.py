"""The load generator of the HTTP benchmarks, and the CPU accounting of every party around it.

``bench/governed_call.py`` and ``bench/charge.py`` measure every path with :func:`run`, their
in-run references too (the direct upstream call, ``GET /health``), so a figure and its reference
are driven by the same client at the same cost:

* ``concurrency`` threads, each with one persistent HTTP/1.1 keep-alive connection
  (:class:`Connection`: a plain socket, requests written in one ``sendall``, responses read with
  Content-Length or chunked bodies, reconnecting when the server has closed the connection);
* a request factory called before every request with the worker's index (a fresh idempotency
  key per call, per-worker credentials), and a check of every response (status and body);
* duration-bounded: each worker sends until ``seconds`` have passed, then finishes its request
  in flight; every request counts, and a failed one (bad status, a body that fails the check,
  a connection error) is counted in ``errors``, never dropped;
* latencies p50 (median) / p99 (nearest rank), calls/s over the whole window.

Warming up is the caller's: a short :func:`run` whose figures are discarded.

Why a socket of its own rather than an HTTP library: the load generator shares the machine with
the gateway, PostgreSQL and the upstream, so every millisecond it spends is one the servers do
not get. ``httpx`` costs about 0.5 ms of CPU per request and ``http.client`` about 0.1 ms (its
header parsing goes through ``email.parser``); this client about a tenth of httpx. Whatever it
costs is reported beside the servers' CPU, not guessed.

CPU per call, over the same window (see :func:`run`'s ``parties``): each server's processes
(utime + stime from /proc: gunicorn's master and workers, the upstream, PostgreSQL's postmaster,
background processes and the backends of the benchmark's database, see :class:`PostgresServer`),
the load generator itself (``getrusage(RUSAGE_SELF)`` of this process, which runs nothing else
during the window), their total, the whole machine's busy CPU from /proc/stat (what is left over
is other work on the machine and kernel threads), and the ceiling the machine would reach at that
cost: cores / total CPU per call. /proc counts in clock ticks (10 ms), so a window needs thousands
of calls for per-call figures to two decimals.
"""

from __future__ import annotations

import math
import os
import resource
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Connection",
    "HTTPError",
    "PostgresServer",
    "ProcessTree",
    "Request",
    "Response",
    "cpu_per_call",
    "cpu_snapshot",
    "postgres_meter",
    "postgres_pid",
    "process_tree_cpu",
    "run",
]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
DESCRIPTION = (
    "bench/loadgen.py: one thread per unit of concurrency, each with one persistent HTTP/1.1 connection "
    "(a plain socket), the same for every figure and its reference"
)
RECV_SIZE = 65536


@dataclass(frozen=True, slots=True)
class Request:
    """One request. ``Host`` and ``Content-Length`` are added by the connection; ``body`` is sent as is."""

    method: str
    path: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(slots=True)
class Response:
    """A whole response: status, headers (names in lower case, repeated ones joined by ``, ``), body."""

    status: int
    headers: dict[str, str]
    body: bytes


class HTTPError(Exception):
    """The server's bytes are not a valid HTTP/1.x response, or it closed the connection mid-response."""


class _Stale(Exception):
    """The connection was closed by the server before any byte of the response: the request was not read."""


_NO_BODY_METHODS = frozenset({"HEAD"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class Connection:
    """One persistent HTTP/1.1 connection to ``host:port`` (one thread at a time).

    Opened on the first request. A reused connection that the server has closed (an idle keep-alive
    timeout, a worker restart) is noticed when the response does not begin: the request is sent once
    more on a new connection, as other HTTP clients do; the server had not read it. A response with
    ``Connection: close``, or an HTTP/1.0 one without keep-alive, closes the connection after it.
    """

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.connects = 0
        self._host_line = f"Host: {host}:{port}\r\n"
        self._sock: socket.socket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buffer = None, b""

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the request leaves in one segment, now
        self._sock, self._buffer = sock, b""
        self.connects += 1
        return sock

    def encode(self, request: Request) -> bytes:
        head = [f"{request.method} {request.path} HTTP/1.1\r\n", self._host_line]
        head += [f"{name}: {value}\r\n" for name, value in request.headers.items()]
        if request.body or request.method in _BODY_METHODS:
            head.append(f"Content-Length: {len(request.body)}\r\n")
        head.append("\r\n")
        return "".join(head).encode("latin-1") + request.body

    def request(self, request: Request) -> Response:
        data = self.encode(request)
        sock = self._sock
        if sock is not None:
            try:
                sock.sendall(data)
                return self._read_response(sock, request.method)
            except (_Stale, BrokenPipeError, ConnectionResetError):
                self.close()  # closed by the server while idle: send it again below, on a new connection
            except BaseException:
                self.close()
                raise
        sock = self._connect()
        try:
            sock.sendall(data)
            return self._read_response(sock, request.method)
        except _Stale:
            self.close()
            raise HTTPError("the server closed a new connection without answering") from None
        except BaseException:
            self.close()
            raise

    # --- reading ------------------------------------------------------------------------------

    def _fill(self, sock: socket.socket) -> None:
        chunk = sock.recv(RECV_SIZE)
        if not chunk:
            raise HTTPError("the server closed the connection in the middle of a response")
        self._buffer += chunk

    def _read_until(self, sock: socket.socket, delimiter: bytes) -> bytes:
        while (end := self._buffer.find(delimiter)) < 0:
            self._fill(sock)
        line, self._buffer = self._buffer[:end], self._buffer[end + len(delimiter) :]
        return line

    def _read_exact(self, sock: socket.socket, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill(sock)
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _read_to_close(self, sock: socket.socket) -> bytes:
        chunks = [self._buffer]
        while chunk := sock.recv(RECV_SIZE):
            chunks.append(chunk)
        self._buffer = b""
        return b"".join(chunks)

    def _read_head(self, sock: socket.socket) -> bytes:
        if not self._buffer:
            try:
                chunk = sock.recv(RECV_SIZE)
            except ConnectionResetError:
                raise _Stale from None
            if not chunk:
                raise _Stale
            self._buffer = chunk
        return self._read_until(sock, b"\r\n\r\n")

    def _read_response(self, sock: socket.socket, method: str) -> Response:
        while True:
            lines = self._read_head(sock).split(b"\r\n")
            status_line = lines[0]
            if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12 or status_line[12:13] not in (b"", b" "):
                raise HTTPError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
            try:
                status = int(status_line[9:12])
            except ValueError:
                raise HTTPError(f"not an HTTP/1.x status line: {status_line[:80]!r}") from None
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, colon, value = line.partition(b":")
                if not colon:
                    raise HTTPError(f"not a header line: {line[:80]!r}")
                key, text = name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
            if 100 <= status < 200 and status != 101:
                continue  # an interim response (100 Continue, 103 Early Hints): the final one follows
            break
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        keep_alive = "keep-alive" in tokens if status_line[7:8] == b"0" else "close" not in tokens
        if method in _NO_BODY_METHODS or status in (204, 304) or 100 <= status < 200:
            body = b""
        elif "transfer-encoding" in headers:
            if headers["transfer-encoding"].lower().rsplit(",", 1)[-1].strip() == "chunked":
                body = self._read_chunked(sock)
            else:
                body, keep_alive = self._read_to_close(sock), False
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise HTTPError(f"bad Content-Length: {headers['content-length']!r}") from None
            body = self._read_exact(sock, length)
        else:
            body, keep_alive = self._read_to_close(sock), False
        if not keep_alive:
            self.close()
        return Response(status, headers, body)

    def _read_chunked(self, sock: socket.socket) -> bytes:
        chunks: list[bytes] = []
        while True:
            size_line = self._read_until(sock, b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HTTPError(f"bad chunk size line: {size_line[:80]!r}") from None
            if size == 0:
                while self._read_until(sock, b"\r\n"):
                    pass  # trailer fields, up to the empty line
                return b"".join(chunks)
            chunks.append(self._read_exact(sock, size))
            if self._read_exact(sock, 2) != b"\r\n":
                raise HTTPError("a chunk is not followed by CRLF")


# --- CPU accounting ---------------------------------------------------------------------------------

ProcStat = tuple[int, float, float]  # ppid, own CPU seconds (utime + stime), reaped children's (cutime + cstime)


def _proc_stats() -> dict[int, ProcStat]:
    """Every live process's parent and CPU seconds, from /proc/<pid>/stat."""
    stats: dict[int, ProcStat] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while the directory was being read
        own = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        reaped = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
        stats[int(stat.parent.name)] = (int(fields[1]), own, reaped)
    return stats


def process_tree_cpu(root_pid: int) -> float:
    """CPU seconds of ``root_pid``, of its live direct children, and of the children it has reaped.

    Counting the reaped children (the root's cutime + cstime) keeps the figure from dropping when a
    child exits: a gunicorn worker restarted, a PostgreSQL backend closed at CONN_MAX_AGE.
    """
    return ProcessTree(root_pid).read()[root_pid]


class ProcessTree:
    """A server's CPU: its main process with every direct child, live or exited (gunicorn, the upstream)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def read(self, stats: Mapping[int, ProcStat] | None = None) -> dict[int, float]:
        stats = _proc_stats() if stats is None else stats
        root = stats.get(self.pid)
        total = root[1] + root[2] if root else 0.0
        total += sum(own for pid, (ppid, own, _) in stats.items() if ppid == self.pid and pid != self.pid)
        return {self.pid: total}


class PostgresServer:
    """The CPU PostgreSQL spends for one database: the postmaster, its background processes, and the
    backends (autovacuum workers included) of ``database``; backends of other databases (other work
    sharing the server) are left out, told apart by their process titles.

    Read per process, so a window's figure is the sum of each process's growth; a backend that exits
    during the window takes its share with it (the postmaster's count of reaped children cannot be
    split by database). With process titles off, every child counts.
    """

    def __init__(self, pid: int, database: str) -> None:
        self.pid, self.database = pid, database

    def serves(self, pid: int) -> bool:
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
        except OSError:
            return False
        if len(words) >= 4 and words[0] == "postgres:" and words[1:3] == ["autovacuum", "worker"]:
            return words[3] == self.database
        if len(words) >= 4 and words[0] == "postgres:" and (words[3] == "[local]" or words[3].endswith(")")):
            return words[2] == self.database  # a client backend: postgres: USER DATABASE HOST(PORT) STATE
        return True

    def read(self, stats: Mapping[int, ProcStat] | None = None) -> dict[int, float]:
        stats = _proc_stats() if stats is None else stats
        root = stats.get(self.pid)
        out = {self.pid: root[1]} if root else {}
        out |= {pid: own for pid, (ppid, own, _) in stats.items() if ppid == self.pid and self.serves(pid)}
        return out


class ProcessTrees:
    """Several servers counted as one party (three upstream processes; two gateways of which one is idle)."""

    def __init__(self, pids: list[int]) -> None:
        self.trees = [ProcessTree(pid) for pid in pids]

    def read(self, stats: Mapping[int, ProcStat] | None = None) -> dict[int, float]:
        stats = _proc_stats() if stats is None else stats
        out: dict[int, float] = {}
        for tree in self.trees:
            out |= tree.read(stats)
        return out


CpuMeter = ProcessTree | ProcessTrees | PostgresServer


def postgres_pid(dsn: str) -> int | None:
    """The PostgreSQL server's main process, when it runs on this machine."""
    import psycopg

    try:
        with psycopg.connect(dsn) as conn:
            data_dir = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
        return int(Path(data_dir, "postmaster.pid").read_text().splitlines()[0])
    except Exception:  # a remote server, or no permission: report nothing rather than a wrong figure
        return None


def postgres_meter(dsn: str) -> PostgresServer | None:
    """The CPU meter of ``dsn``'s database on a PostgreSQL server of this machine; None for a remote one."""
    from psycopg import conninfo

    pid = postgres_pid(dsn)
    database = conninfo.conninfo_to_dict(dsn).get("dbname")
    return PostgresServer(pid, str(database)) if pid and database else None


def machine_busy_cpu() -> float | None:
    """CPU seconds the whole machine has been busy (every core; user, nice, system, irq, softirq)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


Snapshot = dict[str, dict[int, float] | None]


def cpu_snapshot(parties: Mapping[str, CpuMeter | None], *, end: bool = False) -> Snapshot:
    """CPU seconds so far of each party, of the machine (``machine``) and of this process (``loadgen``).

    This process is read last at the start of a window and first at its end (``end=True``), so the
    scans of /proc are not charged to the load generator.
    """
    own = self_cpu() if end else 0.0
    stats = _proc_stats()
    snapshot: Snapshot = {k: meter.read(stats) if meter else None for k, meter in parties.items()}
    machine = machine_busy_cpu()
    snapshot["machine"] = None if machine is None else {0: machine}
    snapshot["loadgen"] = {0: own if end else self_cpu()}
    return snapshot


def _growth(before: Mapping[int, float], after: Mapping[int, float]) -> float:
    """CPU seconds between two readings, summed over the processes alive at the second (new ones from zero)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def cpu_per_call(before: Snapshot, after: Snapshot, calls: int) -> dict[str, Any]:
    """``{label}_cpu_ms_per_call`` for each party and the load generator, their total, the machine's busy
    CPU and what of it is none of theirs (other work, kernel threads), and the ceiling in calls/s at the
    total (cores / total CPU per call)."""
    if not calls:
        return {}
    out: dict[str, Any] = {}
    total = 0.0
    for label, start in before.items():
        stop = after.get(label)
        if label == "machine":
            continue
        if start is None or stop is None:
            out[f"{label}_cpu_ms_per_call"] = None  # not measurable here (a remote server)
            continue
        ms = _growth(start, stop) / calls * 1000
        out[f"{label}_cpu_ms_per_call"] = round(ms, 3)
        total += ms
    cores = os.cpu_count() or 1
    out["total_cpu_ms_per_call"] = round(total, 3)
    if before.get("machine") is not None and after.get("machine") is not None:
        machine = _growth(before["machine"] or {}, after["machine"] or {}) / calls * 1000
        out["machine_cpu_ms_per_call"] = round(machine, 3)
        out["other_cpu_ms_per_call"] = round(machine - total, 3)
    out["cores"] = cores
    out["ceiling_calls_per_s"] = round(cores * 1000 / total, 1) if total > 0 else None
    return out


# --- load -------------------------------------------------------------------------------------------


def run(
    host: str,
    port: int,
    make_request: Callable[[int], Request],
    check: Callable[[Response], bool],
    *,
    concurrency: int,
    seconds: float,
    parties: Mapping[str, CpuMeter | None] | None = None,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """Requests from ``concurrency`` threads for ``seconds`` (:func:`_load`): calls, errors, calls/s,
    p50/p99 and, with ``parties``, CPU per call over the window."""
    return _load(
        host, port, make_request, check, concurrency=concurrency, seconds=seconds, parties=parties, timeout=timeout
    )[0]


def run_alternating(
    host: str,
    port: int,
    cases: Mapping[str, Callable[[int], Request]],
    check: Callable[[Response], bool],
    *,
    concurrency: int,
    seconds: float,
    parties: Mapping[str, CpuMeter | None] | None = None,
    rounds: int = 2,
    ports: Mapping[str, int] | None = None,
    before: Mapping[str, Callable[[], None]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each of ``cases`` (``{label: make_request}``) for ``seconds`` in all, in ``rounds`` windows taken in
    turn, the order reversed every round (A B, B A, ...), so that a change of the machine's speed during
    the measurement (a shared host's) weighs on every case alike; each case's figures are those of its
    windows together, as :func:`run` gives them for one window. ``ports``: a case's own port, when the
    cases are served by different servers (``port`` for the others). ``before``: what to do before each of
    a case's windows (a case that differs by the database's state, not by its requests)."""
    windows: dict[str, list[tuple[dict[str, Any], list[float]]]] = {label: [] for label in cases}
    order = list(cases)
    for round_ in range(rounds):
        for label in order if round_ % 2 == 0 else order[::-1]:
            if before and label in before:
                before[label]()
            windows[label].append(
                _load(
                    host,
                    (ports or {}).get(label, port),
                    cases[label],
                    check,
                    concurrency=concurrency,
                    seconds=seconds / rounds,
                    parties=parties,
                )
            )
    return {label: _combined(runs) for label, runs in windows.items()}


def _combined(runs: list[tuple[dict[str, Any], list[float]]]) -> dict[str, Any]:
    """One case's figures over several windows: its calls and latencies together, and CPU per call
    weighted by each window's calls (so, each party's CPU over all the windows / all the calls)."""
    results = [result for result, _ in runs]
    latencies = sorted(latency for _, window in runs for latency in window)
    n = len(latencies)
    elapsed = sum(result["seconds"] for result in results)
    out: dict[str, Any] = {
        "concurrency": results[0]["concurrency"],
        "calls": n,
        "errors": sum(result["errors"] for result in results),
        "seconds": round(elapsed, 3),
        "calls_per_s": round(n / elapsed, 1) if elapsed else 0.0,
        **_percentiles(latencies),
        "connections": sum(result["connections"] for result in results),
        "windows": len(results),
    }
    first_errors = [result["first_error"] for result in results if "first_error" in result]
    if first_errors:
        out["first_error"] = first_errors[0]
    keys = [key for key in results[0] if key.endswith("_cpu_ms_per_call")]
    if keys and n:
        for key in keys:
            values = [result.get(key) for result in results]
            out[key] = (
                None
                if any(value is None for value in values)
                else round(sum(value * result["calls"] for value, result in zip(values, results, strict=True)) / n, 3)
            )
        cores = results[0].get("cores") or os.cpu_count() or 1
        total = out.get("total_cpu_ms_per_call")
        out["cores"] = cores
        out["ceiling_calls_per_s"] = round(cores * 1000 / total, 1) if total else None
    return out


def _percentiles(latencies: list[float]) -> dict[str, float | None]:
    """p50 (median) and p99 (nearest rank) in ms of sorted ``latencies`` (seconds)."""
    n = len(latencies)
    return {
        "p50_ms": round(statistics.median(latencies) * 1000, 2) if n else None,
        "p99_ms": round(latencies[max(0, math.ceil(n * 0.99) - 1)] * 1000, 2) if n else None,
    }


def _load(
    host: str,
    port: int,
    make_request: Callable[[int], Request],
    check: Callable[[Response], bool],
    *,
    concurrency: int,
    seconds: float,
    parties: Mapping[str, CpuMeter | None] | None = None,
    timeout: float = 30.0,
) -> tuple[dict[str, Any], list[float]]:
    """Requests from ``concurrency`` threads for ``seconds``; worker ``i`` sends ``make_request(i)`` each time.

    A request is good when ``check(response)`` says so; any other outcome, a connection error
    included, counts in ``errors`` (the first error's description in ``first_error``) and the worker
    goes on with a new connection. With ``parties`` (``{label: meter}``, ``None`` for a party that cannot
    be measured here) the result also carries CPU per call over the window (:func:`cpu_per_call`).
    """
    latencies: list[float] = []
    errors = [0]
    first_error: list[str] = []
    connects = [0]
    crashed: list[BaseException] = []
    lock = threading.Lock()
    start_gate = threading.Event()
    stop_at = [0.0]

    def worker(index: int) -> None:
        connection = Connection(host, port, timeout)
        mine: list[float] = []
        append, clock = mine.append, time.perf_counter
        bad, problem = 0, ""
        start_gate.wait()
        deadline = stop_at[0]
        try:
            while time.monotonic() < deadline:
                request = make_request(index)
                started = clock()
                try:
                    response = connection.request(request)
                except (OSError, HTTPError) as exc:
                    append(clock() - started)
                    bad += 1
                    problem = problem or f"{type(exc).__name__}: {exc}"
                    time.sleep(0.01)  # a server that refuses connections is not hammered in a tight loop
                    continue
                append(clock() - started)
                try:
                    good = check(response)
                except Exception:  # a body the check cannot read (not JSON, say) is a bad response
                    good = False
                if not good:
                    bad += 1
                    problem = problem or f"HTTP {response.status}: {response.body[:200]!r}"
        except BaseException as exc:  # a failing request factory: re-raised by run(), never a silent thread death
            crashed.append(exc)
        finally:
            connection.close()
            with lock:
                latencies.extend(mine)
                errors[0] += bad
                connects[0] += connection.connects
                if problem and not first_error:
                    first_error.append(problem)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    try:
        before = cpu_snapshot(parties or {})
    except BaseException:
        start_gate.set()  # with stop_at still 0 the workers end at once
        raise
    started = time.monotonic()
    stop_at[0] = started + seconds
    start_gate.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    after = cpu_snapshot(parties or {}, end=True)
    if crashed:
        raise RuntimeError(f"a load worker failed: {crashed[0]!r}") from crashed[0]
    latencies.sort()
    n = len(latencies)
    result: dict[str, Any] = {
        "concurrency": concurrency,
        "calls": n,
        "errors": errors[0],
        "seconds": round(elapsed, 3),
        "calls_per_s": round(n / elapsed, 1),
        **_percentiles(latencies),
        "connections": connects[0],
    }
    if first_error:
        result["first_error"] = first_error[0]
    if parties is not None:
        result.update(cpu_per_call(before, after, n))
    return result, latencies


# --- reporting --------------------------------------------------------------------------------------

CPU_PARTIES = (("gateway", "gateway"), ("postgres", "PostgreSQL"), ("upstream", "upstream"), ("loadgen", "load gen"))


def cpu_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A plain-text table of CPU ms per call by party for each case of ``results`` (``run``'s dicts)."""

    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}"

    head = ["case", "calls/s", *(title for _, title in CPU_PARTIES), "total", "ceiling/s", "rest of machine"]
    rows = [head]
    for name, r in results.items():
        if "total_cpu_ms_per_call" not in r:
            continue
        cells = [name, f"{r['calls_per_s']:.1f}", *(ms(r.get(f"{key}_cpu_ms_per_call")) for key, _ in CPU_PARTIES)]
        cells += [ms(r["total_cpu_ms_per_call"]), f"{r['ceiling_calls_per_s'] or 0:.0f}"]
        cells.append(ms(r.get("other_cpu_ms_per_call")))
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))]
        lines.append("  ".join(cells))
    return "CPU ms per call (utime + stime over the window / calls):\n" + "\n".join(lines)


def report_errors(results: Mapping[str, Mapping[str, Any]]) -> None:
    """Name the first failure of every case that had failures, on stderr (the counts are in the results)."""
    for name, r in results.items():
        if r.get("errors"):
            print(f"{name}: {r['errors']} failed of {r['calls']}; first: {r.get('first_error')}", file=sys.stderr)
