"""The gateway's gunicorn worker (config/workers.py): new connections go where the fewest are open, and a
thread serves its kept-alive connection's next request when it comes at once."""

from __future__ import annotations

import io
import os
import signal
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gunicorn.workers.gthread import ThreadWorker

from config.workers import BalancedThreadWorker, ConnectionBoard

pytestmark = pytest.mark.django_db(transaction=True)


LISTEN = "0A"


def held_by_worker(pids: list[int], port: int, established_only: bool = True) -> Counter[int]:
    """How many TCP connections on local ``port`` each process of ``pids`` holds (from /proc).

    ``established_only=False`` counts every connection a worker has not closed yet, one the client
    has closed among them (the server's side is then in CLOSE_WAIT until the worker notices).
    """
    inodes: dict[str, int] = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = fd.readlink().name
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[len("socket:[") : -1]] = pid
    held: Counter[int] = Counter({pid: 0 for pid in pids})
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port, state, inode = int(fields[1].rsplit(":", 1)[1], 16), fields[3], fields[9]
            counted = state == "01" if established_only else state != LISTEN
            if local_port == port and counted and inode in inodes:
                held[inodes[inode]] += 1
    return held


def ask_health(sock: socket.socket) -> None:
    """``GET /health`` on ``sock``, its whole answer read (the JSON body ends the response) and checked."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    while not (b"\r\n\r\n" in answer and answer.endswith(b"}")):
        chunk = sock.recv(65536)
        assert chunk, "the gateway closed the connection"
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def open_kept_alive(port: int) -> socket.socket:
    """A connection that has been answered once and stays open (HTTP/1.1 keep-alive)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    ask_health(sock)
    return sock


