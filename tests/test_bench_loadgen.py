"""bench/loadgen.py's alternating measurement: windows in A B, B A order, each case's figures over its windows."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import loadgen  # the benchmarks import it as a top-level module, from bench/


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the load generator expects
    paths: list[str] = []
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            if not self.paths or self.paths[-1] != self.path:
                self.paths.append(self.path)  # one entry per run of requests to the same path
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_cases_alternate_and_combine_their_windows() -> None:
    _Recorder.paths = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        results = loadgen.run_alternating(
            "127.0.0.1",
            port,
            {"a": lambda i: loadgen.Request("GET", "/a"), "b": lambda i: loadgen.Request("GET", "/b")},
            lambda response: response.status == 200 and response.body == b"ok",
            concurrency=1,
            seconds=0.6,
            parties={},
            rounds=4,
        )
    finally:
        server.shutdown()
        server.server_close()
    # Windows a b | b a | a b | b a: consecutive windows of one case are one run of its path. In a fixed
    # order (a b a b ...) there would be eight runs.
    assert _Recorder.paths == ["/a", "/b", "/a", "/b", "/a"]
    for label in ("a", "b"):
        r = results[label]
        assert r["windows"] == 4
        assert r["errors"] == 0
        assert 0.5 <= r["seconds"] < 2  # four windows of 0.15 s, each ending with its request in flight
        assert r["calls"] > 0
        assert r["calls_per_s"] == round(r["calls"] / r["seconds"], 1)
        assert r["p50_ms"] <= r["p99_ms"]
        assert r["loadgen_cpu_ms_per_call"] is not None
        assert r["total_cpu_ms_per_call"] >= r["loadgen_cpu_ms_per_call"]


def test_combined_cpu_is_weighted_by_calls() -> None:
    first = {"concurrency": 1, "calls": 3, "errors": 0, "seconds": 1.0, "connections": 1,
             "gateway_cpu_ms_per_call": 1.0, "total_cpu_ms_per_call": 1.0, "cores": 2}  # fmt: skip
    second = {**first, "calls": 1, "errors": 1, "first_error": "HTTP 500", "gateway_cpu_ms_per_call": 5.0,
              "total_cpu_ms_per_call": 5.0}  # fmt: skip
    out = loadgen._combined([(first, [0.001, 0.002, 0.003]), (second, [0.010])])
    assert (out["calls"], out["errors"], out["first_error"]) == (4, 1, "HTTP 500")
    assert out["calls_per_s"] == 2.0
    assert out["gateway_cpu_ms_per_call"] == 2.0  # (3 x 1 + 1 x 5) / 4
    assert out["ceiling_calls_per_s"] == 1000.0  # 2 cores / 2 ms
    assert (out["p50_ms"], out["p99_ms"]) == (2.5, 10.0)
