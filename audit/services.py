"""Audit and evidence writes.

``audit_record`` is the one way any app appends to an audit chain;
``alert_raise`` records an alert; ``signing_key_ensure`` and
``signing_key_rotate`` manage the evidence signing keys,
``signing_key_active_published`` reads the active one for publication, and ``active_kid``
names the one that signs. Signatures are made in :mod:`audit.signing`, which
builds on these; chain verification, which signs checkpoints, is in
:mod:`audit.chain_verification`, above both.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Required, TypedDict, Unpack

from django.db import connection, transaction
from django.utils import timezone

from audit import keystore
from audit.evidence_core import chain_hash
from audit.exceptions import SigningKeyRetired, SigningKeyUnavailable
from audit.models import SYSTEM_CHAIN, Alert, AuditEvent, SigningKey, SigningKeyState
from common import fastsql
from common.cache import BoundedCache
from common.canonical import check_round_trip, event_bytes, iso_utc
from common.ids import new_id
from common.records import record_json
from config.middleware import get_request_id

logger = logging.getLogger("tollgate.audit")

__all__ = [
    "active_kid",
    "alert_raise",
    "audit_append_prepared",
    "audit_event_prepare",
    "audit_record",
    "chain_hash",
    "forget_active_kid",
    "signing_key_active_published",
    "signing_key_ensure",
    "signing_key_rotate",
]


_APPEND_SQL = (
    "SELECT event_seq, event_prev_hash, event_hash "
    "FROM audit_append(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s)"
)
# A stand-in sequence number: the canonical bytes are built around it and split where it stands.
_SEQ_SENTINEL = 9_007_199_254_740_991
_SEQ_MARKER = b'"seq":' + str(_SEQ_SENTINEL).encode() + b',"tenant_id":'


def _payload_around_seq(payload: bytes) -> tuple[bytes, bytes]:
    """(prefix, suffix) with ``prefix + <seq> + suffix`` the event's canonical bytes for any seq.

    The top-level ``seq`` is the last one in the bytes (keys are sorted: only ``tenant_id``,
    ``tool``, ``type`` and ``wallet_id`` follow it, all strings or null).
    """
    before, marker, after = payload.rpartition(_SEQ_MARKER)
    if not marker:
        raise AssertionError("the event's canonical bytes have no top-level seq")
    return before + b'"seq":', b',"tenant_id":' + after


class EventFields(TypedDict, total=False):
    """The fields of an audit event a caller gives (``audit_record``, ``audit_event_prepare``)."""

    event: Required[str]
    ok: Required[bool]
    tenant_id: str | None
    wallet_id: str | None
    key_id: str | None
    tool: str | None
    endpoint: str | None
    policy_decision_id: str | None
    request_id: str | None
    detail: dict[str, Any] | None
    event_id: str | None


def audit_record(**fields: Unpack[EventFields]) -> AuditEvent:
    """Append one event to the tenant's chain (or the ``system`` chain without a tenant).

    Runs inside the caller's transaction when there is one, so the event
    commits exactly when the change it records commits. It locks the chain
    head row; call it as the last statement of the transaction so the lock is
    held only until commit. Concurrent appends to one chain serialize on that
    lock and can never fork the chain or leave a gap in ``seq``.

    ``detail`` must be JSON: strings, integers within +-(2**53 - 1), booleans,
    null, lists and objects (money as decimal strings). Floats below 2**53
    are accepted but hash through the slower reference canonicalizer; anything
    that would not read back identically raises ``ValueError`` before any write.

    ``event_id`` may be allocated by the caller beforehand (``new_id("evt")``)
    when another record must name the event before it is appended (a receipt
    signs the id of its audit event).
    """
    prepared = audit_event_prepare(**fields)
    return audit_append_prepared(prepared)


def audit_append_prepared(prepared: PreparedEvent) -> AuditEvent:
    """Append a prepared event (``audit_event_prepare``) to its chain; returns the stored event.

    One round trip (audit/sql/audit_append.sql): the database locks the head, takes the next seq,
    links the event (sha256(prev_hash || prefix || seq || suffix), as ``chain_hash``) and moves
    the head. No savepoint: inside a caller's transaction the append is part of it; outside,
    it is its own.
    """
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(_APPEND_SQL, prepared.params())
        prepared.appended(*cursor.fetchone())
    return prepared.record


@dataclass(frozen=True)
class PreparedEvent:
    """An audit event ready for ``audit_append``: the row, and its canonical bytes split at the seq."""

    record: AuditEvent
    prefix: bytes
    suffix: bytes

    def params(self) -> list[Any]:
        """The arguments of ``audit_append``, in order."""
        r = self.record
        return [
            r.chain,
            r.event_id,
            r.event,
            r.tenant_id,
            r.wallet_id,
            r.key_id,
            r.tool,
            r.endpoint,
            r.policy_decision_id,
            r.request_id,
            r.ok,
            json.dumps(r.detail),
            r.created_at,
            self.prefix,
            self.suffix,
        ]

    def record_in(self) -> str:
        """The event as audit's ``audit_event_in`` record (JSON text): what ``audit_append_in``
        (audit/sql/audit_append.sql) takes from other apps' database functions. The one constructor."""
        r = self.record
        return record_json(
            {
                "chain": r.chain,
                "event_id": r.event_id,
                "event": r.event,
                "tenant_id": r.tenant_id,
                "wallet_id": r.wallet_id,
                "key_id": r.key_id,
                "tool": r.tool,
                "endpoint": r.endpoint,
                "policy_decision_id": r.policy_decision_id,
                "request_id": r.request_id,
                "ok": r.ok,
                "detail": r.detail,
                "created_at": r.created_at,
                "prefix": self.prefix,
                "suffix": self.suffix,
            }
        )

    def appended(self, seq: int, prev_hash: str, hash_: str) -> None:
        """Record what the database assigned (``audit_append``'s answer)."""
        self.record.seq, self.record.prev_hash, self.record.hash = seq, prev_hash, hash_
        fastsql.inserted(self.record)


