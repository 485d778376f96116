"""Root pytest configuration: mark the process as a test run before settings load, and start the
embedded PostgreSQL server when ``DATABASE_URL`` is unset (the settings only point at it)."""

import os

os.environ.setdefault("TOLLGATE_TESTING", "1")

if not os.environ.get("DATABASE_URL"):
    from devtools import pg

    pg.ensure_running()
