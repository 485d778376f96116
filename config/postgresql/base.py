"""Django's PostgreSQL backend, with a connection health check that costs no round trip.

Django checks a persistent connection before a request first uses it
(``CONN_HEALTH_CHECKS``) with ``SELECT 1``: a round trip per request, on every
request of the hot path. An idle connection has nothing to read: PostgreSQL sends
nothing between queries, except when it ends the session (a restart,
``pg_terminate_backend``, an idle timeout), when it sends the error and closes the
socket. So here a connection is usable when psycopg has not marked it broken and
its socket has nothing to read, which a zero-timeout ``select`` tells without
sending anything. A database restart still turns into a reconnect before the
request runs, never into a failed request. (Nothing here uses LISTEN, the one way
an idle session legitimately receives data.)
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    """The PostgreSQL backend; only the health check differs."""

    def is_usable(self) -> bool:
        connection = self.connection
        if connection is None or connection.closed:
            return False
        if connection.info.transaction_status != pq.TransactionStatus.IDLE:
            return bool(super().is_usable())  # not idle: only a query can tell
        try:
            readable, _, _ = select.select([connection.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable
