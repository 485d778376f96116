"""Audit chain verification: recompute a chain from its stored events and sign a checkpoint of it.

``audit_chain_verify`` serves ``POST /v1/audit/verify-chain`` and the evidence
bundle's chain check. It sits above :mod:`audit.signing` (a valid walk ends in a
signed checkpoint, and a kept checkpoint must verify), which sits above
:mod:`audit.services` (appends and the signing keys), so no two of them import
each other.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import queue
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.evidence_core import CHAIN_ROW_FIELDS, GENESIS_HASH, ChainCheck, _scan_json
from audit.models import AuditEvent, ChainHead, ChainVerificationRecord
from audit.signing import sign_statement, verify_statement
from common.canonical import CanonicalizationError, canonical_bytes, event_bytes, fast_text, iso_utc
from common.errors import RequestValidationError

logger = logging.getLogger("tollgate.audit")

CHECKPOINT_TYPE = "audit_checkpoint"
_HEX64 = re.compile(r"[0-9a-f]{64}")
VERIFY_CHUNK_SIZE = 5000

__all__ = ["CHECKPOINT_TYPE", "ChainVerification", "audit_chain_verify", "checkpoint_recorded_register"]

# Called with (chain, canonical bytes) for each checkpoint a recorded verification signs: the
# transparency log (tlog, above this app) registers itself at start-up (docs/decisions.md, Evidence).
_checkpoint_recorded: list[Callable[[str, bytes], None]] = []


def checkpoint_recorded_register(hook: Callable[[str, bytes], None]) -> None:
    """Have ``hook(chain, canonical bytes)`` called for every checkpoint a recorded verification signs."""
    if hook not in _checkpoint_recorded:
        _checkpoint_recorded.append(hook)


@dataclass(frozen=True)
class ChainVerification:
    """The answer of ``POST /v1/audit/verify-chain`` (AuditChainVerifyResponse)."""

    valid: bool
    chain: str
    from_seq: int
    to_seq: int
    checked_events: int
    head_seq: int
    head_hash: str
    first_broken_seq: int | None
    first_broken_event_id: str | None
    reason: str | None
    checkpoint_verified: bool | None
    checkpoint: dict[str, Any] | None


@dataclass(frozen=True)
class _Walk:
    valid: bool
    to_seq: int
    checked: int
    head_seq: int
    head_hash: str
    last_seq: int
    last_hash: str
    broken_seq: int | None
    broken_event_id: str | None
    reason: str | None
    checkpoint_ok: bool | None


def _check_checkpoint(chain: str, checkpoint: Mapping[str, Any], from_seq: int, to_seq: int | None) -> int:
    """Validate a kept checkpoint's signature and fit; return its size. 422 on any problem."""
    loc = ["body", "checkpoint"]
    signature = checkpoint.get("signature")
    statement = {k: v for k, v in checkpoint.items() if k != "signature"}
    result = verify_statement(statement, str(signature or ""), expected_type=CHECKPOINT_TYPE)
    if not result.valid:
        raise RequestValidationError.single(
            loc, f"The checkpoint's signature does not verify ({result.reason}).", "checkpoint_invalid"
        )
    if statement.get("chain") != chain:
        raise RequestValidationError.single(loc, "The checkpoint belongs to another chain.", "checkpoint_chain")
    size = statement.get("size")
    if type(size) is not int or size < 0:
        raise RequestValidationError.single(loc, "The checkpoint size is not a count.", "checkpoint_invalid")
    if ("first_seq" in statement or "last_seq" in statement) and (
        statement.get("first_seq") != 1 or statement.get("last_seq") != size
    ):
        raise RequestValidationError.single(
            loc, "The checkpoint does not cover its chain from the first event.", "checkpoint_invalid"
        )
    if from_seq != 1 or (to_seq is not None and to_seq < size):
        raise RequestValidationError.single(
            loc,
            "A checkpoint is checked from the start of the chain to at least its size; widen from_seq/to_seq.",
            "checkpoint_range",
        )
    return size


