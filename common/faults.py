"""Test-only fault injection at the boundaries of the governed action.

Off unless ``TOLLGATE_FAULTS`` is set in the environment, and refused outright
in production settings. ``TOLLGATE_FAULTS="after_claim=kill"`` makes the
worker process SIGKILL itself the first time it reaches that point (a marker
file in ``TOLLGATE_FAULT_DIR`` makes each fault fire once across processes, so
a restarted worker can serve the retry); ``=raise`` raises ``InjectedFault``.

Points: ``before_claim`` (authorized, nothing written yet), ``after_claim`` (the
claim committed: action, debit, reservation and audit event, one statement),
``after_upstream``, ``before_receipt``.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

POINTS = ("before_claim", "after_claim", "after_upstream", "before_receipt")


class InjectedFault(RuntimeError):
    """Raised at a fault point configured with ``=raise``."""


def _configured() -> dict[str, str]:
    spec = os.environ.get("TOLLGATE_FAULTS", "")
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        out[name] = action or "raise"
    return out


def fault_point(name: str) -> None:
    """Fire the fault configured for ``name``, once. A no-op unless TOLLGATE_FAULTS names it."""
    if "TOLLGATE_FAULTS" not in os.environ:
        return
    action = _configured().get(name)
    if action is None:
        return
    marker_dir = Path(os.environ.get("TOLLGATE_FAULT_DIR") or tempfile.gettempdir())
    try:
        fd = os.open(marker_dir / f"tollgate-fault-{name}.fired", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFault(f"injected fault at {name}")
