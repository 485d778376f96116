"""The client library (``client/tollgate_client``) for the checks the gateway must share with the standalone
verifier (docs/decisions.md, Evidence). Imports no app.

The gateway's environment does not install the client package; its source sits in the same checkout, so
its directory is put on the path when the import fails.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

CLIENT_DIR = Path(__file__).resolve().parent.parent / "client"


def client_module(name: str) -> ModuleType:
    """``tollgate_client.<name>``, from the installed client or this checkout's ``client/`` directory."""
    try:
        return importlib.import_module(f"tollgate_client.{name}")
    except ImportError:
        if str(CLIENT_DIR) not in sys.path:
            sys.path.append(str(CLIENT_DIR))
        return importlib.import_module(f"tollgate_client.{name}")
