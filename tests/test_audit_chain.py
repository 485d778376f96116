"""Audit chain verification: tampering anywhere in a 1,000-event chain is found at the right event.

The helpers at the top (fast chain building, raw-SQL tampering) are shared by the other audit tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from audit.chain_verification import audit_chain_verify
from audit.evidence_core import GENESIS_HASH, chain_hash
from audit.models import AuditEvent, ChainHead
from audit.services import audit_record
from audit.signing import verify_statement
from common.canonical import event_bytes, iso_utc
from common.ids import new_id


def build_chain(
    chain: str, n: int, *, tenant_id: str | None = None, start: int = 1, times: list | None = None
) -> list[AuditEvent]:
    """Append ``n`` events to ``chain`` in one bulk insert, hashed exactly as ``audit_record`` hashes."""
    head, _ = ChainHead.objects.get_or_create(chain=chain)
    prev = head.head_hash if start > 1 else GENESIS_HASH
    base = timezone.now()
    rows = []
    for seq in range(start, start + n):
        event = AuditEvent(
            event_id=new_id("evt"),
            chain=chain,
            seq=seq,
            event="tool.called" if seq % 3 else "api_key.created",
            tenant_id=tenant_id,
            wallet_id=f"agt_wallet{seq % 4}",
            key_id="key_k1",
            tool="search.web" if seq % 2 else None,
            endpoint="/mcp",
            policy_decision_id=None,
            request_id=f"req_{seq}",
            ok=seq % 5 != 0,
            detail={"n": seq, "note": "caf\u00e9 \u2028", "items": [1, "two", None, True]},
            created_at=times[seq - start] if times else base + timedelta(microseconds=seq),
            prev_hash=prev,
        )
        event.hash = chain_hash(prev, event_bytes(*fields(event)))
        prev = event.hash
        rows.append(event)
    AuditEvent.objects.bulk_create(rows)
    head.seq = start + n - 1
    head.head_hash = prev
    head.save(update_fields=["seq", "head_hash", "updated_at"])
    return rows


def fields(e: AuditEvent) -> tuple:
    return (
        e.chain, e.seq, e.event_id, e.event, e.tenant_id, e.wallet_id, e.key_id, e.tool, e.endpoint,
        e.policy_decision_id, e.request_id, e.ok, e.detail, iso_utc(e.created_at),
    )  # fmt: skip


@contextlib.contextmanager
def tampering() -> Iterator:
    """A cursor with the immutability trigger disabled (inside the test's transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_event DISABLE TRIGGER audit_event_immutable")
        try:
            yield cursor
        finally:
            cursor.execute("ALTER TABLE audit_event ENABLE TRIGGER audit_event_immutable")


def rehash_from(chain: str, seq: int, *, head: bool = True) -> None:
    """What a careful attacker does after an edit: recompute every hash from ``seq`` on, and (``head``) the head."""
    rows = list(AuditEvent.objects.filter(chain=chain, seq__gte=seq).order_by("seq"))
    before = AuditEvent.objects.filter(chain=chain, seq__lt=seq).order_by("-seq").first()
    prev = before.hash if before else GENESIS_HASH
    with tampering() as cursor:
        for e in rows:
            new_hash = chain_hash(prev, event_bytes(*fields(e)))
            cursor.execute(
                "UPDATE audit_event SET prev_hash = %s, hash = %s WHERE event_id = %s", [prev, new_hash, e.event_id]
            )
            prev = new_hash
        if not head:
            return
        cursor.execute(
            "UPDATE audit_chain_head SET seq = (SELECT max(seq) FROM audit_event WHERE chain = %s), head_hash = %s "
            "WHERE chain = %s",
            [chain, prev, chain],
        )


# --- tests ------------------------------------------------------------------------

N = 1000
CHAIN = "spn_tampertest000000000000"


@pytest.fixture
def signing(tmp_path, settings):
    settings.SIGNING_KEY_FILE = str(tmp_path / "signing-keys.json")
    settings.SIGNING_KEY_PRIVATE = ""


@pytest.fixture
def chain(db, signing) -> list[AuditEvent]:
    return build_chain(CHAIN, N, tenant_id=CHAIN)


def verify(**kwargs):
    return audit_chain_verify(chain=CHAIN, **kwargs)


def test_intact_chain_is_valid_with_a_signed_checkpoint(chain):
    result = verify()
    assert result.valid
    assert result.reason is None
    assert (result.checked_events, result.head_seq, result.head_hash) == (N, N, chain[-1].hash)
    assert result.first_broken_seq is None
    assert result.first_broken_event_id is None
    checkpoint = dict(result.checkpoint)
    signature = checkpoint.pop("signature")
    assert checkpoint["type"] == "audit_checkpoint"
    assert checkpoint["size"] == N
    assert checkpoint["head_hash"] == chain[-1].hash
    assert checkpoint["chain"] == CHAIN
    assert verify_statement(checkpoint, signature, expected_type="audit_checkpoint").valid


def test_chain_written_by_audit_record_verifies(db, signing):
    for i in range(30):
        audit_record(event="x", ok=i % 2 == 0, tenant_id=CHAIN, detail={"i": i, "f": 0.5 if i == 7 else "s"})
    result = verify()
    assert result.valid
    assert result.checked_events == 30


@pytest.mark.parametrize("position", [1, 2, 500, N])
def test_altered_event(chain, position):
    with tampering() as cursor:
        cursor.execute(
            "UPDATE audit_event SET detail = '{\"n\": -1}'::jsonb WHERE chain = %s AND seq = %s", [CHAIN, position]
        )
    result = verify()
    assert not result.valid
    assert (result.first_broken_seq, result.first_broken_event_id, result.reason) == (
        position,
        chain[position - 1].event_id,
        "hash_mismatch",
    )
    assert result.checkpoint is None


@pytest.mark.parametrize("column", ["ok", "created_at", "event", "wallet_id", "request_id"])
def test_every_column_is_covered(chain, column):
    change = {
        "ok": "ok = NOT ok",
        "created_at": "created_at = created_at + interval '1 second'",
        "event": "event = 'x'",
        "wallet_id": "wallet_id = 'agt_other'",
        "request_id": "request_id = NULL",
    }[column]
    with tampering() as cursor:
        cursor.execute(f"UPDATE audit_event SET {change} WHERE chain = %s AND seq = 700", [CHAIN])
    result = verify()
    assert (result.valid, result.first_broken_seq, result.reason) == (False, 700, "hash_mismatch")


def test_altered_event_with_its_hash_recomputed(chain):
    """Fixing up the edited event's own hash moves the break to the next link."""
    with tampering() as cursor:
        cursor.execute("UPDATE audit_event SET ok = NOT ok WHERE chain = %s AND seq = 300", [CHAIN])
    target = AuditEvent.objects.get(chain=CHAIN, seq=300)
    with tampering() as cursor:
        cursor.execute(
            "UPDATE audit_event SET hash = %s WHERE event_id = %s",
            [chain_hash(target.prev_hash, event_bytes(*fields(target))), target.event_id],
        )
    result = verify()
    assert (result.first_broken_seq, result.first_broken_event_id, result.reason) == (
        301,
        chain[300].event_id,
        "prev_hash_mismatch",
    )


@pytest.mark.parametrize("position", [1, 400, N - 1])
def test_deleted_event(chain, position):
    with tampering() as cursor:
        cursor.execute("DELETE FROM audit_event WHERE chain = %s AND seq = %s", [CHAIN, position])
    result = verify()
    assert (result.valid, result.first_broken_seq, result.first_broken_event_id, result.reason) == (
        False,
        position + 1,
        chain[position].event_id,
        "sequence_gap",
    )


def test_deleted_last_event(chain):
    with tampering() as cursor:
        cursor.execute("DELETE FROM audit_event WHERE chain = %s AND seq = %s", [CHAIN, N])
    result = verify()
    assert (result.valid, result.first_broken_seq, result.first_broken_event_id, result.reason) == (
        False,
        N,
        None,
        "missing_events",
    )


@pytest.mark.parametrize("position", [1, 600, N - 1])
def test_reordered_events(chain, position):
    """Swap two neighbours' places (their seq numbers)."""
    a, b = chain[position - 1], chain[position]
    with tampering() as cursor:
        cursor.execute("UPDATE audit_event SET seq = -1 WHERE event_id = %s", [a.event_id])
        cursor.execute("UPDATE audit_event SET seq = %s WHERE event_id = %s", [a.seq, b.event_id])
        cursor.execute("UPDATE audit_event SET seq = %s WHERE event_id = %s", [b.seq, a.event_id])
    result = verify()
    assert not result.valid
    assert (result.first_broken_seq, result.first_broken_event_id) == (position, b.event_id)
    assert result.reason in ("prev_hash_mismatch", "hash_mismatch")


def _make_room(cursor, position: int) -> None:
    cursor.execute("UPDATE audit_event SET seq = -(seq + 1) WHERE chain = %s AND seq >= %s", [CHAIN, position])
    cursor.execute("UPDATE audit_event SET seq = -seq WHERE chain = %s AND seq < 0", [CHAIN])
    cursor.execute("UPDATE audit_chain_head SET seq = seq + 1 WHERE chain = %s", [CHAIN])


def _forged(position: int, prev_hash: str, *, valid_hash: bool) -> AuditEvent:
    forged = AuditEvent(
        event_id=new_id("evt"), chain=CHAIN, seq=position, event="wallet.funded", tenant_id=CHAIN,
        ok=True, detail={"amount": "1000000.00000000"}, created_at=timezone.now(), prev_hash=prev_hash,
    )  # fmt: skip
    forged.hash = chain_hash(prev_hash, event_bytes(*fields(forged))) if valid_hash else "ab" * 32
    return forged


@pytest.mark.parametrize("position", [1, 250, N])
def test_inserted_event_with_a_bogus_hash(chain, position):
    with tampering() as cursor:
        _make_room(cursor, position)
    forged = _forged(position, chain[position - 2].hash if position > 1 else GENESIS_HASH, valid_hash=False)
    forged.save(force_insert=True)
    result = verify()
    assert (result.valid, result.first_broken_seq, result.first_broken_event_id, result.reason) == (
        False,
        position,
        forged.event_id,
        "hash_mismatch",
    )


@pytest.mark.parametrize("position", [1, 250, N])
def test_inserted_event_with_a_well_forged_hash(chain, position):
    """A correctly hashed insertion still breaks the link to the event it displaced."""
    with tampering() as cursor:
        _make_room(cursor, position)
    forged = _forged(position, chain[position - 2].hash if position > 1 else GENESIS_HASH, valid_hash=True)
    forged.save(force_insert=True)
    result = verify()
    assert not result.valid
    assert (result.first_broken_seq, result.first_broken_event_id, result.reason) == (
        position + 1,
        chain[position - 1].event_id,
        "prev_hash_mismatch",
    )


def test_appended_event_behind_the_heads_back(chain):
    forged = _forged(N + 1, chain[-1].hash, valid_hash=True)
    forged.save(force_insert=True)
    result = verify()
    assert (result.valid, result.first_broken_seq, result.first_broken_event_id, result.reason) == (
        False,
        N + 1,
        forged.event_id,
        "events_beyond_head",
    )


def test_head_row_rewritten(chain):
    ChainHead.objects.filter(chain=CHAIN).update(head_hash="cd" * 32)
    result = verify()
    assert (result.valid, result.first_broken_seq, result.reason) == (False, N, "head_mismatch")


def test_truncated_tail_is_caught_by_a_kept_checkpoint(chain):
    kept = verify().checkpoint
    with tampering() as cursor:
        cursor.execute("DELETE FROM audit_event WHERE chain = %s AND seq > 900", [CHAIN])
        cursor.execute(
            "UPDATE audit_chain_head SET seq = 900, head_hash = %s WHERE chain = %s", [chain[899].hash, CHAIN]
        )
    # Without the checkpoint the shorter chain is self-consistent...
    assert verify().valid
    # ...but not against what was attested before.
    result = verify(checkpoint=kept)
    assert (result.valid, result.reason, result.checkpoint_verified) == (False, "truncated_below_checkpoint", False)
    assert result.first_broken_seq == 901
    assert result.head_seq == 900


def test_rewrite_below_a_kept_checkpoint_is_caught(chain):
    kept = verify().checkpoint
    with tampering() as cursor:
        cursor.execute("UPDATE audit_event SET ok = NOT ok WHERE chain = %s AND seq = 10", [CHAIN])
    rehash_from(CHAIN, 10)
    assert verify().valid  # a complete re-hash is self-consistent
    result = verify(checkpoint=kept)
    assert (result.valid, result.reason, result.first_broken_seq, result.checkpoint_verified) == (
        False,
        "checkpoint_mismatch",
        N,
        False,
    )


def test_checkpoint_still_matches_after_appends(chain):
    kept = verify().checkpoint
    build_chain(CHAIN, 5, tenant_id=CHAIN, start=N + 1)
    result = verify(checkpoint=kept)
    assert result.valid
    assert result.checkpoint_verified is True
    assert result.checked_events == N + 5


def test_range_verification(chain):
    result = verify(from_seq=200, to_seq=300)
    assert result.valid
    assert result.checked_events == 101
    assert result.to_seq == 300
    # Events 1..199 were not checked: a partial range signs no checkpoint (it would claim them).
    assert result.checkpoint is None
    full = verify(to_seq=300)
    assert (full.checkpoint["first_seq"], full.checkpoint["last_seq"], full.checkpoint["size"]) == (1, 300, 300)
    assert full.checkpoint["head_hash"] == chain[299].hash
    with tampering() as cursor:
        cursor.execute("UPDATE audit_event SET ok = NOT ok WHERE chain = %s AND seq = 250", [CHAIN])
    assert verify(from_seq=200, to_seq=300).first_broken_seq == 250
    assert verify(from_seq=251, to_seq=300).valid  # a range trusts its first prev_hash
    assert verify(to_seq=N + 50).to_seq == N


def test_a_range_ending_below_the_head_is_anchored_by_the_links_above_it(chain):
    """Rewriting events 300..k and recomputing their hashes leaves the break at k + 1, above any to_seq <= k."""
    assert verify(to_seq=300).valid
    with tampering() as cursor:
        cursor.execute("UPDATE audit_event SET ok = NOT ok WHERE chain = %s AND seq = 300", [CHAIN])
    rehash_from(CHAIN, 300)  # a complete re-hash, head included, is self-consistent (a kept checkpoint catches it)
    assert verify(to_seq=300).valid
    with tampering() as cursor:
        cursor.execute("UPDATE audit_event SET ok = NOT ok WHERE chain = %s AND seq = 300", [CHAIN])
        event = AuditEvent.objects.get(chain=CHAIN, seq=300)
        cursor.execute(
            "UPDATE audit_event SET hash = %s WHERE event_id = %s",
            [chain_hash(event.prev_hash, event_bytes(*fields(event))), event.event_id],
        )
    for kwargs in (
        {"to_seq": 300},
        {"to_seq": 299},
        {"from_seq": 200, "to_seq": 300},
        {"from_seq": 300, "to_seq": 300},
    ):
        result = verify(**kwargs)
        assert (result.valid, result.first_broken_seq, result.reason) == (False, 301, "prev_hash_mismatch"), kwargs
        assert result.checkpoint is None
        assert result.to_seq == kwargs["to_seq"]
    assert verify(from_seq=301, to_seq=400).valid  # a range above the rewrite trusts its start and is anchored
    assert verify(to_seq=400).first_broken_seq == 301
    # The rewrite carried on through the last event, but the head row left alone: the head disagrees.
    rehash_from(CHAIN, 300, head=False)
    result = verify(to_seq=300)
    assert (result.valid, result.first_broken_seq, result.reason, result.checkpoint) == (
        False,
        N,
        "head_mismatch",
        None,
    )


def test_timestamps_render_as_hashed(db, signing):
    """The database renders created_at for verification exactly as iso_utc() did for hashing."""
    from datetime import UTC, datetime

    times = [
        datetime(2026, 1, 1, 0, 0, 0, 0, tzinfo=UTC),
        datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(1999, 12, 31, 12, 30, 5, 100000, tzinfo=UTC),
        datetime(2038, 1, 19, 3, 14, 8, 0, tzinfo=UTC),
    ]
    build_chain(CHAIN, len(times), tenant_id=CHAIN, times=times)
    result = verify()
    assert result.valid, result
    assert result.checked_events == len(times)


def test_details_that_would_not_read_back_are_refused(db, signing):
    for bad in (2.0**53, float("nan"), float("inf"), {"nested": [1e300]}):
        with pytest.raises(ValueError):
            audit_record(event="x", ok=True, tenant_id=CHAIN, detail={"v": bad})
    audit_record(event="x", ok=True, tenant_id=CHAIN, detail={"v": 0.1, "w": 1.0, "big": str(2**64)})
    assert verify().valid


def test_empty_chain(db, signing):
    result = audit_chain_verify(chain="system")
    assert result.valid
    assert result.checked_events == 0
    assert result.head_seq == 0
    assert result.head_hash == GENESIS_HASH
    assert result.checkpoint is not None
    assert result.checkpoint["size"] == 0


def test_immutability_in_code_and_database(chain):
    from django.db import IntegrityError, transaction

    event = AuditEvent.objects.get(chain=CHAIN, seq=5)
    event.ok = not event.ok
    with pytest.raises(RuntimeError):
        event.save()
    with pytest.raises(RuntimeError):
        event.delete()
    with pytest.raises(RuntimeError):
        AuditEvent.objects.filter(chain=CHAIN).update(ok=True)
    with pytest.raises(RuntimeError):
        AuditEvent.objects.filter(chain=CHAIN).delete()
    for sql in ["UPDATE audit_event SET ok = true WHERE seq = 5", "DELETE FROM audit_event WHERE seq = 5"]:
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)


