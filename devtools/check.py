"""`make test`: lint, type-check, check the migrations and run the whole suite on real PostgreSQL.

With ``DATABASE_URL`` unset the embedded server is started for the run and
stopped afterwards (unless it was already running). ``makemigrations --check``
fails the run when the models have changes no migration records; it runs once
the server is up, as it reads the database's migration history. Extra arguments
go to pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from devtools import pg

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def step(title: str, cmd: list[str], env: dict[str, str]) -> None:
    print(f"\n=== {title}: {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    result = subprocess.run(cmd, cwd=ROOT, env=env)
    print(f"=== {title}: exit {result.returncode} in {time.monotonic() - started:.1f}s", flush=True)
    if result.returncode != 0:
        raise SystemExit(result.returncode)


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    embedded = not env.get("DATABASE_URL")
    # Before any step: whether this run is the one that starts the server (and so stops it).
    was_running = embedded and pg.running_url() is not None
    try:
        step("ruff check", [str(BIN / "ruff"), "check", "."], env)
        step("ruff format", [str(BIN / "ruff"), "format", "--check", "."], env)
        step("mypy", [str(BIN / "mypy"), "."], env)
        if embedded:
            env["DATABASE_URL"] = pg.start()
        step("makemigrations", [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"], env)
        step("pytest", [str(BIN / "pytest"), *argv], env)
    finally:
        if embedded and not was_running:
            pg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