def audit_event_prepare(**fields: Unpack[EventFields]) -> PreparedEvent:
    """Everything of an audit event but its place in the chain (see ``audit_record`` for the arguments).

    Raises ``ValueError`` for a ``detail`` that would not read back identically. The
    governed call's database functions append it in their own round trip.
    """
    event, ok, detail = fields["event"], fields["ok"], fields.get("detail")
    tenant_id, wallet_id, key_id = fields.get("tenant_id"), fields.get("wallet_id"), fields.get("key_id")
    tool, endpoint = fields.get("tool"), fields.get("endpoint")
    policy_decision_id, request_id, event_id = (
        fields.get("policy_decision_id"),
        fields.get("request_id"),
        fields.get("event_id"),
    )
    chain = tenant_id or SYSTEM_CHAIN
    check_round_trip(detail or {})
    record = AuditEvent(
        event_id=event_id or new_id("evt"),
        chain=chain,
        event=event,
        tenant_id=tenant_id,
        wallet_id=wallet_id,
        key_id=key_id,
        tool=tool,
        endpoint=endpoint,
        policy_decision_id=policy_decision_id,
        request_id=request_id or get_request_id(),
        ok=ok,
        detail=detail or {},
        created_at=timezone.now(),
    )
    prefix, suffix = _payload_around_seq(
        event_bytes(
            chain,
            _SEQ_SENTINEL,
            record.event_id,
            event,
            tenant_id,
            wallet_id,
            key_id,
            tool,
            endpoint,
            policy_decision_id,
            record.request_id,
            ok,
            record.detail,
            iso_utc(record.created_at),
        )
    )
    return PreparedEvent(record, prefix, suffix)


def alert_raise(
    *,
    tenant_id: str,
    wallet_id: str,
    kind: str,
    message: str,
    severity: str = "warning",
    detail: dict[str, Any] | None = None,
) -> Alert:
    """Record an alert for a wallet inside the caller's transaction."""
    return Alert.objects.create(
        alert_id=new_id("alr"),
        tenant_id=tenant_id,
        wallet_id=wallet_id,
        kind=kind,
        severity=severity,
        message=message,
        detail=detail or {},
    )


# --- signing keys -----------------------------------------------------------------

# The active kid is cached for a moment only: after a rotation another process may sign with the
# just-retired key for up to ACTIVE_KID_TTL seconds, and that signature still verifies.
ACTIVE_KID_TTL = 2.0
_active: BoundedCache[str, str] = BoundedCache("audit.active_kid", max_entries=1, ttl=ACTIVE_KID_TTL)


def active_kid() -> str | None:
    """The active key's id (cached for ``ACTIVE_KID_TTL`` seconds per process; no active key is not cached)."""
    kid = _active.get("active")
    if kid is not None:
        return kid
    read_at = time.monotonic()
    kid = SigningKey.objects.filter(state=SigningKeyState.ACTIVE).values_list("key_id", flat=True).first()
    if kid is not None:
        _active.set("active", kid, read_at=read_at)
    return kid


def forget_active_kid() -> None:
    """Drop the cached active kid (called after a rotation in this process)."""
    _active.clear()


