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

from common.errors import conflict_response, is_retryable

logger = logging.getLogger("tollgate.db")

ATTEMPTS = 4
T = TypeVar("T")


def run_retrying(fn: Callable[[], T], *, attempts: int = ATTEMPTS) -> T:
    """Run ``fn`` (one whole transaction) again after a serialization failure or deadlock.

    Raises ``TransactionConflict`` (``common.errors``) when every attempt hit one.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except OperationalError as exc:
            if not is_retryable(exc):
                raise
            pause_after_conflict(exc, attempt, attempts=attempts)
    raise AssertionError("unreachable")


def pause_after_conflict(exc: BaseException, attempt: int, *, attempts: int = ATTEMPTS) -> None:
    """After ``attempt`` (counted from 1) ended in ``exc``, a serialization failure or deadlock: wait a
    little before the next attempt, or raise ``TransactionConflict`` when it was the last.

    For loops that cannot be one ``run_retrying`` call (``billing.services.charge``).
    """
    logger.warning("transaction conflict (attempt %d/%d): %s", attempt, attempts, exc)
    if attempt >= attempts:
        raise conflict_response() from exc
    time.sleep(random.uniform(0.005, 0.03) * attempt)