TRICKY = ['a"b', "back\\slash", "ctl\x01\x1f\x7f", "nl\n\r\t\b\f", "caf\u00e9 \u2028 \u20ac", "\U0001f600", "\ufb33"]


def test_database_rendering_matches_the_reference_encoding(db, signing, monkeypatch):
    """The fast path (canonical JSON rendered by PostgreSQL) never needs the reference fallback."""
    from datetime import UTC, datetime

    from audit import chain_verification

    for i, text in enumerate(TRICKY):
        fields = dict(wallet_id=text, key_id=text, tool=text, endpoint=text, policy_decision_id=text, request_id=text)
        audit_record(event=f"e.{text}", ok=bool(i % 2), tenant_id=CHAIN, detail={text: [text, i, None]}, **fields)
    build_chain(CHAIN, 2, tenant_id=CHAIN, start=len(TRICKY) + 1, times=[datetime(2026, 1, 1, tzinfo=UTC)] * 2)
    calls: list[str] = []
    reference = chain_verification._reference_bytes

    def spy(event_id: str) -> bytes | None:
        calls.append(event_id)
        return reference(event_id)

    monkeypatch.setattr(chain_verification, "_reference_bytes", spy)
    result = verify()
    assert result.valid, result
    assert result.checked_events == len(TRICKY) + 2
    assert calls == []


