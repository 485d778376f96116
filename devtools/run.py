"""`make run`: start everything the gateway needs on this machine, stop it all on Ctrl-C.

1. PostgreSQL: ``DATABASE_URL`` if set, else the embedded server (started here, stopped on exit).
2. Migrations, then the first-run operator bootstrap (credentials file path printed).
3. gunicorn on 127.0.0.1:$PORT (default 8000).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from devtools import pg

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, check=True)


def main() -> int:
    env = dict(os.environ)
    started_db = False
    if not env.get("DATABASE_URL"):
        print("Starting embedded PostgreSQL (.data/postgres) ...", flush=True)
        was_running = pg.running_url() is not None
        env["DATABASE_URL"] = pg.start()
        started_db = not was_running
    port = env.get("PORT", "8000")
    env.setdefault("PUBLIC_BASE_URL", f"http://127.0.0.1:{port}")
    env.setdefault("ALLOWED_ORIGINS", f"http://127.0.0.1:{port},http://localhost:{port}")
    children: list[subprocess.Popen[bytes]] = []
    try:
        print("Applying migrations ...", flush=True)
        _manage("migrate", "--no-input", "-v", "0", env=env)
        _manage("bootstrap_operator", env=env)
        _manage("ensure_signing_key", env=env)
        workers = env.get("WEB_CONCURRENCY", "2")
        threads = env.get("GUNICORN_THREADS", "4")
        children.append(
            subprocess.Popen(
                [
                    PY,
                    "-m",
                    "gunicorn",
                    "config.wsgi:application",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--worker-class",
                    "gthread",
                    "--workers",
                    workers,
                    "--threads",
                    threads,
                    "--access-logfile",
                    "-",
                    "--graceful-timeout",
                    "10",
                ],
                cwd=ROOT,
                env=env,
            )
        )
        print(
            f"\nTollgate is serving on http://127.0.0.1:{port}  (docs: /docs, admin: /admin/). Ctrl-C stops.\n",
            flush=True,
        )
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        return next(child.returncode for child in children if child.poll() is not None) or 1
    except KeyboardInterrupt:
        print("\nStopping ...", flush=True)
        return 0
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
        if started_db:
            pg.stop()
            print("Embedded PostgreSQL stopped.", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
