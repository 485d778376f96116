"""The client library's transparency-log code, imported as ``receipts.verify`` imports it (docs/decisions.md, Evidence).

The gateway's environment does not install the client package; its source sits in the same checkout,
so the directory is put on the path when the import fails. The log's Merkle tree, notes, proofs and
tiles are the library's: the gateway has no second implementation.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tollgate_client.tlog  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    sys.path.append(str(Path(__file__).resolve().parent.parent / "client"))

from tollgate_client.tlog import checkpoint, merkle, note, tiles

__all__ = ["checkpoint", "merkle", "note", "tiles"]
