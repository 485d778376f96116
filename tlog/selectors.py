"""Reads of a tenant's log: its checkpoint, inclusion and consistency proofs, tiles and entry bundles.

Every log is public and read-only (docs/decisions.md, Evidence, "Who may read a log"): a proof is
computed from the stored hashes of complete subtrees (``merkle.HashReader``), O(log n) reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from django.urls import reverse

from common.errors import RequestValidationError
from tlog.exceptions import LogNotFound, StatementNotLogged, TileNotFound
from tlog.lib import checkpoint, merkle, tiles
from tlog.models import Leaf, Log, PendingLeaf, WitnessState


def log_head(tenant_id: str) -> Log:
    """The tenant's log head; :class:`LogNotFound` before its first checkpoint."""
    log = Log.objects.filter(tenant_id=tenant_id).first()
    if log is None:
        raise LogNotFound()
    return log


def cosigned_checkpoint(log: Log) -> str:
    """The latest checkpoint with the witnesses' stored cosignature lines appended (still one signed note)."""
    return log.checkpoint + log.cosignatures


def stored_hash_reader(tenant_id: str, seen: dict[tuple[int, int], bytes] | None = None) -> merkle.HashReader:
    """``read(level, index)`` over the tenant's stored hashes: one indexed read each, remembered in ``seen``
    (which may already hold hashes not yet stored: the integrator's new ones)."""
    known: dict[tuple[int, int], bytes] = {} if seen is None else seen

    def read(level: int, index: int) -> bytes:
        key = (level, index)
        if key not in known:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT hash FROM tlog_tree_hash WHERE tenant_id = %s AND level = %s AND idx = %s",
                    [tenant_id, level, index],
                )
                row = cursor.fetchone()
            if row is None:
                raise LookupError(f"no stored hash ({level}, {index}) in the log of {tenant_id}")
            known[key] = bytes(row[0])
        return known[key]

    return read


@dataclass(frozen=True)
class Inclusion:
    """A statement's place in its log: ``proof`` (tlog-proof@v1 text) and ``leaf_index``, or ``pending``."""

    pending: bool
    fetch: str
    leaf_index: int | None = None
    proof: str | None = None

    def transparency(self) -> dict[str, object]:
        """The portable receipt's and the evidence bundle's ``transparency`` member."""
        if self.pending:
            return {"status": "pending", "fetch": self.fetch}
        return {"leaf_index": self.leaf_index, "proof": self.proof}


def proof_url(tenant_id: str, statement_id: str) -> str:
    """Where the statement's proof is served (absolute, on ``PUBLIC_BASE_URL``)."""
    path = reverse("tlog-proof", kwargs={"tenant_id": tenant_id, "statement_id": statement_id})
    return settings.PUBLIC_BASE_URL.rstrip("/") + path


def statement_inclusion(tenant_id: str, statement_id: str) -> Inclusion:
    """The inclusion proof of a statement under the tenant's latest cosigned checkpoint, or pending.

    :class:`StatementNotLogged` when the statement is neither a leaf nor pending in this log (another
    tenant's statement included: each log proves its own leaves only).
    """
    fetch = proof_url(tenant_id, statement_id)
    index = Leaf.objects.filter(tenant_id=tenant_id, statement_id=statement_id).values_list("idx", flat=True).first()
    if index is None:
        if PendingLeaf.objects.filter(tenant_id=tenant_id, statement_id=statement_id).exists():
            return Inclusion(True, fetch)
        raise StatementNotLogged()
    log = log_head(tenant_id)
    path = merkle.inclusion_proof(index, log.size, stored_hash_reader(tenant_id))
    proof = checkpoint.TlogProof(index, tuple(path), cosigned_checkpoint(log))
    return Inclusion(False, fetch, index, proof.text())


def consistency(tenant_id: str, old: int, new: int) -> list[bytes]:
    """The consistency proof from size ``old`` to size ``new`` of the tenant's log (RFC 9162 2.1.4)."""
    log = log_head(tenant_id)
    if not 0 < old <= new <= log.size:
        raise RequestValidationError.single(
            ["query", "new"], f"A consistency proof takes 0 < old <= new <= {log.size} (the log's size).", "value_error"
        )
    return merkle.consistency_proof(old, new, stored_hash_reader(tenant_id))


def tile(tenant_id: str, path: str) -> tuple[bytes, bool]:
    """The bytes of the tlog-tiles ``path`` of the tenant's log and whether it is a full (immutable) tile.

    A hash tile holds stored hashes only; an entry bundle the leaves themselves. A path the log has not
    reached yet (or a partial tile wider than the log has) is :class:`TileNotFound`.
    """
    try:
        level, index, width = tiles.parse_tile_path(path)
    except ValueError as exc:
        raise TileNotFound() from exc
    log = log_head(tenant_id)
    if level == "entries":
        first, height = index * tiles.TILE_WIDTH, 0
    else:
        assert isinstance(level, int)
        first, height = index * tiles.TILE_WIDTH, level * tiles.TILE_HEIGHT
    if height >= 63 or first + width > log.size >> height:
        raise TileNotFound()
    full = width == tiles.TILE_WIDTH
    if level == "entries":
        leaves = list(
            Leaf.objects.filter(tenant_id=tenant_id, idx__gte=first, idx__lt=first + width)
            .order_by("idx")
            .values_list("leaf", flat=True)
        )
        return tiles.entry_bundle(bytes(leaf) for leaf in leaves), full
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT idx, hash FROM tlog_tree_hash WHERE tenant_id = %s AND level = %s AND idx >= %s AND idx < %s",
            [tenant_id, height, first, first + width],
        )
        stored = {(height, int(idx)): bytes(value) for idx, value in cursor.fetchall()}
    return tiles.tile_bytes(int(level), index, width, lambda lv, ix: stored[(lv, ix)]), full


def statement_transparency(tenant_id: str, statement_id: str) -> dict[str, object] | None:
    """The ``transparency`` member of a statement's portable export or evidence bundle: its proof once
    integrated, ``{"status": "pending", "fetch": url}`` before; None for a statement the log never had."""
    try:
        return statement_inclusion(tenant_id, statement_id).transparency()
    except StatementNotLogged:
        return None


def witness_states() -> list[dict[str, object]]:
    """Each configured witness's standing with the integrator, in the order of ``TLOG_WITNESSES``:
    ``ok``, ``backing_off`` (skipped until ``retry_at`` after ``failures`` failures to answer) or
    ``unknown`` (not asked yet). Names and states only: never a URL nor a witness's words."""
    names = [str(witness["name"]) for witness in settings.TLOG_WITNESSES]
    stored = {state.name: state for state in WitnessState.objects.filter(name__in=names)}
    out: list[dict[str, object]] = []
    for name in names:
        state = stored.get(name)
        out.append(
            {
                "name": name,
                "status": "unknown" if state is None else state.status,
                "failures": 0 if state is None else state.failures,
                "retry_at": None if state is None else state.retry_at,
            }
        )
    return out
