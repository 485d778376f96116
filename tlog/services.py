"""The integrator: pending leaves get their index, the tree its stored hashes, the log a signed checkpoint.

Runs off the hot path (``manage.py tlog_integrate``; docs/audit-chain.md, "The transparency log"). The
governed call only appends pending leaves (tlog/sql/tlog_leaf_pending.sql); every index, hash and
checkpoint of a tenant's log is written here, under the tenant's log lock, in one transaction: a leaf
with an index is always under the tenant's latest checkpoint, and two integrators never give two
leaves the same index nor skip one.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.models import SYSTEM_CHAIN
from tlog.keys import log_signer, origin_of
from tlog.kinds import KINDS
from tlog.lib import checkpoint, merkle, note
from tlog.models import Leaf, Log, PendingLeaf
from tlog.selectors import stored_hash_reader

logger = logging.getLogger("tollgate.tlog")

__all__ = [
    "INTEGRATE_BATCH",
    "TLOG_LOCK_CLASS",
    "Integrated",
    "chain_checkpoint_id",
    "tlog_chain_checkpoint_append",
    "tlog_integrate",
    "tlog_tenants_pending",
]

# The lock class of a tenant's log: advisory-lock keys are (class, hashtext(tenant id)), the two-int
# form (docs/scaling.md, "Advisory locks"), so it is one tenant's and collides with no other class.
TLOG_LOCK_CLASS = 0x71_06_10
# Pending leaves integrated per transaction: bounds the transaction, not the log (the loop goes on).
INTEGRATE_BATCH = 10_000


@dataclass(frozen=True)
class Integrated:
    """What one integration of a tenant's log did: the sizes before and after and the new checkpoint."""

    tenant_id: str
    old_size: int
    size: int
    checkpoint: str


def chain_checkpoint_id(canonical: bytes) -> str:
    """The log's id of an audit-chain checkpoint (no table keeps it): ``ckp_`` and 40 hex digits of its SHA-256."""
    return "ckp_" + hashlib.sha256(canonical).hexdigest()[:40]


def tlog_chain_checkpoint_append(chain: str, canonical: bytes) -> None:
    """Append a signed audit-chain checkpoint of a tenant's chain as a pending leaf of the tenant's log.

    The leaf is its canonical signed bytes, carried by the pending row (``kind`` ``audit_checkpoint``,
    id :func:`chain_checkpoint_id`). The ``system`` chain belongs to no tenant's log. Runs in the
    caller's transaction, if any.
    """
    if chain == SYSTEM_CHAIN:
        return
    PendingLeaf.objects.create(
        tenant_id=chain,
        kind="audit_checkpoint",
        statement_id=chain_checkpoint_id(canonical),
        leaf=canonical,
        created_at=timezone.now(),
    )


def tlog_tenants_pending() -> list[str]:
    """The tenants with pending leaves (a scan of the pending table, off the hot path)."""
    return list(PendingLeaf.objects.values_list("tenant_id", flat=True).distinct().order_by("tenant_id"))


def _leaves_in_order(
    tenant_id: str, pending: list[tuple[Any, ...]]
) -> tuple[list[tuple[int, str, str, bytes]], list[int]]:
    """``(pending id, kind, statement id, leaf bytes)`` of the pending rows, in order, and the pending ids
    of the rows whose bytes cannot be read, each logged at error with its ids.

    A pending row is written in its statement's own INSERT (tlog/sql/tlog_leaf_pending.sql), so a
    statement row that is not there (deleted, or moved to another tenant) never will be: its pending row
    is kept out of the tree rather than stop the tenant's log for good (docs/decisions.md, Evidence,
    "One integrator per tenant at a time")."""
    wanted: dict[str, list[str]] = defaultdict(list)
    for _, kind, statement_id, leaf in pending:
        if leaf is None and kind in KINDS and KINDS[kind].load is not None:
            wanted[kind].append(statement_id)
    loaded: dict[tuple[str, str], bytes] = {}
    for kind, ids in wanted.items():
        loader = KINDS[kind].load
        assert loader is not None
        for statement_id, data in loader(tenant_id, ids).items():
            loaded[(kind, statement_id)] = data
    out: list[tuple[int, str, str, bytes]] = []
    unreadable: list[int] = []
    for pending_id, kind, statement_id, leaf in pending:
        found = bytes(leaf) if leaf is not None else loaded.get((kind, statement_id))
        if found is None:
            logger.error("tlog %s: the %s %s (pending row %s) has no readable leaf in this tenant; kept out of "
                         "the log", tenant_id, kind, statement_id, pending_id)  # fmt: skip
            unreadable.append(pending_id)
            continue
        out.append((pending_id, kind, statement_id, found))
    return out, unreadable


