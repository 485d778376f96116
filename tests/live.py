"""A real gunicorn gateway for end-to-end tests, on the test database, bound to 127.0.0.1 on a free port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
from django.db import connection

from audit import keystore
from tests.upstream_server import free_port

ROOT = Path(__file__).resolve().parent.parent


def test_database_url() -> str:
    """The URL of the database this test run uses (tests must commit: ``transaction=True``)."""
    s = connection.settings_dict
    host = s.get("HOST") or ""
    if host.startswith("/"):
        return f"postgresql://{quote(s['USER'])}:{quote(s.get('PASSWORD') or '')}@/{s['NAME']}?host={host}"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgresql://{quote(s['USER'])}:{quote(s.get('PASSWORD') or '')}@{host}{port}/{s['NAME']}"


def database_deadlocks() -> int:
    """Deadlocks PostgreSQL has detected in the test database so far.

    A deadlock the gateway retried (a batch run again charge by charge, a phase transaction run
    again) leaves no trace in any answer; this count is where it shows. Backends report theirs
    when their transaction ends or, at the latest, when they exit (a stopped gateway's have).
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        row = cursor.fetchone()
    return int(row[0])


@dataclass
class LiveGateway:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def worker_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


@contextlib.contextmanager
def running_gateway(
    tmp_path: Path, *, workers: int = 1, threads: int = 4, extra_env: dict[str, str] | None = None, **env: str
) -> Iterator[LiveGateway]:
    """Start gunicorn on the test database; stop it (and its workers) on exit."""
    port = free_port()
    log = tmp_path / f"gunicorn-{port}.log"
    full_env = {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "TOLLGATE_TESTING": "1",
        "PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
        "ALLOWED_ORIGINS": f"http://127.0.0.1:{port}",
        "CONN_MAX_AGE": "60",
        # The same evidence key as this test process (its temporary key file).
        "SIGNING_KEY_FILE": str(keystore.key_file_path()),
        # prometheus-client's multiprocess files (config/gunicorn.py), one directory per instance.
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / f"metrics-{port}"),
        **env,
        **(extra_env or {}),
    }
    cmd = [
        sys.executable, "-m", "gunicorn", "-c", "python:config.gunicorn", "config.wsgi:application",
        "--bind", f"127.0.0.1:{port}",
        "--workers", str(workers), "--threads", str(threads), "--graceful-timeout", "5",
        "--limit-request-line", "16384", "--timeout", "60",
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"gunicorn exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield LiveGateway(url, process, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        connection.close()