# Chain verification reads each event as three pieces: PostgreSQL renders the
# canonical JSON before and after ``detail`` (to_json() escapes strings exactly
# as RFC 8785 does: \b \f \n \r \t \" \\ short, other controls as \u00xx,
# everything else verbatim; created_at as iso_utc() writes it), Python
# canonicalizes ``detail`` and hashes. The link to the previous event is
# compared in SQL too. Work done by the database server runs in parallel with
# the hashing. Any mismatch is re-checked against the reference encoding of the
# row before it is reported, so this rendering is only ever a fast path.
_CHAIN_ROWS_SQL = """
SELECT seq, event_id,
       '{"chain":' || to_json(chain)::text
         || ',"created_at":"'
         || replace(to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '.000000', '') || 'Z"'
         || ',"detail":',
       detail::text,
       ',"endpoint":' || coalesce(to_json(endpoint)::text, 'null')
         || ',"event":' || to_json(event)::text
         || ',"event_id":' || to_json(event_id)::text
         || ',"key_id":' || coalesce(to_json(key_id)::text, 'null')
         || ',"ok":' || CASE WHEN ok THEN 'true' ELSE 'false' END
         || ',"policy_decision_id":' || coalesce(to_json(policy_decision_id)::text, 'null')
         || ',"request_id":' || coalesce(to_json(request_id)::text, 'null')
         || ',"seq":' || seq::text
         || ',"tenant_id":' || coalesce(to_json(tenant_id)::text, 'null')
         || ',"tool":' || coalesce(to_json(tool)::text, 'null')
         || ',"type":"audit_event","wallet_id":' || coalesce(to_json(wallet_id)::text, 'null')
         || '}',
       prev_hash IS NOT DISTINCT FROM coalesce(lag(hash) OVER (ORDER BY seq), %s),
       hash
FROM audit_event
WHERE chain = %s AND seq >= %s AND seq <= %s
ORDER BY seq
"""


def _reference_bytes(event_id: str) -> bytes | None:
    """The reference canonical bytes of a stored event (None if it cannot be canonicalized)."""
    row = AuditEvent.objects.filter(event_id=event_id).values_list(*CHAIN_ROW_FIELDS).first()
    if row is None:
        return None
    seq, event_id, event, tenant_id, wallet_id, key_id, tool, endpoint, decision, request_id, ok, detail = row[:12]
    chain = AuditEvent.objects.filter(event_id=event_id).values_list("chain", flat=True).get()
    try:
        return event_bytes(chain, seq, event_id, event, tenant_id, wallet_id, key_id, tool, endpoint, decision,
                           request_id, ok, detail, iso_utc(row[12]))  # fmt: skip
    except (CanonicalizationError, TypeError, ValueError):
        return None


def _verify_rendered(
    rows: Iterable[tuple[Any, ...]],
    *,
    start_seq: int,
    start_prev_hash: str,
    checkpoint_seq: int | None,
) -> ChainCheck:
    """``verify_chain_rows`` over rows pre-rendered by ``_CHAIN_ROWS_SQL`` (same rules, same answers)."""
    sha256, scan, fast = hashlib.sha256, _scan_json, fast_text
    expected = start_seq
    prev_raw = bytes.fromhex(start_prev_hash)
    last_seq, last_hash = start_seq - 1, start_prev_hash
    checkpoint_hash = start_prev_hash if checkpoint_seq == start_seq - 1 else None
    checked = 0

    def broken(seq: int, event_id: str, reason: str) -> ChainCheck:
        return ChainCheck(False, checked, last_seq, last_hash, seq, event_id, reason, checkpoint_hash)

    for seq, event_id, head, detail_text, tail, link_ok, row_hash in rows:
        checked += 1
        if seq != expected:
            return broken(seq, event_id, "sequence_gap")
        if not link_ok:
            return broken(seq, event_id, "prev_hash_mismatch")
        hex_digest = None
        try:
            detail, end = scan(detail_text, 0)
            if end == len(detail_text):
                text = fast(detail)
                body = text if text is not None else canonical_bytes(detail).decode()
                digest = sha256(prev_raw + (head + body + tail).encode()).digest()
                hex_digest = digest.hex()
        except (CanonicalizationError, TypeError, ValueError, StopIteration):
            pass
        if hex_digest != row_hash:
            payload = _reference_bytes(event_id)
            if payload is None:
                return broken(seq, event_id, "not_canonicalizable")
            digest = sha256(prev_raw + payload).digest()
            hex_digest = digest.hex()
            if hex_digest != row_hash:
                return broken(seq, event_id, "hash_mismatch")
            logger.warning("audit event %s: SQL rendering differs from the reference encoding", event_id)
        # Here the recomputed hash equals the stored one.
        prev_raw = digest
        last_seq, last_hash = seq, row_hash
        if seq == checkpoint_seq:
            checkpoint_hash = row_hash
        expected += 1
    return ChainCheck(True, checked, last_seq, last_hash, None, None, None, checkpoint_hash)