def test_reference_fallback_when_the_fast_path_disagrees(chain, monkeypatch):
    from audit import chain_verification

    monkeypatch.setattr(chain_verification, "fast_text", lambda value: "{}")  # a broken fast path
    assert verify(to_seq=50).valid  # every event re-checked against the reference encoding
    with tampering() as cursor:
        cursor.execute("UPDATE audit_event SET ok = NOT ok WHERE chain = %s AND seq = 20", [CHAIN])
    assert (verify(to_seq=50).first_broken_seq, verify(to_seq=50).reason) == (20, "hash_mismatch")


# --- A checkpoint states what was checked (adversarial review item 8) ------------------------


def test_a_partial_verification_signs_no_checkpoint_and_a_full_one_names_its_range(db):
    from audit.chain_verification import audit_chain_verify
    from audit.services import audit_record

    chain = "spn_checkpointrange"
    events = [audit_record(event="test.range", ok=True, tenant_id=chain, detail={"i": i}) for i in range(5)]
    with tampering() as cursor:
        cursor.execute("UPDATE audit_event SET detail = '{\"i\": 99}'::jsonb WHERE event_id = %s", [events[1].event_id])
    partial = audit_chain_verify(chain=chain, from_seq=3)
    assert partial.valid is True  # events 3..5 are intact, taken on trust from event 2's hash
    assert partial.checkpoint is None  # ... so nothing is signed about events 1..5
    full = audit_chain_verify(chain=chain)
    assert full.valid is False
    assert full.first_broken_seq == 2
    assert full.checkpoint is None


