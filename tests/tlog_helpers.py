"""An in-memory transparency log for the tlog tests: leaves, stored hashes, signed checkpoints, proofs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))

from tollgate_client.tlog import (
    Checkpoint,
    Signer,
    TlogProof,
    consistency_proof,
    format_note,
    generate_signer,
    inclusion_proof,
    leaf_hash,
    log_origin,
    node_hash,
    tree_hash,
)


class MemoryLog:
    """An append-only Merkle tree kept as every complete subtree's hash, ``levels[level][index]``."""

    def __init__(self, origin: str, signer: Signer | None = None) -> None:
        self.origin = origin
        self.signer = signer or generate_signer(origin)
        self.leaves: list[bytes] = []
        self.levels: list[list[bytes]] = [[]]

    @classmethod
    def for_tenant(cls, tenant: str, gateway: str = "gw.test") -> MemoryLog:
        return cls(log_origin(gateway=gateway, tenant=tenant))

    def append(self, leaf: bytes) -> int:
        index = len(self.leaves)
        self.leaves.append(leaf)
        self.levels[0].append(leaf_hash(leaf))
        level = 0
        while len(self.levels[level]) % 2 == 0:
            left, right = self.levels[level][-2:]
            if len(self.levels) == level + 1:
                self.levels.append([])
            self.levels[level + 1].append(node_hash(left, right))
            level += 1
        return index

    def read(self, level: int, index: int) -> bytes:
        return self.levels[level][index]

    @property
    def size(self) -> int:
        return len(self.leaves)

    def root(self, size: int | None = None) -> bytes:
        return tree_hash(self.size if size is None else size, self.read)

    def checkpoint(self, size: int | None = None, *, signer: Signer | None = None) -> str:
        """The signed checkpoint note of the tree of ``size`` leaves (default: all of them)."""
        size = self.size if size is None else size
        text = Checkpoint(self.origin, size, self.root(size)).text()
        return format_note(text, [(signer or self.signer).sign(text.encode())])

    def consistency(self, old: int, new: int | None = None) -> list[bytes]:
        new = self.size if new is None else new
        return [] if old in (0, new) else consistency_proof(old, new, self.read)

    def proof(self, index: int, note: str) -> str:
        """The tlog-proof@v1 of leaf ``index`` under the checkpoint ``note``."""
        size = Checkpoint.from_note(note).size
        return TlogProof(index, tuple(inclusion_proof(index, size, self.read)), note).text()

    def copy_rewritten(self, index: int, leaf: bytes) -> MemoryLog:
        """The same log with leaf ``index`` replaced, signed by the same key: a rewritten history."""
        other = MemoryLog(self.origin, self.signer)
        for i, old in enumerate(self.leaves):
            other.append(leaf if i == index else old)
        return other

    def copy_without(self, index: int) -> MemoryLog:
        """The same log with leaf ``index`` deleted, signed by the same key."""
        other = MemoryLog(self.origin, self.signer)
        for i, old in enumerate(self.leaves):
            if i != index:
                other.append(old)
        return other
