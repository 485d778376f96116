"""The connection health check without a round trip (config/postgresql/base.py)."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)


def _server_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_a_live_idle_connection_is_usable_without_a_query(monkeypatch):
    _server_pid()  # connected and idle
    raw = connection.connection

    def no_queries(*args, **kwargs):
        raise AssertionError("the health check sent a query")

    monkeypatch.setattr(raw, "cursor", no_queries)
    monkeypatch.setattr(raw, "execute", no_queries)
    assert connection.is_usable()


def test_a_session_the_server_ended_is_replaced_before_the_next_query():
    pid = _server_pid()
    settings = connection.get_connection_params()
    with psycopg.connect(**settings, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    while connection.is_usable():  # the server's goodbye arrives on the idle socket
        assert time.monotonic() < deadline, "the terminated session still looks usable"
        time.sleep(0.01)
    # What Django does at a request's first query: check, close if unusable, reconnect.
    connection.health_check_done = False  # type: ignore[attr-defined]
    connection.close_if_health_check_failed()
    assert _server_pid() != pid


def test_a_closed_connection_is_unusable():
    _server_pid()
    connection.connection.close()
    assert not connection.is_usable()
    connection.close()