def test_a_full_checkpoint_covers_seq_1_to_its_size(db):
    from audit.chain_verification import audit_chain_verify
    from audit.services import audit_record

    chain = "spn_checkpointfull"
    for i in range(3):
        audit_record(event="test.range", ok=True, tenant_id=chain, detail={"i": i})
    checkpoint = audit_chain_verify(chain=chain).checkpoint
    assert checkpoint is not None
    assert (checkpoint["first_seq"], checkpoint["last_seq"], checkpoint["size"]) == (1, 3, 3)
    assert audit_chain_verify(chain=chain, checkpoint=checkpoint).checkpoint_verified is True


def test_the_database_links_each_event_as_chain_hash_does(db, signing):
    """audit_append (PostgreSQL) computes sha256(prev || canonical bytes) exactly as Python's chain_hash.

    Details that look like the split point (a nested ``seq``, the marker inside a string, non-ASCII
    text, a float that takes the reference encoder) do not move it: the top-level seq is linked.
    """
    details: list[dict[str, object]] = [
        {"seq": 9_007_199_254_740_991, "nested": {"seq": 1, "tenant_id": "x"}},
        {"text": '"seq":9007199254740991,"tenant_id":', "emoji": "\u00e9\u4e2d\U0001f600"},
        {"ratio": 0.5, "list": [1, "two", None, True]},
        {},
    ]
    events = [
        audit_record(event="test.link", ok=True, tenant_id="tn_link", wallet_id="agt_x", detail=d) for d in details
    ]
    events.append(audit_record(event="test.system", ok=False, detail={"k": "v"}))  # the system chain
    for record in events:
        stored = AuditEvent.objects.get(event_id=record.event_id)
        assert (stored.seq, stored.prev_hash, stored.hash) == (record.seq, record.prev_hash, record.hash)
        payload = event_bytes(
            stored.chain,
            stored.seq,
            stored.event_id,
            stored.event,
            stored.tenant_id,
            stored.wallet_id,
            stored.key_id,
            stored.tool,
            stored.endpoint,
            stored.policy_decision_id,
            stored.request_id,
            stored.ok,
            stored.detail,
            iso_utc(stored.created_at),
        )
        assert stored.hash == chain_hash(stored.prev_hash, payload)
    assert [e.seq for e in events[:4]] == [1, 2, 3, 4]
    assert events[1].prev_hash == events[0].hash
    assert ChainHead.objects.get(chain="tn_link").head_hash == events[3].hash
    assert audit_chain_verify(chain="tn_link").valid


