"""Serialization failures and deadlocks (SQLSTATE 40001, 40P01): retry, else 409 with the key released.

PostgreSQL aborts one of the transactions involved; nothing it wrote remains. A
service whose transaction is safe to run again retries it a few times; when the
conflict persists the caller gets 409 ``transaction_conflict`` with
``Retry-After``, never a 500, and nothing was written.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError

from config.errors import Conflict

logger = logging.getLogger("tollgate.db")

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
ATTEMPTS = 4
T = TypeVar("T")


class TransactionConflict(Conflict):
    code = "transaction_conflict"
    message = "The database refused the transaction because of a concurrent one; nothing was written. Retry."


def is_retryable(exc: BaseException) -> bool:
    """True for a serialization failure or deadlock (directly or wrapped by Django)."""
    for candidate in (exc, exc.__cause__, exc.__context__):
        if candidate is not None and getattr(candidate, "sqlstate", None) in RETRYABLE_SQLSTATES:
            return True
    return False


def conflict_response() -> TransactionConflict:
    return TransactionConflict(headers={"Retry-After": "1"}, retry_after_seconds=1)


def run_retrying(fn: Callable[[], T], *, attempts: int = ATTEMPTS) -> T:
    """Run ``fn`` (one whole transaction) again after a serialization failure or deadlock.

    Raises ``TransactionConflict`` when every attempt hit one.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except OperationalError as exc:
            if not is_retryable(exc):
                raise
            logger.warning("transaction conflict (attempt %d/%d): %s", attempt, attempts, exc)
            if attempt == attempts:
                raise conflict_response() from exc
            time.sleep(random.uniform(0.005, 0.03) * attempt)
    raise AssertionError("unreachable")
