"""The client library's transparency-log code (docs/decisions.md, Evidence), importable through ``common.clientlib``.

The log's Merkle tree, notes, proofs and tiles are the library's: the gateway has no second implementation.
"""

from __future__ import annotations

from common.clientlib import client_module

client_module("tlog")  # the checkout's client directory on the path, when the package is not installed

from tollgate_client.tlog import checkpoint, merkle, note, tiles  # noqa: E402

__all__ = ["checkpoint", "merkle", "note", "tiles"]
