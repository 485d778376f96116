"""The loop of a worker command (``sweep_dispatches``, ``deliver_webhooks``): rounds until SIGTERM."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

from django.db import close_old_connections


def rounds_run(one_round: Callable[[], None], *, loop: bool, interval: float) -> None:
    """Run ``one_round`` once, or with ``loop`` every ``interval`` seconds until SIGTERM.

    A SIGTERM lets the round under way finish, then the loop ends (within 0.2 s when it comes
    between rounds). Each round starts with ``close_old_connections``: a process that lives for
    days must not keep a broken or over-age connection.
    """
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    while True:
        close_old_connections()
        one_round()
        if not loop or stop:
            return
        deadline = time.monotonic() + interval
        while time.monotonic() < deadline and not stop:
            time.sleep(0.2)
        if stop:
            return