def _active_row(key: keystore.KeyMaterial, now: datetime) -> SigningKey:
    """``key``'s row as the active key from ``now`` (not saved)."""
    return SigningKey(
        key_id=key.kid, public_key=key.public_key, state=SigningKeyState.ACTIVE, created_at=now, activated_at=now
    )


def _activate(key: keystore.KeyMaterial) -> None:
    """Insert ``key`` as the active key unless some key is active already (or ``key`` exists)."""
    SigningKey.objects.bulk_create([_active_row(key, timezone.now())], ignore_conflicts=True)


def _candidate() -> keystore.KeyMaterial:
    """The key to activate when none is active: the environment's, else an unused file key, else a new one."""
    known = set(SigningKey.objects.values_list("key_id", flat=True))
    env = keystore.env_key()
    if env is not None:
        if env.kid in known:
            raise SigningKeyRetired(key_id=env.kid)
        return env
    unused = [key for key in keystore.file_keys() if key.kid not in known]
    if unused:
        return unused[-1]
    return keystore.generate_and_store()


def signing_key_ensure(*, repair: bool = False, actor: str = "") -> SigningKey:
    """The active signing key, activating one first when there is none. Idempotent.

    With no active key it activates ``SIGNING_KEY_PRIVATE`` if set, else the
    newest key-file key the database has never seen, else a newly generated
    key written to the key file. Concurrent callers race on the partial unique
    index and all end with the same active key. Runs inside the caller's
    transaction when there is one (``sign_statement`` calls it lazily).

    If the active key's private part is unavailable here, raises
    :class:`SigningKeyUnavailable`; with ``repair=True`` (``manage.py
    ensure_signing_key``) it rotates to a new key instead.
    """
    active = SigningKey.objects.filter(state=SigningKeyState.ACTIVE).first()
    if active is not None:
        if keystore.private_key_for(active.key_id) is not None:
            return active
        if not repair:
            raise SigningKeyUnavailable(key_id=active.key_id)
        logger.warning("active signing key %s has no private key here; rotating", active.key_id)
        return signing_key_rotate(actor=actor or "ensure_signing_key (private key missing)")
    candidate = _candidate()
    with transaction.atomic():
        _activate(candidate)
        active = SigningKey.objects.get(state=SigningKeyState.ACTIVE)
        if actor and active.key_id == candidate.kid:
            audit_record(event="signing_key.activated", ok=True, detail={"key_id": active.key_id, "actor": actor})
    return active


def signing_key_active_published() -> SigningKey:
    """The active key's public row, as ``GET /v1/signing-keys/active`` publishes it. Idempotent.

    Read from the database whatever private parts this instance holds: the
    metadata is public, and the instance that signs may be another one. Only
    when no key is active (a fresh install whose operator has not run
    ``manage.py ensure_signing_key``) does it activate one, as the first
    signature would (``signing_key_ensure``); once a key is active it writes
    nothing, so an anonymous caller can neither rotate nor replace a key.
    """
    active = SigningKey.objects.filter(state=SigningKeyState.ACTIVE).first()
    if active is not None:
        return active
    try:
        return signing_key_ensure()
    except SigningKeyUnavailable:
        # Another instance, holding its private part, activated a key since the read above.
        return SigningKey.objects.get(state=SigningKeyState.ACTIVE)


# The transaction advisory lock that rotations take turns on (any fixed number; no other lock uses it).
ROTATION_LOCK = 0x7A11_6A7E


@transaction.atomic(durable=True)
def signing_key_rotate(*, actor: str = "") -> SigningKey:
    """Retire the active key and activate a newly generated one, in one transaction.

    The new private key is written to the key file first (an unused key left
    there by a failed rotation is harmless). The retired key stays published,
    so statements it signed keep verifying. Rotations take turns (a transaction
    advisory lock): one that waited for another retires the key the other
    activated, where locking the active row alone found none once the other
    committed, and its insert broke the one-active-key index.
    """
    new = keystore.generate_and_store()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ROTATION_LOCK])
    now = timezone.now()
    retired = list(SigningKey.objects.select_for_update(no_key=True).filter(state=SigningKeyState.ACTIVE))
    for old in retired:
        old.state = SigningKeyState.RETIRED
        old.retired_at = now
        old.save(update_fields=["state", "retired_at"])
    key = _active_row(new, now)
    key.save(force_insert=True)
    audit_record(
        event="signing_key.rotated",
        ok=True,
        detail={"new_key_id": key.key_id, "retired_key_ids": [old.key_id for old in retired], "actor": actor},
    )
    forget_active_kid()  # this thread signs with the new key at once; others within ACTIVE_KID_TTL
    transaction.on_commit(forget_active_kid)
    return key