def _new_hashes(old_size: int, leaves: list[bytes], read: merkle.HashReader,
                fresh: dict[tuple[int, int], bytes]) -> list[tuple[int, int, bytes]]:  # fmt: skip
    """The hashes of the complete subtrees the new leaves close, each once: ``(level, index, hash)``."""
    new_size = old_size + len(leaves)
    out: list[tuple[int, int, bytes]] = []
    for offset, leaf in enumerate(leaves):
        value = merkle.leaf_hash(leaf)
        fresh[(0, old_size + offset)] = value
        out.append((0, old_size + offset, value))
    level = 1
    while new_size >> level:
        for index in range(old_size >> level, new_size >> level):
            value = merkle.node_hash(read(level - 1, 2 * index), read(level - 1, 2 * index + 1))
            fresh[(level, index)] = value
            out.append((level, index, value))
        level += 1
    return out


def _pending_delete(tenant_id: str, ids: list[int]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM tlog_pending_leaf WHERE tenant_id = %s AND id = ANY(%s)", [tenant_id, ids])


@transaction.atomic(durable=True)
def tlog_integrate(*, tenant_id: str, limit: int = INTEGRATE_BATCH) -> Integrated | None:
    """Integrate up to ``limit`` of the tenant's pending leaves and sign the tenant's new checkpoint.

    Guarantees, in one transaction under the tenant's log lock (an advisory lock: another integrator
    of the same tenant skips it and answers None): the pending leaves, oldest first, get the indexes
    that follow the log's size, without a gap; their leaf rows, the hashes of every complete subtree
    they close and the log's new size, root and checkpoint (a C2SP signed note, signed by the log key
    under the log's origin) are written together, and the pending rows deleted. A pending row whose
    statement cannot be read (gone, or another tenant's now) is deleted, logged at error with its ids,
    and never a leaf. None when the lock is held elsewhere or nothing could be integrated. Witnesses
    are asked afterwards (``tlog.witnesses``).
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))", [TLOG_LOCK_CLASS, tenant_id])
        if not cursor.fetchone()[0]:
            return None
    log = Log.objects.filter(tenant_id=tenant_id).first()
    old_size = log.size if log is not None else 0
    pending = list(
        PendingLeaf.objects.filter(tenant_id=tenant_id)
        .order_by("id")
        .values_list("id", "kind", "statement_id", "leaf")[:limit]
    )
    taken, unreadable = _leaves_in_order(tenant_id, pending)
    if unreadable:
        _pending_delete(tenant_id, unreadable)
    # A statement is a leaf once: a repeated one (the same chain checkpoint recorded twice) is dropped.
    seen = set(
        Leaf.objects.filter(tenant_id=tenant_id, statement_id__in=[sid for _, _, sid, _ in taken]).values_list(
            "statement_id", flat=True
        )
    )
    leaves = []
    for row in taken:
        if row[2] not in seen:
            seen.add(row[2])
            leaves.append(row)
    if len(leaves) < len(taken):
        _pending_delete(tenant_id, [pending_id for pending_id, *_ in taken])
    if not leaves:
        return None
    fresh: dict[tuple[int, int], bytes] = {}
    read = stored_hash_reader(tenant_id, fresh)
    hashes = _new_hashes(old_size, [leaf for *_, leaf in leaves], read, fresh)
    size = old_size + len(leaves)
    root = merkle.tree_hash(size, read)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO tlog_leaf (tenant_id, idx, kind, statement_id, leaf, created_at) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            [(tenant_id, old_size + i, kind, sid, leaf, now) for i, (_, kind, sid, leaf) in enumerate(leaves)],
        )
        cursor.executemany(
            "INSERT INTO tlog_tree_hash (tenant_id, level, idx, hash) VALUES (%s, %s, %s, %s)",
            [(tenant_id, level, index, value) for level, index, value in hashes],
        )
    _pending_delete(tenant_id, [pending_id for pending_id, *_ in leaves])
    text = checkpoint.Checkpoint(origin_of(tenant_id), size, root).text()
    signed = note.format_note(text, [log_signer(tenant_id).sign(text.encode("utf-8"))])
    Log.objects.update_or_create(
        tenant_id=tenant_id,
        defaults={"size": size, "root_hash": root, "checkpoint": signed, "cosignatures": "", "updated_at": now},
    )
    return Integrated(tenant_id, old_size, size, signed)
