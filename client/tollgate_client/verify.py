"""Offline verification of a portable receipt (``GET /v1/receipts/{id}/portable``).

:func:`verify_portable_offline` opens no socket. In a source checkout it
delegates to the gateway's own verifier, ``receipts.verify.verify_portable``
(which imports no Django), imported lazily. Where that module is not
importable (the client installed on its own), it runs
:func:`verify_portable_standalone`, a self-contained copy of the same check
built on ``cryptography`` (Ed25519) and ``rfc8785`` (canonical JSON), with the
same reason codes.

Without ``jwks`` the key snapshot embedded in the export is used: a valid
signature then proves only that the receipt matches that snapshot. Pass a JWKS
obtained through a trusted channel (the issuer's ``/.well-known/jwks.json``
over TLS) for the issuer identity to hold.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

from tollgate_client.models import PortableVerification

__all__ = ["FORMAT", "keys_from_jwks", "verify_portable_offline", "verify_portable_standalone"]

FORMAT = "tollgate.portable-receipt/v1"
_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")


def verify_portable_offline(portable: Any, jwks: Any = None) -> PortableVerification:
    """Verify a portable receipt against ``jwks`` (default: the snapshot it carries)."""
    reference = _reference_verifier()
    if reference is None:
        return verify_portable_standalone(portable, jwks)
    verdict = reference(portable, jwks)
    return PortableVerification(
        valid=bool(verdict.valid),
        reason=verdict.reason,
        receipt_id=verdict.receipt_id,
        kid=verdict.kid,
        outcome=verdict.outcome,
    )


def _reference_verifier() -> Callable[[Any, Any], Any] | None:
    """``receipts.verify.verify_portable`` from a Tollgate source checkout, if that is what is importable."""
    try:
        from receipts import verify as reference  # type: ignore[import-not-found,unused-ignore]
    except Exception:  # not a Tollgate checkout (or an unrelated "receipts" package)
        return None
    func = getattr(reference, "verify_portable", None)
    if getattr(reference, "FORMAT", None) != FORMAT or not callable(func):
        return None
    return cast("Callable[[Any, Any], Any]", func)


def keys_from_jwks(jwks: Any) -> dict[str, str]:
    """``kid -> base64url public key`` from a JWKS (OKP / Ed25519 keys only)."""
    if not isinstance(jwks, Mapping) or not isinstance(jwks.get("keys"), list):
        raise ValueError("not a JWKS document (expected an object with a 'keys' array)")
    out: dict[str, str] = {}
    for jwk in jwks["keys"]:
        if (
            isinstance(jwk, Mapping)
            and jwk.get("kty") == "OKP"
            and jwk.get("crv") == "Ed25519"
            and isinstance(jwk.get("kid"), str)
            and isinstance(jwk.get("x"), str)
        ):
            out[jwk["kid"]] = jwk["x"]
    return out


def _b64url_decode_strict(text: Any) -> bytes:
    """Unpadded base64url only; any other spelling of the same bytes is refused (``ValueError``)."""
    if not isinstance(text, str) or not _B64URL.match(text) or len(text) % 4 == 1:
        raise ValueError("not unpadded base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as exc:
        raise ValueError("not base64url") from exc
    if base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii") != text:
        raise ValueError("non-canonical base64url")
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _verify_signed_bytes(data: bytes, signature: str, keys: Mapping[str, str]) -> tuple[bool, str | None]:
    """The checks of ``audit.evidence_core.verify_bytes_with_keys`` for a ``receipt`` statement."""
    import rfc8785
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        statement = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError):
        return False, "invalid_json"
    if not isinstance(statement, Mapping):
        return False, "not_an_object"
    statement_type = statement.get("type")
    if not isinstance(statement_type, str) or not statement_type:
        return False, "missing_type"
    if statement_type != "receipt":
        return False, "type_mismatch"
    try:
        canonical = rfc8785.dumps(statement)
    except (rfc8785.CanonicalizationError, TypeError, ValueError):
        return False, "non_canonical"
    if canonical != data:
        return False, "non_canonical"
    kid = statement.get("kid")
    if not isinstance(kid, str) or not kid:
        return False, "missing_kid"
    public = keys.get(kid)
    if public is None:
        return False, "unknown_kid"
    try:
        raw_signature = _b64url_decode_strict(signature)
    except ValueError:
        return False, "malformed_signature"
    if len(raw_signature) != 64:
        return False, "malformed_signature"
    try:
        Ed25519PublicKey.from_public_bytes(_b64url_decode_strict(public)).verify(raw_signature, canonical)
    except (InvalidSignature, ValueError):
        return False, "bad_signature"
    return True, None


def verify_portable_standalone(portable: Any, jwks: Any = None) -> PortableVerification:
    """The same check as ``receipts.verify.verify_portable``, needing only ``cryptography`` and ``rfc8785``."""
    if not isinstance(portable, Mapping):
        return PortableVerification(valid=False, reason="not_an_object")
    if portable.get("format") != FORMAT:
        return PortableVerification(valid=False, reason="unknown_format")
    signed_b64, signature = portable.get("signed_bytes"), portable.get("signature")
    if not isinstance(signed_b64, str) or not isinstance(signature, str):
        return PortableVerification(valid=False, reason="missing_signed_bytes_or_signature")
    try:
        signed = _b64url_decode_strict(signed_b64)
        statement = json.loads(signed)
    except (ValueError, UnicodeDecodeError):
        return PortableVerification(valid=False, reason="malformed_signed_bytes")
    if not isinstance(statement, dict):
        return PortableVerification(valid=False, reason="not_an_object")
    receipt_id, kid, outcome = statement.get("receipt_id"), statement.get("kid"), statement.get("outcome")

    def verdict(valid: bool, reason: str | None) -> PortableVerification:
        return PortableVerification(valid=valid, reason=reason, receipt_id=receipt_id, kid=kid, outcome=outcome)

    try:
        keys = keys_from_jwks(jwks if jwks is not None else portable.get("keys"))
    except ValueError:
        return verdict(False, "no_key_set")
    if portable.get("kid") != kid:
        return verdict(False, "kid_mismatch")
    valid, reason = _verify_signed_bytes(signed, signature, keys)
    if not valid:
        return verdict(False, reason)
    # The readable copy must say exactly what was signed.
    if "receipt" in portable and portable["receipt"] != statement:
        return verdict(False, "receipt_differs_from_signed_bytes")
    return verdict(True, None)
