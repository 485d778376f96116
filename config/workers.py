"""gunicorn's gthread worker for the gateway: each new connection goes where the fewest are open, and a
thread serves a kept-alive connection's next request itself when it comes at once.

Used by config/gunicorn.py (``worker_class``). Importing this module makes the shared
connection board (:data:`BOARD`), so gunicorn's master must import it before it forks.
"""

from __future__ import annotations

import mmap
import select
import struct
import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker


class ConnectionBoard:
    """How many connections each live worker holds, in memory shared by the master and its workers.

    The master makes it before it forks and gives each worker a slot (``pre_fork``); a worker
    writes its own count once it serves and reads the others'. A slot holds -1 while no worker
    serves from it (free, booting, stopping or exited).
    Counts are read without a lock: a count one event old only delays a balancing decision.
    """

    SLOTS = 256  # more than any worker count this gateway runs with (a slot is 4 bytes)
    _CELL = struct.Struct("=i")

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, self.SLOTS * self._CELL.size)  # MAP_SHARED: the forked workers see it
        for slot in range(self.SLOTS):
            self.write(slot, -1)

    def write(self, slot: int, count: int) -> None:
        self._CELL.pack_into(self._memory, slot * self._CELL.size, count)

    def fewest_elsewhere(self, slot: int) -> int | None:
        """The fewest connections any other live worker holds (None: no other live worker)."""
        cells = self._CELL.iter_unpack(self._memory)
        return min((count for index, (count,) in enumerate(cells) if count >= 0 and index != slot), default=None)


# Made when gunicorn loads its settings (config/gunicorn.py), in the master, before it forks the workers.
BOARD = ConnectionBoard()


class BalancedThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, taking a new connection only where the fewest connections are open.

    Every worker polls the same listening socket and whichever wakes first accepts, so a burst of
    connections (a client's pool of keep-alive connections) often lands on one worker: measured,
    8 connections to 2 workers split 4/4 in 7 runs of 20, 6/2 in 7 and 8/0 in one, and a worker's
    threads share one interpreter lock, so a lopsided split ran on one core of two. Here a worker
    that holds more connections than another leaves a new one to the others for ``DEFER_SECONDS``
    and takes it only if it is still waiting then (the others may all be busy or stuck), which
    is least-connections balancing. Each worker publishes its count on the shared
    :class:`ConnectionBoard` as soon as it accepts and before it waits for events, so the others
    see every change; a worker that is still booting or is stopping is not on the board.

    A thread that has answered a request on a kept-alive connection waits up to
    ``FOLLOW_SECONDS`` for that connection's next request and serves it itself
    (:meth:`handle`), instead of handing the connection back to the main loop's poller, which
    hands it to a thread again when it is readable: two thread switches, a pipe write and read,
    and a register and unregister of the socket per request. It does so only while the worker
    holds no more connections than it has threads, so a thread waiting on its connection keeps
    none of the others waiting; a connection accepted during the wait waits at most
    ``FOLLOW_SECONDS`` for a thread. Measured: a bare WSGI application's CPU per request
    0.17-0.19 ms against 0.32-0.33 ms at concurrency 1, 0.17-0.19 against 0.20-0.21 at 8; the
    gateway's CPU per charge about 12 % lower at concurrency 8 (per unit of PostgreSQL's CPU, in
    nine alternating pairs of runs; docs/decisions.md).
    """

    DEFER_SECONDS = 0.2
    FOLLOW_SECONDS = 0.002

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.board_slot: int = -1  # set by pre_fork, in the master, before the fork
        self._deferred_until: float | None = None

    def accept(self, listener: Any) -> None:
        now = time.monotonic()
        # A deferral whose time has passed answers the connection it was made for; one older than two
        # deferrals was made for a connection another worker took, and this is a new one.
        fresh = self._deferred_until is None or now > self._deferred_until + self.DEFER_SECONDS
        if fresh and self.board_slot >= 0:
            fewest = BOARD.fewest_elsewhere(self.board_slot)
            if fewest is not None and fewest < self.nr_conns:
                self._deferred_until = now + self.DEFER_SECONDS
                super().set_accept_enabled(False)  # run() turns it back on once the deferral is over
                return
        self._deferred_until = None
        super().accept(listener)
        self.publish()  # at once: a count published only at the next loop misleads the others

    def handle(self, conn: Any) -> Any:
        """Serve ``conn``'s request, then its next ones while :meth:`follows` says so (in this thread)."""
        result = super().handle(conn)
        while result is True and self.follows(conn):
            result = super().handle(conn)
        return result

    def follows(self, conn: Any) -> bool:
        """Whether this thread serves the next request of ``conn`` (kept alive, just answered) itself.

        Yes while the worker serves and holds no more connections than threads, when the request is
        buffered already (read ahead with the last one) or arrives within ``FOLLOW_SECONDS``;
        otherwise the connection goes back to the main loop's poller, as gthread does.
        """
        if not self.alive or self.nr_conns > self.cfg.threads:
            return False
        if conn.parser.unreader.buf.getvalue():
            return True
        poller = select.poll()
        try:
            poller.register(conn.sock, select.POLLIN)
            return bool(poller.poll(self.FOLLOW_SECONDS * 1000))
        except (OSError, ValueError):  # closed meanwhile: the main loop finishes it
            return False

    def set_accept_enabled(self, enabled: bool) -> None:
        if enabled and self._deferred_until is not None and time.monotonic() < self._deferred_until:
            return
        super().set_accept_enabled(enabled)

    def publish(self) -> None:
        """Write this worker's count to its slot; a stopping worker takes no new connections: it leaves the board."""
        if self.board_slot >= 0:
            BOARD.write(self.board_slot, self.nr_conns if self.alive else -1)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        self.publish()
        if self._deferred_until is not None and not self._accepting:
            timeout = max(0.0, min(timeout, self._deferred_until - time.monotonic()))
        super().wait_for_and_dispatch_events(timeout)
