"""gunicorn settings for the gateway: ``gunicorn -c python:config.gunicorn config.wsgi:application``.

Sets up ``prometheus-client``'s multiprocess mode (``common.metrics``): each
worker writes its counters to memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR``
and a scrape sums them. The directory belongs to one gunicorn instance: when
the variable is unset a fresh one is made under the system's temporary
directory, and it is emptied when the instance starts, so counters start at
zero with the instance (Prometheus reads that as a counter reset). Files of
exited workers stay, so their counts are not lost; a worker that exits is
marked dead for the client's live gauges.

Each worker sets up its own trace exporter after the fork when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set (``post_fork``; ``common.tracing``).

Workers are gunicorn's gthread workers, taking each new connection where the
fewest are open (``config.workers.BalancedThreadWorker``).

The control socket (gunicorn's runtime management interface) lives under the checkout's ``.data/``,
one per master process, instead of ``~/.gunicorn/`` (shared by every checkout and instance of the
user). Requests for static files (``/static/``, ``/favicon.ico``) are left out of the access log
(``QuietStaticLogger``): a page load is then one line, not one per asset.

Command-line options (bind, workers, threads...) still apply on top of this file.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gunicorn.glogging import Logger

from config.workers import BOARD, BalancedThreadWorker, ConnectionBoard

_directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="tollgate-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _directory  # inherited by the workers before they import the client

limit_request_line = 16384  # the charge operation takes long query strings (docs/decisions.md)
graceful_timeout = 10
worker_class = BalancedThreadWorker

_data = Path(__file__).resolve().parent.parent / ".data"
_data.mkdir(exist_ok=True)
control_socket = str(_data / f"gunicorn-{os.getpid()}.ctl")

# Paths whose requests the access log leaves out: assets a page pulls in, not requests anyone acts on.
QUIET_PREFIXES = ("/static/", "/favicon.ico")


class QuietStaticLogger(Logger):
    """gunicorn's logger, with no access line for static files."""

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        if str(environ.get("PATH_INFO", "")).startswith(QUIET_PREFIXES):
            return
        super().access(resp, req, environ, request_time)


logger_class = QuietStaticLogger


def on_starting(server: Any) -> None:
    """Empty the metrics directory: files of an earlier run of this instance would be summed in."""
    path = Path(_directory)
    if path.exists():
        for child in path.iterdir():
            if child.is_file() and child.suffix == ".db":
                child.unlink()
            elif child.is_dir():
                shutil.rmtree(child)
    path.mkdir(parents=True, exist_ok=True)


def pre_fork(server: Any, worker: Any) -> None:
    """Give the worker about to be forked a slot of the connection board no live worker holds."""
    if not isinstance(worker, BalancedThreadWorker):  # another worker class given on the command line
        return
    taken = {getattr(live, "board_slot", -1) for live in server.WORKERS.values()}
    worker.board_slot = next(slot for slot in range(ConnectionBoard.SLOTS) if slot not in taken)
    BOARD.write(worker.board_slot, -1)  # on the board once it serves (BalancedThreadWorker)


def post_fork(server: Any, worker: Any) -> None:
    """Traces, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: each worker its own exporter and batch thread.

    After the fork, so that the ``BatchSpanProcessor``'s thread runs in the worker that fills its
    queue (a thread started in the master would not survive the fork). ``common.tracing``.
    """
    from common.tracing import tracing_setup

    tracing_setup()


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid, _directory)
    if getattr(worker, "board_slot", -1) >= 0:
        BOARD.write(worker.board_slot, -1)


def post_worker_init(worker: Any) -> None:
    """Keep the garbage collector off what the worker loaded at start, and let it run less often.

    A worker's objects are mostly Django, the app and their modules, loaded once and kept for
    good; every full collection walked all of them again. ``gc.freeze()`` sets them aside, and a
    larger first-generation threshold (7,000 instead of 700) means fewer collections of the
    short-lived objects each request makes (most are freed by reference counting anyway).
    Measured under load: the workers' time in collections went from about 5 % to about 2 % of
    their CPU.
    """
    _upstream_default_ensure()
    gc.collect()
    gc.freeze()
    gc.set_threshold(7000, 10, 10)


def _upstream_default_ensure() -> None:
    """``UPSTREAM_MCP_URL`` becomes (or updates) the upstream server ``default`` as each worker starts.

    A deployment that names its upstream in the environment keeps working when the URL or the
    timeouts change between restarts (``mcpgateway.services.upstreams.upstream_default_ensure``).
    A failure is logged and does not stop the worker: its calls then use the record as it is.
    """
    import logging

    try:
        from mcpgateway.services.upstreams import upstream_default_ensure

        upstream_default_ensure()
    except Exception:
        logging.getLogger("tollgate.gateway").exception("could not record UPSTREAM_MCP_URL as the server default")