def test_the_worked_example_of_the_format_document_recomputes():
    """docs/audit-chain.md: its example events are what event_bytes writes, and its hashes are the links."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "audit-chain.md").read_text(encoding="utf-8")
    example = text.split("## Worked example", 1)[1].split("\n## ", 1)[0]  # its own section, not later ones
    documented = re.findall(r"```json\n(.*?)\n```", example, flags=re.S)
    hashes = re.findall(r"hash\(\d\) = `([0-9a-f]{64})`", example)
    assert len(documented) == len(hashes) == 2
    prev = GENESIS_HASH
    for doc_bytes, doc_hash in zip(documented, hashes, strict=True):
        event = json.loads(doc_bytes)
        assert event.pop("type") == "audit_event"
        rebuilt = event_bytes(
            event["chain"],
            event["seq"],
            event["event_id"],
            event["event"],
            event["tenant_id"],
            event["wallet_id"],
            event["key_id"],
            event["tool"],
            event["endpoint"],
            event["policy_decision_id"],
            event["request_id"],
            event["ok"],
            event["detail"],
            event["created_at"],
        )
        assert rebuilt == doc_bytes.encode()
        assert chain_hash(prev, rebuilt) == doc_hash
        assert hashlib.sha256(bytes.fromhex(prev) + rebuilt).hexdigest() == doc_hash  # the document's own recipe
        prev = doc_hash