@contextlib.contextmanager
def _chain_rows(chain: str, from_seq: int, to_seq: int, start_prev_hash: str) -> Iterator[Iterator[tuple[Any, ...]]]:
    """Stream a chain's rows from a server-side cursor, fetching the next chunk while the current one hashes.

    Verification is the hot loop (100,000+ events/s): the ORM's per-row
    conversion (``.values_list().iterator()``) alone costs more than hashing,
    so rows come from a binary-protocol named cursor on the same connection
    and transaction, and a helper thread overlaps the server's work with ours.
    Must run inside a transaction (named cursors live in one).
    """
    connection.ensure_connection()
    raw = connection.connection
    assert raw is not None
    chunks: queue.Queue[list[tuple[Any, ...]] | BaseException] = queue.Queue(maxsize=2)
    stop = threading.Event()
    with raw.cursor(name=f"audit_verify_{threading.get_ident()}", binary=True) as cursor:
        cursor.execute(_CHAIN_ROWS_SQL, [start_prev_hash, chain, from_seq, to_seq])

        def produce() -> None:
            try:
                while not stop.is_set():
                    rows = cursor.fetchmany(VERIFY_CHUNK_SIZE)
                    chunks.put(rows)
                    if not rows:
                        return
            except BaseException as exc:  # handed to the consumer, which re-raises it
                chunks.put(exc)

        def consume() -> Iterator[list[tuple[Any, ...]]]:
            while True:
                item = chunks.get()
                if isinstance(item, BaseException):
                    raise item
                if not item:
                    return
                yield item

        producer = threading.Thread(target=produce, name="audit-verify-fetch", daemon=True)
        producer.start()
        try:
            yield itertools.chain.from_iterable(consume())
        finally:
            stop.set()
            while producer.is_alive():  # unblock a producer waiting on a full queue
                with contextlib.suppress(queue.Empty):
                    chunks.get(timeout=0.01)
            producer.join()


def _walk(chain: str, from_seq: int, to_seq: int | None, checkpoint: Mapping[str, Any] | None) -> _Walk:
    head = ChainHead.objects.filter(chain=chain).values_list("seq", "head_hash").first()
    head_seq, head_hash = head if head is not None else (0, GENESIS_HASH)
    end = head_seq if to_seq is None else min(to_seq, head_seq)
    checkpoint_size = None if checkpoint is None else int(checkpoint["size"])
    start_prev, first_id = GENESIS_HASH, None
    if from_seq > 1:  # a range that starts later trusts its first event's prev_hash
        first = AuditEvent.objects.filter(chain=chain, seq=from_seq).values_list("event_id", "prev_hash").first()
        if first is not None:
            first_id, start_prev = first
    check: ChainCheck
    if not _HEX64.fullmatch(start_prev):
        check = ChainCheck(False, 1, from_seq - 1, "", from_seq, first_id, "prev_hash_mismatch")
    else:
        with _chain_rows(chain, from_seq, end, start_prev) as rows:
            check = _verify_rendered(
                rows, start_seq=from_seq, start_prev_hash=start_prev, checkpoint_seq=checkpoint_size
            )
    valid, reason = check.valid, check.reason
    broken_seq, broken_event_id = check.first_broken_seq, check.first_broken_event_id
    tip_seq, tip_hash = check.last_seq, check.last_hash
    if valid and tip_seq < end:
        valid, reason, broken_seq = False, "missing_events", tip_seq + 1
    elif valid and tip_seq < head_seq:
        # The range ends below the head. Its last hash is vouched for only by the links above it: whoever
        # rewrites an event and recomputes its hash leaves the break at the next one. So the walk goes on
        # to the head (those events are checked, not counted) and a break there makes the range invalid.
        with _chain_rows(chain, tip_seq + 1, head_seq, tip_hash) as rows:
            above = _verify_rendered(rows, start_seq=tip_seq + 1, start_prev_hash=tip_hash, checkpoint_seq=None)
        if not above.valid:
            valid, reason = False, above.reason
            broken_seq, broken_event_id = above.first_broken_seq, above.first_broken_event_id
        elif above.last_seq < head_seq:
            valid, reason, broken_seq = False, "missing_events", above.last_seq + 1
        tip_hash = above.last_hash
    # A valid walk has reached the head here: its last hash must be the head's, with nothing beyond it.
    if valid and tip_hash and tip_hash != head_hash:
        valid, reason, broken_seq = False, "head_mismatch", head_seq
    elif valid:
        beyond = AuditEvent.objects.filter(chain=chain, seq__gt=head_seq).order_by("seq").values_list("event_id")
        extra = beyond.first()
        if extra is not None:
            valid, reason, broken_seq, broken_event_id = False, "events_beyond_head", head_seq + 1, extra[0]
    checkpoint_ok: bool | None = None
    if checkpoint is not None and checkpoint_size is not None:
        checkpoint_ok = check.checkpoint_hash is not None and check.checkpoint_hash == checkpoint.get("head_hash")
        if valid and checkpoint_size > head_seq:
            valid, reason, broken_seq = False, "truncated_below_checkpoint", head_seq + 1
            checkpoint_ok = False
        elif valid and not checkpoint_ok:
            valid, reason, broken_seq = False, "checkpoint_mismatch", checkpoint_size
    return _Walk(
        valid=valid,
        to_seq=end,
        checked=check.checked_events,
        head_seq=head_seq,
        head_hash=head_hash,
        last_seq=check.last_seq,
        last_hash=check.last_hash,
        broken_seq=broken_seq,
        broken_event_id=broken_event_id,
        reason=reason,
        checkpoint_ok=checkpoint_ok,
    )


