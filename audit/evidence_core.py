"""Verification of signed statements and audit chains, with no Django and no network.

Everything here is a pure function over values the caller supplies: the
statement (or its bytes), the signature and a ``kid -> public key`` mapping.
The service (``audit.signing``) wraps these with its key table; the offline
verifier uses them with a key snapshot.

Signed statement rules (docs/architecture.md, "Evidence"): a JSON object carrying ``type``
and ``kid``; the signature is Ed25519 over its RFC 8785 canonical bytes,
encoded as unpadded base64url.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from common.canonical import (
    CanonicalizationError,
    b64url_decode_strict,
    b64url_encode,
    canonical_bytes_fast,
    event_bytes,
    iso_utc,
)

ALGORITHM = "Ed25519"
KID_PREFIX = "sig_"
GENESIS_HASH = "0" * 64
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

PublicKeyInput = bytes | str | Ed25519PublicKey


@dataclass(frozen=True)
class VerificationResult:
    """The outcome of a signature check. ``reason`` is a stable code when ``valid`` is false."""

    valid: bool
    reason: str | None = None
    kid: str | None = None

    def __bool__(self) -> bool:
        return self.valid


def key_id_for_public_key(raw_public_key: bytes) -> str:
    """``sig_`` + 22 base62 characters of SHA-256(raw public key): the same key always has the same id."""
    number = int.from_bytes(hashlib.sha256(raw_public_key).digest(), "big")
    chars = []
    for _ in range(22):
        number, rest = divmod(number, 62)
        chars.append(_BASE62[rest])
    return KID_PREFIX + "".join(chars)


def kid_matches_key(kid: str, public_key_b64: str) -> bool:
    """True when ``kid`` is the id derived from the base64url public key it names."""
    try:
        return key_id_for_public_key(b64url_decode_strict(public_key_b64)) == kid
    except ValueError:
        return False


def raw_public_key(private_key: Ed25519PrivateKey) -> bytes:
    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_key_from_seed(seed: bytes) -> Ed25519PrivateKey:
    """An Ed25519 private key from its 32-byte seed (RFC 8032 "private key")."""
    return Ed25519PrivateKey.from_private_bytes(seed)


def load_public_key(value: PublicKeyInput) -> Ed25519PublicKey:
    """A public key from raw bytes, unpadded base64url text or a key object."""
    if isinstance(value, Ed25519PublicKey):
        return value
    raw = b64url_decode_strict(value) if isinstance(value, str) else value
    return Ed25519PublicKey.from_public_bytes(raw)


def sign_canonical(private_key: Ed25519PrivateKey, canonical: bytes) -> str:
    """The base64url Ed25519 signature of already-canonical bytes."""
    return b64url_encode(private_key.sign(canonical))


def _check_signature(
    canonical: bytes, statement: Mapping[str, Any], signature: str, public_keys: Mapping[str, PublicKeyInput]
) -> VerificationResult:
    kid = statement.get("kid")
    if not isinstance(kid, str) or not kid:
        return VerificationResult(False, "missing_kid")
    public = public_keys.get(kid)
    if public is None:
        return VerificationResult(False, "unknown_kid", kid)
    try:
        raw_signature = b64url_decode_strict(signature)
    except ValueError:
        return VerificationResult(False, "malformed_signature", kid)
    if len(raw_signature) != 64:
        return VerificationResult(False, "malformed_signature", kid)
    try:
        load_public_key(public).verify(raw_signature, canonical)
    except (InvalidSignature, ValueError):
        return VerificationResult(False, "bad_signature", kid)
    return VerificationResult(True, None, kid)


def _check_type(statement: Any, expected_type: str | None) -> VerificationResult | None:
    if not isinstance(statement, Mapping):
        return VerificationResult(False, "not_an_object")
    statement_type = statement.get("type")
    if not isinstance(statement_type, str) or not statement_type:
        return VerificationResult(False, "missing_type")
    if expected_type is not None and statement_type != expected_type:
        return VerificationResult(False, "type_mismatch", statement.get("kid"))
    return None


def verify_statement_with_keys(
    statement: Mapping[str, Any],
    signature: str,
    public_keys: Mapping[str, PublicKeyInput],
    *,
    expected_type: str | None = None,
) -> VerificationResult:
    """Check ``signature`` over the canonical bytes of ``statement`` with the key named by its ``kid``.

    Reasons: ``not_an_object``, ``missing_type``, ``type_mismatch``,
    ``missing_kid``, ``unknown_kid``, ``not_canonicalizable``,
    ``malformed_signature``, ``bad_signature``.
    """
    failure = _check_type(statement, expected_type)
    if failure is not None:
        return failure
    try:
        canonical = canonical_bytes_fast(dict(statement))
    except (CanonicalizationError, TypeError, ValueError):
        return VerificationResult(False, "not_canonicalizable", statement.get("kid"))
    return _check_signature(canonical, statement, signature, public_keys)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def verify_bytes_with_keys(
    data: bytes,
    signature: str,
    public_keys: Mapping[str, PublicKeyInput],
    *,
    expected_type: str | None = None,
) -> VerificationResult:
    """Like :func:`verify_statement_with_keys` for the signed bytes themselves.

    The bytes must be exactly the RFC 8785 encoding of the object they parse
    to (reason ``non_canonical`` otherwise): whitespace, key order, escapes,
    number spelling and duplicate keys all change the bytes, and accepting them
    would let two different byte strings carry one signature's meaning.
    """
    try:
        statement = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError):
        return VerificationResult(False, "invalid_json")
    failure = _check_type(statement, expected_type)
    if failure is not None:
        return failure
    try:
        canonical = canonical_bytes_fast(statement)
    except (CanonicalizationError, TypeError, ValueError):
        return VerificationResult(False, "non_canonical", statement.get("kid"))
    if canonical != data:
        return VerificationResult(False, "non_canonical", statement.get("kid"))
    return _check_signature(canonical, statement, signature, public_keys)


# --- audit chains ----------------------------------------------------------------

# Column order of the rows ``verify_chain_rows`` reads (``AuditEvent`` field names).
CHAIN_ROW_FIELDS = (
    "seq",
    "event_id",
    "event",
    "tenant_id",
    "wallet_id",
    "key_id",
    "tool",
    "endpoint",
    "policy_decision_id",
    "request_id",
    "ok",
    "detail",
    "created_at",
    "prev_hash",
    "hash",
)


@dataclass(frozen=True)
class ChainCheck:
    """The outcome of walking a run of chain rows in ``seq`` order.

    ``last_seq``/``last_hash`` are the last event that checked out (the
    starting point when none did). ``checkpoint_hash`` is the recomputed hash
    at ``checkpoint_seq`` when the walk reached it.
    """

    valid: bool
    checked_events: int
    last_seq: int
    last_hash: str
    first_broken_seq: int | None = None
    first_broken_event_id: str | None = None
    reason: str | None = None
    checkpoint_hash: str | None = None


_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # C scanner, no whitespace pass


def verify_chain_rows(
    chain: str,
    rows: Iterable[tuple[Any, ...]],
    *,
    start_seq: int = 1,
    start_prev_hash: str | None = GENESIS_HASH,
    checkpoint_seq: int | None = None,
) -> ChainCheck:
    """Recompute the hash chain over ``rows`` (tuples in :data:`CHAIN_ROW_FIELDS` order, ``seq`` ascending).

    Each event must have the expected ``seq`` (no gap, no insertion), link to
    the previous hash, and hash to ``SHA-256(prev hash bytes || canonical
    event)``. ``start_prev_hash=None`` trusts the first row's ``prev_hash``
    (verifying a range that does not start at 1). Stops at the first broken
    event. ``created_at`` may be a ``datetime`` or its :func:`iso_utc` text.
    (The service streams rows pre-rendered by PostgreSQL through a faster
    variant, ``audit.chain_verification._verify_rendered``, which falls back to this
    module's encoding for any event it cannot confirm.)
    """
    sha256 = hashlib.sha256
    make_bytes = event_bytes
    expected = start_seq
    prev_hex = start_prev_hash
    prev_raw = bytes.fromhex(prev_hex) if prev_hex is not None else b""
    last_seq, last_hash = start_seq - 1, prev_hex or ""
    checkpoint_hash = prev_hex if checkpoint_seq == start_seq - 1 else None
    checked = 0

    def broken(seq: int | None, event_id: str | None, reason: str) -> ChainCheck:
        return ChainCheck(False, checked, last_seq, last_hash, seq, event_id, reason, checkpoint_hash)

    for row in rows:
        (seq, event_id, event, tenant_id, wallet_id, key_id, tool, endpoint, decision, request_id, ok, detail,
         created_at, row_prev, row_hash) = row  # fmt: skip
        checked += 1
        if seq != expected:
            # A deleted event leaves a gap; the event after it is the first that no longer fits.
            return broken(seq, event_id, "sequence_gap")
        if prev_hex is None:
            try:
                prev_raw = bytes.fromhex(row_prev)
            except (TypeError, ValueError):
                return broken(seq, event_id, "prev_hash_mismatch")
            prev_hex = row_prev
        elif row_prev != prev_hex:
            return broken(seq, event_id, "prev_hash_mismatch")
        if type(created_at) is datetime:
            created_at = iso_utc(created_at)
        try:
            payload = make_bytes(chain, seq, event_id, event, tenant_id, wallet_id, key_id, tool, endpoint,
                                 decision, request_id, ok, detail, created_at)  # fmt: skip
        except (CanonicalizationError, TypeError, ValueError):
            return broken(seq, event_id, "not_canonicalizable")
        digest = sha256(prev_raw + payload).digest()
        hex_digest = digest.hex()
        if hex_digest != row_hash:
            return broken(seq, event_id, "hash_mismatch")
        prev_raw, prev_hex = digest, hex_digest
        last_seq, last_hash = seq, hex_digest
        if seq == checkpoint_seq:
            checkpoint_hash = hex_digest
        expected += 1
    return ChainCheck(True, checked, last_seq, last_hash, None, None, None, checkpoint_hash)


def chain_hash(prev_hash: str, payload: bytes) -> str:
    """SHA-256 over the previous hash (32 raw bytes) followed by the canonical event bytes."""
    return hashlib.sha256(bytes.fromhex(prev_hash) + payload).hexdigest()


# Approvals in the signed record (docs/audit-chain.md, "Approvals"). A permit minted from an approved
# request names its approval in its own statement (``approval``: approval id, request id, approver,
# decision time, terms digest); the approval is a signed ``permit_approval`` statement of its own.
# client/tollgate_client/verify.py holds a copy of these two functions for the standalone verifier.
APPROVAL_TYPE = "permit_approval"
# What the permit's ``approval`` member restates from the approval statement, each compared.
APPROVAL_REFERENCE_FIELDS = ("approval_id", "request_id", "approver", "decided_at", "terms_digest")
# What the approval statement says of the permit, each compared with the permit's statement.
APPROVAL_PERMIT_FIELDS = ("permit_id", "tenant_id", "wallet_id")


def permit_terms_digest(permit_statement: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical bytes of the terms a permit is issued with: its statement without
    ``kid`` and ``approval`` (tools, allowance, calls, expiry, wallet, subject key, issuer, ids and any
    field a later version adds), the digest an approval signs."""
    terms = {name: value for name, value in permit_statement.items() if name not in ("kid", "approval")}
    return hashlib.sha256(canonical_bytes_fast(terms)).hexdigest()


def approval_link_problem(permit_statement: Mapping[str, Any], approval_statement: Any) -> str | None:
    """Why ``approval_statement`` is not the approval ``permit_statement`` names, or None.

    Both signatures are checked by the caller. The approval must approve, name this permit, its tenant
    and wallet, say what the permit's ``approval`` member restates, and sign the digest of exactly the
    permit's terms. Reasons: ``approval_not_named``, ``approval_not_an_object``, ``approval_type_mismatch``,
    ``approval_not_approved``, ``approval_mismatch:<field>``, ``approval_terms_digest_mismatch``.
    """
    reference = permit_statement.get("approval")
    if not isinstance(reference, Mapping):
        return "approval_not_named"
    if not isinstance(approval_statement, Mapping):
        return "approval_not_an_object"
    if approval_statement.get("type") != APPROVAL_TYPE:
        return "approval_type_mismatch"
    if approval_statement.get("decision") != "approved":
        return "approval_not_approved"
    for name in APPROVAL_PERMIT_FIELDS:
        if approval_statement.get(name) != permit_statement.get(name):
            return f"approval_mismatch:{name}"
    for name in APPROVAL_REFERENCE_FIELDS:
        if reference.get(name) != approval_statement.get(name):
            return f"approval_mismatch:{name}"
    if approval_statement.get("terms_digest") != permit_terms_digest(permit_statement):
        return "approval_terms_digest_mismatch"
    return None
