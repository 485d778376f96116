"""RFC 6962 / RFC 9162 Merkle tree hashing, proofs from stored hashes, and their verification.

The tree is the one of RFC 9162 section 2.1.1: a leaf hashes as ``SHA-256(0x00 || leaf)``, an inner
node as ``SHA-256(0x01 || left || right)``, the empty tree as ``SHA-256()``.

Proofs are built from a :data:`HashReader`, ``read(level, index)``: the hash of the *complete*
subtree of ``2**level`` leaves starting at leaf ``index * 2**level`` (level 0: the leaf hashes).
These are the hashes a log stores once and never changes (the same nodes tlog-tiles serves), so a
server answers ``read`` from its table and a proof costs O(log n) reads: every node of a proof is
a complete subtree except at most one right-border node, which is folded from at most log2(n)
complete ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "HashReader",
    "ProofError",
    "consistency_proof",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "root_from_inclusion_proof",
    "subtree_hash",
    "tree_hash",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

HashReader = Callable[[int, int], bytes]


class ProofError(ValueError):
    """A proof that does not verify, or arguments no proof can exist for; ``reason`` is a stable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def leaf_hash(leaf: bytes) -> bytes:
    """``SHA-256(0x00 || leaf)``."""
    return hashlib.sha256(b"\x00" + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (n > 1): where RFC 9162 splits ``n`` leaves."""
    return 1 << ((n - 1).bit_length() - 1)


def subtree_hash(lo: int, hi: int, read: HashReader) -> bytes:
    """MTH(D[lo:hi]) for a subtree of the RFC 9162 recursion (``lo`` a multiple of the split above it).

    The range is cut into complete subtrees of decreasing size (one read each) and folded from the right.
    """
    if hi <= lo:
        raise ValueError("empty range")
    parts: list[bytes] = []
    start = lo
    while start < hi:
        level = (hi - start).bit_length() - 1
        # A complete subtree must also be aligned on its own size.
        while start % (1 << level):
            level -= 1
        parts.append(read(level, start >> level))
        start += 1 << level
    result = parts[-1]
    for part in reversed(parts[:-1]):
        result = node_hash(part, result)
    return result


def tree_hash(size: int, read: HashReader) -> bytes:
    """The root hash of the tree of the first ``size`` leaves."""
    return EMPTY_ROOT if size == 0 else subtree_hash(0, size, read)


def inclusion_proof(index: int, size: int, read: HashReader) -> list[bytes]:
    """PATH(index, D[0:size]) of RFC 9162 section 2.1.3.1, leaf's sibling first."""
    if not 0 <= index < size:
        raise ProofError("index_out_of_range", f"index {index} is not in a tree of size {size}")
    path: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            path.append(subtree_hash(lo + k, hi, read))
            hi = lo + k
        else:
            path.append(subtree_hash(lo, lo + k, read))
            lo = lo + k
    path.reverse()
    return path


def consistency_proof(size1: int, size2: int, read: HashReader) -> list[bytes]:
    """PROOF(size1, D[0:size2]) of RFC 9162 section 2.1.4.1 (empty when the sizes are equal)."""
    if not 0 < size1 <= size2:
        raise ProofError("bad_sizes", f"no consistency proof from size {size1} to size {size2}")
    proof: list[bytes] = []
    lo, hi, m, complete = 0, size2, size1, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            proof.append(subtree_hash(lo + k, hi, read))
            hi = lo + k
        else:
            proof.append(subtree_hash(lo, lo + k, read))
            lo, m, complete = lo + k, m - k, False
    if not complete:
        proof.append(subtree_hash(lo, hi, read))
    proof.reverse()
    return proof


def _check_hash(value: bytes, what: str) -> None:
    if not isinstance(value, bytes | bytearray) or len(value) != HASH_SIZE:
        raise ProofError("malformed_hash", f"{what} is not a {HASH_SIZE}-byte hash")


def root_from_inclusion_proof(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` leads to from leaf hash ``leaf`` at ``index`` (RFC 9162 section 2.1.3.2)."""
    if not 0 <= index < size:
        raise ProofError("index_out_of_range", f"index {index} is not in a tree of size {size}")
    _check_hash(leaf, "the leaf hash")
    fn, sn, r = index, size - 1, bytes(leaf)
    for p in proof:
        _check_hash(p, "a proof hash")
        if sn == 0:
            raise ProofError("proof_too_long", "the inclusion proof has more hashes than the tree has levels")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("proof_too_short", "the inclusion proof has fewer hashes than the tree has levels")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> None:
    """Raise :class:`ProofError` unless ``proof`` shows leaf hash ``leaf`` at ``index`` of the tree ``root``."""
    if root_from_inclusion_proof(index, size, leaf, proof) != root:
        raise ProofError("root_mismatch", "the inclusion proof does not lead to the checkpoint's root hash")


def verify_consistency(size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes) -> None:
    """Raise :class:`ProofError` unless ``proof`` shows the tree ``root2`` extends the tree ``root1``.

    RFC 9162 section 2.1.4.2. As in the reference implementations, a proof from size 0 is refused
    (the empty tree is a prefix of every tree: callers that accept it say so themselves).
    """
    if size2 < size1:
        raise ProofError("rollback", f"size {size2} is smaller than size {size1}")
    if size1 == 0:
        raise ProofError("bad_sizes", "a consistency proof from the empty tree is meaningless")
    if size1 == size2:
        if proof:
            raise ProofError("proof_too_long", "equal sizes take an empty proof")
        if root1 != root2:
            raise ProofError("root_mismatch", "two different roots for the same size: a fork")
        return
    if not proof:
        raise ProofError("proof_too_short", "an empty consistency proof between different sizes")
    for p in proof:
        _check_hash(p, "a proof hash")
    path = list(proof)
    if size1 & (size1 - 1) == 0:  # size1 is a power of two: the old root is itself a node of the path
        path.insert(0, bytes(root1))
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("proof_too_long", "the consistency proof has more hashes than it needs")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("proof_too_short", "the consistency proof has fewer hashes than it needs")
    if fr != root1:
        raise ProofError("root_mismatch", "the consistency proof does not lead to the old root")
    if sr != root2:
        raise ProofError("root_mismatch", "the consistency proof does not lead to the new root")