def audit_chain_verify(
    *,
    chain: str,
    from_seq: int = 1,
    to_seq: int | None = None,
    checkpoint: Mapping[str, Any] | None = None,
    record: bool = False,
) -> ChainVerification:
    """Recompute ``chain`` from ``from_seq`` to ``to_seq`` (default: its head) and report the first break.

    Reads one consistent snapshot (REPEATABLE READ, read only) when called
    outside a transaction, streaming rows in chunks. A range that does not
    start at 1 trusts the ``prev_hash`` of its first event, so it issues no
    checkpoint. A range that ends below the head is anchored: the walk goes on
    to the head (checking, not counting, the events above ``to_seq``) and ends
    at the head row, so a valid answer for an event (the evidence bundle's
    check) means no event up to the head was rewritten, not only that the
    events up to it agree with each other. A kept ``checkpoint`` ({type,
    chain, first_seq, last_seq, size, head_hash, kid, issued_at, signature})
    must verify and is compared with the recomputed hash at its size: a chain
    now shorter than the checkpoint was truncated; a different hash means the
    events below it were rewritten. A valid walk from seq 1 ends with a new
    signed checkpoint naming the range it covers. With ``record`` (the verify-chain endpoint) the
    verdict is kept as the chain's latest verification. The caller has checked access to ``chain``.
    """
    if checkpoint is not None:
        _check_checkpoint(chain, checkpoint, from_seq, to_seq)
    if connection.in_atomic_block:
        walk = _walk(chain, from_seq, to_seq, checkpoint)
    else:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            walk = _walk(chain, from_seq, to_seq, checkpoint)
    signed: dict[str, Any] | None = None
    # A checkpoint never claims events that were not checked: only a walk from the first event
    # issues one, naming the range it covers (a partial walk trusted the prev_hash it started from).
    # A valid walk was anchored at the head, so a checkpoint below the head covers an end that every
    # later link vouches for.
    if walk.valid and walk.last_hash and from_seq == 1:
        statement = {
            "type": CHECKPOINT_TYPE,
            "chain": chain,
            "first_seq": 1,
            "last_seq": walk.last_seq,
            "size": walk.last_seq,
            "head_hash": walk.last_hash,
            "issued_at": iso_utc(timezone.now()),
        }
        result = sign_statement(statement)
        signed = {**result.statement, "signature": result.signature}
        if record:  # the checkpoints an operator or sponsor asked for (not every evidence bundle's)
            for hook in _checkpoint_recorded:
                hook(chain, result.canonical)
    if record:
        ChainVerificationRecord.objects.update_or_create(
            chain=chain,
            defaults={
                "verified_at": timezone.now(),
                "from_seq": from_seq,
                "to_seq": walk.to_seq,
                "valid": walk.valid,
                "reason": (walk.reason or "")[:64],
            },
        )
    return ChainVerification(
        valid=walk.valid,
        chain=chain,
        from_seq=from_seq,
        to_seq=walk.to_seq,
        checked_events=walk.checked,
        head_seq=walk.head_seq,
        head_hash=walk.head_hash,
        first_broken_seq=walk.broken_seq,
        first_broken_event_id=walk.broken_event_id,
        reason=walk.reason,
        checkpoint_verified=walk.checkpoint_ok,
        checkpoint=signed,
    )