def open_burst(port: int, count: int) -> list[socket.socket]:
    """``count`` kept-alive connections opened at once, from as many threads."""
    opened: list[socket.socket] = []
    lock = threading.Lock()

    def connect() -> None:
        sock = open_kept_alive(port)
        with lock:
            opened.append(sock)

    threads = [threading.Thread(target=connect) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    return opened


def wait_until_both_serve(pids: list[int], port: int) -> None:
    """Until each worker has booted and takes connections (a booting worker is left out of the balance)."""
    deadline = time.monotonic() + 60
    while True:
        sockets = [open_kept_alive(port) for _ in range(2)]
        split = sorted(held_by_worker(pids, port).values())
        for sock in sockets:
            sock.close()
        wait_until_closed(pids, port)
        if split == [1, 1]:
            return
        assert time.monotonic() < deadline, split


def wait_until_closed(pids: list[int], port: int) -> None:
    """Until the workers have noticed that every connection to them was closed, and closed their side.

    Counting established connections is not enough: a connection the client closed leaves that
    state at once, while the worker still counts it until it reads the end of the stream, so the
    next burst would meet a worker that seems to hold more than it does.
    """
    deadline = time.monotonic() + 10
    while sum(held_by_worker(pids, port, established_only=False).values()) > 0:
        assert time.monotonic() < deadline, "a worker kept a closed connection open for 10 s"
        time.sleep(0.01)


def test_connections_are_spread_over_the_workers(tmp_path):
    """Keep-alive connections, opened one after another and in bursts, split evenly over two workers.

    gunicorn's own gthread workers race for each connection, and a burst often lands mostly on one
    of them (8 connections: 4/4 in about a third of the runs, 8/0 now and then).
    """
    from tests.live import running_gateway

    with running_gateway(tmp_path, workers=2, threads=4) as gateway:
        port = int(gateway.url.rsplit(":", 1)[1])
        pids = gateway.worker_pids()
        assert len(pids) == 2
        wait_until_both_serve(pids, port)
        for _ in range(3):  # every thread of both workers has served (its first request opens a connection)
            for sock in open_burst(port, 8):
                sock.close()
            wait_until_closed(pids, port)
        splits: list[tuple[bool, list[int]]] = []
        for burst in (False, False, *[True] * 10):
            sockets: list[socket.socket] = []
            try:
                sockets.extend(open_burst(port, 8) if burst else (open_kept_alive(port) for _ in range(8)))
                assert len(sockets) == 8
                splits.append((burst, sorted(held_by_worker(pids, port).values())))
            finally:
                for sock in sockets:
                    sock.close()
            wait_until_closed(pids, port)
    # A worker leaves a new connection to the others for BalancedThreadWorker.DEFER_SECONDS (200 ms)
    # only, so a machine that keeps the other worker from accepting that long makes a 5/3 now and then.
    # gthread's race, measured over 20 bursts, split 4/4 7 times, 5/3 5 times and 6/2 or worse 8 times:
    # the first bound alone fails for it with a probability over 99 % (0.6 ** 12 passes).
    assert all(split in ([4, 4], [3, 5]) for _, split in splits), splits
    assert sum(split == [4, 4] for _, split in splits) >= 9, splits


def test_a_worker_with_more_connections_still_accepts_when_the_others_cannot(tmp_path):
    """The deferral ends: with the other worker stopped, the worker holding more connections takes a new one."""
    from tests.live import running_gateway

    with running_gateway(tmp_path, workers=2, threads=2) as gateway:
        port = int(gateway.url.rsplit(":", 1)[1])
        pids = gateway.worker_pids()
        wait_until_both_serve(pids, port)
        sockets = [open_kept_alive(port) for _ in range(2)]
        try:
            assert sorted(held_by_worker(pids, port).values()) == [1, 1]
            stopped = pids[0]
            os.kill(stopped, signal.SIGSTOP)
            try:
                for expected in (2, 3):  # the live worker holds more each time, and still accepts
                    started = time.monotonic()
                    sockets.append(open_kept_alive(port))
                    assert time.monotonic() - started < 5
                    assert held_by_worker(pids, port)[pids[1]] == expected
            finally:
                os.kill(stopped, signal.SIGCONT)
        finally:
            for sock in sockets:
                sock.close()


def test_the_board_reads_the_other_live_workers():
    board = ConnectionBoard()
    board.write(0, 5)
    board.write(1, 2)
    board.write(2, 7)
    assert board.fewest_elsewhere(0) == 2
    assert board.fewest_elsewhere(1) == 5
    board.write(1, -1)  # that worker exited
    assert board.fewest_elsewhere(0) == 7
    board.write(2, -1)
    assert board.fewest_elsewhere(0) is None


# --- following a kept-alive connection ----------------------------------------------------------------


class FakeConnection:
    """What ``BalancedThreadWorker.follows`` reads of gunicorn's TConn: the socket and the parser's buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.parser = SimpleNamespace(unreader=SimpleNamespace(buf=io.BytesIO()))


def following_worker(
    monkeypatch: pytest.MonkeyPatch,
    *,
    threads: int,
    connections: int,
    follow: float,
    answer: Any = True,
    read_ahead: bytes = b"",
) -> tuple[BalancedThreadWorker, list[bytes]]:
    """A worker whose inherited ``handle`` (gthread's) serves a two-byte request, recorded in the list.

    gthread's ``handle`` is replaced by one that takes the parser's buffered bytes as the request if
    there are any, else reads two bytes from the socket (and then leaves ``read_ahead`` in the
    parser's buffer, once, as a body drain reading into the next request does); it answers
    ``answer`` (True: keep alive), and False when the client has closed.
    """
    worker = BalancedThreadWorker.__new__(BalancedThreadWorker)
    worker.alive = True
    worker.nr_conns = connections
    worker.cfg = SimpleNamespace(threads=threads)
    monkeypatch.setattr(BalancedThreadWorker, "FOLLOW_SECONDS", follow)
    served: list[bytes] = []

    def handle(self: ThreadWorker, conn: FakeConnection) -> Any:
        buffered = conn.parser.unreader.buf.getvalue()
        if buffered:
            conn.parser.unreader.buf = io.BytesIO()
            served.append(buffered)
            return answer
        request = conn.sock.recv(2)
        if not request:
            return False
        served.append(request)
        if read_ahead and len(served) == 1:
            conn.parser.unreader.buf.write(read_ahead)
        return answer

    monkeypatch.setattr(ThreadWorker, "handle", handle)
    return worker, served


def test_a_thread_serves_its_connection_s_next_requests_while_they_come(monkeypatch):
    worker, served = following_worker(monkeypatch, threads=2, connections=2, follow=5.0)
    server, client = socket.socketpair()
    with server, client:
        client.sendall(b"1\n")

        def client_side() -> None:
            for request in (b"2\n", b"3\n"):
                deadline = time.monotonic() + 5
                while len(served) < int(request[:1]) - 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.001)
                client.sendall(request)
            while len(served) < 3:
                time.sleep(0.001)
            client.shutdown(socket.SHUT_WR)  # the client closes: the thread's last read ends

        sender = threading.Thread(target=client_side)
        sender.start()
        result = worker.handle(FakeConnection(server))
        sender.join(10)
    assert served == [b"1\n", b"2\n", b"3\n"]
    assert result is False


def test_a_connection_idle_past_the_wait_goes_back_to_the_poller(monkeypatch):
    worker, served = following_worker(monkeypatch, threads=2, connections=1, follow=0.05)
    server, client = socket.socketpair()
    with server, client:
        client.sendall(b"1\n")
        started = time.monotonic()
        assert worker.handle(FakeConnection(server)) is True  # kept alive, for the main loop's poller
        waited = time.monotonic() - started
        client.sendall(b"2\n")  # after the wait: the poller's
    assert served == [b"1\n"]
    assert 0.04 <= waited < 2


@pytest.mark.parametrize(
    ("threads", "connections", "alive"),
    [(2, 3, True), (1, 2, True), (4, 1, False)],
    ids=["more connections than threads", "one thread, two connections", "stopping"],
)
def test_no_following_when_it_could_keep_others_waiting_or_the_worker_stops(monkeypatch, threads, connections, alive):
    worker, served = following_worker(monkeypatch, threads=threads, connections=connections, follow=5.0)
    worker.alive = alive
    server, client = socket.socketpair()
    with server, client:
        client.sendall(b"1\n2\n")  # the next request is there already
        started = time.monotonic()
        assert worker.handle(FakeConnection(server)) is True
        assert time.monotonic() - started < 1
    assert served == [b"1\n"]


@pytest.mark.parametrize("answer", [False, "defer"], ids=["closing", "deferred"])
def test_a_connection_not_kept_alive_is_not_followed(monkeypatch, answer):
    worker, served = following_worker(monkeypatch, threads=2, connections=1, follow=5.0, answer=answer)
    server, client = socket.socketpair()
    with server, client:
        client.sendall(b"1\n2\n")
        assert worker.handle(FakeConnection(server)) == answer
    assert served == [b"1\n"]


def test_a_request_read_ahead_is_served_without_waiting(monkeypatch):
    worker, served = following_worker(monkeypatch, threads=2, connections=1, follow=0.0, read_ahead=b"2\n")
    server, client = socket.socketpair()
    with server, client:
        client.sendall(b"1\n")  # the second request is in the parser's buffer only: the socket is idle
        assert worker.handle(FakeConnection(server)) is True
    assert served == [b"1\n", b"2\n"]


def request_on(sock: socket.socket) -> float:
    """``ask_health`` on a kept-alive connection; the seconds until its whole answer is read."""
    started = time.monotonic()
    ask_health(sock)
    return time.monotonic() - started


@pytest.mark.parametrize("threads", [1, 2], ids=["fewer threads than connections", "a thread per connection"])
def test_kept_alive_connections_taking_turns_are_all_answered_promptly(tmp_path, threads):
    """Two kept-alive connections send requests in turn, each waiting for the other's answer: with one
    thread neither is followed (the thread would keep the other waiting), with two each is."""
    from tests.live import running_gateway

    with running_gateway(tmp_path, workers=1, threads=threads) as gateway:
        port = int(gateway.url.rsplit(":", 1)[1])
        first, second = open_kept_alive(port), open_kept_alive(port)
        with first, second:
            times = [request_on(sock) for _ in range(30) for sock in (first, second)]
    assert max(times) < 1, max(times)
