"""The one signing function for every signed statement (permit, quote, receipt, audit checkpoint).

A statement is a JSON object with a ``type``; signing adds the ``kid`` of the
active key, so both are inside the signed bytes. The signature is Ed25519
over the RFC 8785 canonical bytes, unpadded base64url (docs/architecture.md, "Evidence").
Verification resolves the key by ``kid`` among active and retired keys; the
pure checks live in :mod:`audit.evidence_core` for the offline verifier.

Cost of a signature: one indexed query for the active key id, canonical
encoding and one Ed25519 signature; the private key is cached in memory.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from audit import keystore
from audit.evidence_core import (
    VerificationResult,
    kid_matches_key,
    sign_canonical,
    verify_bytes_with_keys,
    verify_statement_with_keys,
)
from audit.exceptions import SigningKeyUnavailable
from audit.models import SigningKey
from audit.services import active_kid, signing_key_ensure
from common.cache import BoundedCache
from common.canonical import CanonicalizationError, canonical_bytes_fast
from common.jsonbody import storable_text

logger = logging.getLogger("tollgate.audit")

__all__ = [
    "SignedStatement",
    "VerificationResult",
    "public_key_set",
    "sign_statement",
    "statement_problem",
    "verify_statement",
    "verify_statement_bytes",
]


@dataclass(frozen=True)
class SignedStatement:
    """A signed statement: the object as signed (with ``kid``), its canonical bytes and the signature."""

    statement: dict[str, Any]
    canonical: bytes
    signature: str

    @property
    def kid(self) -> str:
        return str(self.statement["kid"])

    @property
    def type(self) -> str:
        return str(self.statement["type"])


def sign_statement(statement: Mapping[str, Any]) -> SignedStatement:
    """Sign ``statement`` with the active key. Adds (or replaces) ``kid``; requires a non-empty ``type``.

    The values must be JSON (strings, safe integers, booleans, null, lists,
    objects; money as decimal strings). Activates a signing key first when
    there is none (see ``signing_key_ensure``). Raises ``ValueError`` for a
    statement without ``type`` or with values RFC 8785 cannot encode, and
    :class:`SigningKeyUnavailable` when the active key's private part is not
    available on this server.
    """
    statement_type = statement.get("type")
    if not isinstance(statement_type, str) or not statement_type:
        raise ValueError("a signed statement needs a non-empty string 'type'")
    kid = active_kid()
    if kid is None:
        kid = signing_key_ensure().key_id
    private_key = keystore.private_key_for(kid)
    if private_key is None:
        raise SigningKeyUnavailable(key_id=kid)
    body = {**statement, "kid": kid}
    canonical = canonical_bytes_fast(body)
    return SignedStatement(statement=body, canonical=canonical, signature=sign_canonical(private_key, canonical))


# A kid names one public key forever (it is derived from it), so a found key can be cached for
# good; only keys found in the table are cached, and the bound only keeps a flood of them finite.
# (The active kid is cached for a moment only: ``audit.services.active_kid``.)
PUBLIC_KEY_CACHE_SIZE = 1_000
_public_keys: BoundedCache[str, str] = BoundedCache("audit.public_keys", max_entries=PUBLIC_KEY_CACHE_SIZE)


def _keys_for(kid: Any) -> dict[str, str]:
    if storable_text(kid) is None:  # not a string, or one no key id can be (and a query would raise)
        return {}
    public = _public_keys.get(kid)
    if public is None:
        public = SigningKey.objects.filter(key_id=kid).values_list("public_key", flat=True).first()
        if public is None:
            return {}
        if not kid_matches_key(kid, public):
            # A kid is derived from its key: a row naming another key under it was written by hand. The
            # offline verifiers refuse such a key (kid_key_mismatch); so does the service (unknown kid).
            logger.error("signing key %s: the stored public key is not the one its kid names; not used", kid)
            return {}
        _public_keys.set(kid, public)
    return {kid: public}


def verify_statement(
    statement: Mapping[str, Any], signature: str, *, expected_type: str | None = None
) -> VerificationResult:
    """Verify a statement (with its ``kid``) against the published key it names, active or retired.

    Fails with a reason code (see :func:`audit.evidence_core.verify_statement_with_keys`)
    for an unknown kid, any changed byte, a ``type`` other than ``expected_type``
    or a malformed signature.
    """
    kid = statement.get("kid") if isinstance(statement, Mapping) else None
    memo = _verified_memo(statement, signature)
    if memo is not None and memo in _verified and statement.get("type") == (expected_type or statement.get("type")):
        return VerificationResult(True, None, kid)
    result = verify_statement_with_keys(statement, signature, _keys_for(kid), expected_type=expected_type)
    if result.valid and memo is not None:
        _verified.set(memo, True)
    return result


# Statements this process has verified, by (kid, signature, canonical bytes): a signed row is read
# on every use (a permit on every governed call), and its exact bytes verify the same way every
# time. Any change to the statement or the signature is a different entry and is verified afresh;
# kids never change their key, and retired keys still verify. Oldest entries go first.
VERIFIED_MEMO_SIZE = 20_000
_verified: BoundedCache[tuple[str, str, bytes], bool] = BoundedCache(
    "audit.verified_statements", max_entries=VERIFIED_MEMO_SIZE
)


def _verified_memo(statement: Any, signature: Any) -> tuple[str, str, bytes] | None:
    if not isinstance(statement, Mapping) or not isinstance(signature, str):
        return None
    kid = statement.get("kid")
    if not isinstance(kid, str):
        return None
    try:
        return kid, signature, canonical_bytes_fast(dict(statement))
    except (CanonicalizationError, TypeError, ValueError):
        return None


def statement_problem(
    statement: Mapping[str, Any], signature: str, *, expected_type: str, columns: Mapping[str, Any]
) -> str | None:
    """Why stored ``columns`` cannot be trusted, or None: the one check of a signed row at use.

    The signature must verify over the signed statement, and each column a decision reads
    must equal what was signed (a column edited in the database after signing is tampering).
    Returns ``bad_signature:<why>`` or ``statement_mismatch:<column>``.
    """
    result = verify_statement(statement, signature, expected_type=expected_type)
    if not result.valid:
        return f"bad_signature:{result.reason or 'invalid'}"
    for name, value in columns.items():
        if statement.get(name) != value:
            return f"statement_mismatch:{name}"
    return None


def verify_statement_bytes(data: bytes, signature: str, *, expected_type: str | None = None) -> VerificationResult:
    """Verify signed bytes as transmitted; bytes that are not exactly canonical are ``non_canonical``."""
    try:
        parsed = json.loads(data)
        kid = parsed.get("kid") if isinstance(parsed, dict) else None
    except (ValueError, UnicodeDecodeError):
        kid = None
    return verify_bytes_with_keys(data, signature, _keys_for(kid), expected_type=expected_type)


def public_key_set() -> dict[str, str]:
    """Every published key, ``kid -> base64url public key`` (the snapshot an offline verifier needs)."""
    return dict(SigningKey.objects.values_list("key_id", "public_key"))
