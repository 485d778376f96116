"""Offline verification of a portable receipt. Imports no Django and opens no socket.

    python -m receipts.verify PORTABLE.json [--keys JWKS.json]

Exit status: 0 when the receipt's signature verifies, 1 when it does not (the
reason is printed), 2 when the input cannot be read. Without ``--keys`` the key
snapshot embedded in the export is used; pass ``--keys`` with a JWKS you
obtained through a trusted channel (for example the issuer's
``/.well-known/jwks.json`` fetched over TLS) for the issuer identity to hold.

The same check is importable: ``verify_portable(document, jwks=None)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.canonical import b64url_decode_strict
from audit.evidence_core import verify_bytes_with_keys

FORMAT = "tollgate.portable-receipt/v1"


@dataclass(frozen=True)
class PortableVerification:
    """The verdict: ``valid``, a stable ``reason`` code when not, and what was checked."""

    valid: bool
    reason: str | None
    receipt_id: str | None = None
    kid: str | None = None
    outcome: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "reason": self.reason,
            "receipt_id": self.receipt_id,
            "kid": self.kid,
            "outcome": self.outcome,
        }


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


def verify_portable(document: Any, jwks: Any = None) -> PortableVerification:
    """Verify a portable receipt against ``jwks`` (default: the snapshot it carries)."""
    if not isinstance(document, Mapping):
        return PortableVerification(False, "not_an_object")
    if document.get("format") != FORMAT:
        return PortableVerification(False, "unknown_format")
    signed_b64, signature = document.get("signed_bytes"), document.get("signature")
    if not isinstance(signed_b64, str) or not isinstance(signature, str):
        return PortableVerification(False, "missing_signed_bytes_or_signature")
    try:
        signed = b64url_decode_strict(signed_b64)
        statement = json.loads(signed)
    except (ValueError, UnicodeDecodeError):
        return PortableVerification(False, "malformed_signed_bytes")
    if not isinstance(statement, dict):
        return PortableVerification(False, "not_an_object")
    receipt_id, kid = statement.get("receipt_id"), statement.get("kid")
    outcome = statement.get("outcome")
    base = {"receipt_id": receipt_id, "kid": kid, "outcome": outcome}
    try:
        keys = keys_from_jwks(jwks if jwks is not None else document.get("keys"))
    except ValueError:
        return PortableVerification(False, "no_key_set", **base)
    if document.get("kid") != kid:
        return PortableVerification(False, "kid_mismatch", **base)
    result = verify_bytes_with_keys(signed, signature, keys, expected_type="receipt")
    if not result.valid:
        return PortableVerification(False, result.reason, **base)
    # The readable copy must say exactly what was signed.
    if "receipt" in document and document["receipt"] != statement:
        return PortableVerification(False, "receipt_differs_from_signed_bytes", **base)
    return PortableVerification(True, None, **base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m receipts.verify", description="Verify a portable receipt offline.")
    parser.add_argument("portable", help="the portable receipt JSON (GET /v1/receipts/{id}/portable)")
    parser.add_argument("--keys", help="a JWKS obtained through a trusted channel (default: the embedded snapshot)")
    args = parser.parse_args(argv)
    try:
        document = json.loads(Path(args.portable).read_text(encoding="utf-8"))
        jwks = json.loads(Path(args.keys).read_text(encoding="utf-8")) if args.keys else None
    except (OSError, ValueError) as err:
        print(f"error: cannot read input: {err}", file=sys.stderr)
        return 2
    verdict = verify_portable(document, jwks)
    print(json.dumps(verdict.as_dict(), indent=2))
    if verdict.valid:
        source = "the supplied key set" if args.keys else "the embedded key snapshot (authenticate it separately)"
        print(f"VALID: receipt {verdict.receipt_id} ({verdict.outcome}) is signed by {verdict.kid} in {source}.")
        return 0
    print(f"INVALID: {verdict.reason}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
