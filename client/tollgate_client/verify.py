"""Offline verification of a portable receipt (``GET /v1/receipts/{id}/portable``).

:func:`verify_portable_offline` opens no socket. In a source checkout it
delegates to the gateway's own verifier, ``receipts.verify.verify_portable``
(which imports no Django), imported lazily. Where that module is not
importable (the client installed on its own), it runs
:func:`verify_portable_standalone`, a self-contained copy of the same check
built on ``cryptography`` (Ed25519) and ``rfc8785`` (canonical JSON), with the
same reason codes.

Key ids are derived from the public key (``sig_`` + base62 of SHA-256 of the
raw key): a key set naming another key under a kid is refused
(``kid_key_mismatch``). Without ``jwks`` the key snapshot embedded in the
export is used: a valid signature then proves only that the receipt matches
that snapshot. Pass a JWKS obtained through a trusted channel (the issuer's
``/.well-known/jwks.json`` over TLS) for the issuer identity to hold.

With a transparency-log ``policy`` (:class:`tollgate_client.tlog.Policy`: trusted log keys,
witness keys, a cosignature quorum) the receipt's optional ``transparency`` member is checked too:
its ``tlog-proof@v1`` must lead from the signed bytes to a checkpoint signed by a trusted key of the
receipt's tenant's log and cosigned by the quorum. A failure makes the receipt invalid with a
``tlog_*`` reason. A receipt without a proof still verifies its signature, and the verdict's
``inclusion`` says the inclusion was not checked.

A portable receipt of a call under a permit a person approved also carries the permit's and the
approval's signed statements (``permit``, ``approval``): both are checked with the same keys, the
permit must be the receipt's, and the approval must approve exactly the permit's terms
(``approval_*`` / ``permit_*`` reasons, as the gateway's docs/audit-chain.md, "Approvals", lists).

Command line (installed as ``tollgate-verify`` with ``pip install ./client``)::

    tollgate-verify PORTABLE.json [--keys JWKS.json | --issuer https://gateway.example] [--policy POLICY.json]

Exit status 0: valid; 1: invalid (reason printed); 2: unreadable input, key set or policy.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tollgate_client.models import PortableVerification

if TYPE_CHECKING:  # imported when used: importing the client loads no cryptography
    from tollgate_client.tlog.policy import Policy

__all__ = [
    "FORMAT",
    "approval_link_problem",
    "carried_approval_problem",
    "fetch_issuer_jwks",
    "key_id_for_public_key",
    "keys_from_jwks",
    "main",
    "permit_terms_digest",
    "verify_portable_offline",
    "verify_portable_standalone",
]

FORMAT = "tollgate.portable-receipt/v1"
JWKS_PATH = "/.well-known/jwks.json"
_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def key_id_for_public_key(raw_public_key: bytes) -> str:
    """``sig_`` + 22 base62 characters of SHA-256(raw public key), as the gateway derives kids."""
    number = int.from_bytes(hashlib.sha256(raw_public_key).digest(), "big")
    chars = []
    for _ in range(22):
        number, rest = divmod(number, 62)
        chars.append(_BASE62[rest])
    return "sig_" + "".join(chars)


def _kid_matches_key(kid: str, public_key_b64: str) -> bool:
    try:
        return key_id_for_public_key(_b64url_decode_strict(public_key_b64)) == kid
    except ValueError:
        return False


def verify_portable_offline(portable: Any, jwks: Any = None, policy: Policy | None = None) -> PortableVerification:
    """Verify a portable receipt against ``jwks`` (default: the snapshot it carries) and ``policy``."""
    reference = _reference_verifier()
    if reference is None:
        return verify_portable_standalone(portable, jwks, policy)
    verdict = reference(portable, jwks, policy=policy)
    return PortableVerification(
        valid=bool(verdict.valid),
        reason=verdict.reason,
        receipt_id=verdict.receipt_id,
        kid=verdict.kid,
        outcome=verdict.outcome,
        inclusion=verdict.inclusion,
        inclusion_detail=verdict.inclusion_detail,
    )


def _reference_verifier() -> Callable[..., Any] | None:
    """``receipts.verify.verify_portable`` from a Tollgate source checkout, if that is what is importable."""
    try:
        from receipts import verify as reference  # type: ignore[import-not-found,unused-ignore]
    except Exception:  # not a Tollgate checkout (or an unrelated "receipts" package)
        return None
    func = getattr(reference, "verify_portable", None)
    if getattr(reference, "FORMAT", None) != FORMAT or not callable(func):
        return None
    return cast("Callable[..., Any]", func)


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


def _verify_signed_bytes(
    data: bytes, signature: str, keys: Mapping[str, str], expected_type: str = "receipt"
) -> tuple[bool, str | None]:
    """The checks of ``audit.evidence_core.verify_bytes_with_keys`` for a statement of ``expected_type``."""
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
    if statement_type != expected_type:
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


# Approvals (the gateway's docs/audit-chain.md, "Approvals"). ``permit_terms_digest`` and
# ``approval_link_problem`` restate the gateway's ``audit.evidence_core`` (its service's check; a client
# installed alone cannot import it), with the same reason codes. ``carried_approval_problem`` is the one
# check of the permit and approval a portable receipt carries: ``receipts.verify`` calls it too.
APPROVAL_TYPE = "permit_approval"
_APPROVAL_REFERENCE_FIELDS = ("approval_id", "request_id", "approver", "decided_at", "terms_digest")
_APPROVAL_PERMIT_FIELDS = ("permit_id", "tenant_id", "wallet_id")


def permit_terms_digest(permit_statement: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical bytes of a permit's statement without ``kid`` and ``approval``."""
    import rfc8785

    terms = {name: value for name, value in permit_statement.items() if name not in ("kid", "approval")}
    return hashlib.sha256(rfc8785.dumps(terms)).hexdigest()


def approval_link_problem(permit_statement: Mapping[str, Any], approval_statement: Any) -> str | None:
    """Why ``approval_statement`` is not the approval ``permit_statement`` names, or None."""
    reference = permit_statement.get("approval")
    if not isinstance(reference, Mapping):
        return "approval_not_named"
    if not isinstance(approval_statement, Mapping):
        return "approval_not_an_object"
    if approval_statement.get("type") != APPROVAL_TYPE:
        return "approval_type_mismatch"
    if approval_statement.get("decision") != "approved":
        return "approval_not_approved"
    for name in _APPROVAL_PERMIT_FIELDS:
        if approval_statement.get(name) != permit_statement.get(name):
            return f"approval_mismatch:{name}"
    for name in _APPROVAL_REFERENCE_FIELDS:
        if reference.get(name) != approval_statement.get(name):
            return f"approval_mismatch:{name}"
    if approval_statement.get("terms_digest") != permit_terms_digest(permit_statement):
        return "approval_terms_digest_mismatch"
    return None


def _carried_statement(carried: Any, keys: Mapping[str, str], expected_type: str) -> tuple[dict[str, Any], str | None]:
    """A statement carried beside the receipt (``{signed_bytes, signature}``), checked as the receipt is."""
    if not isinstance(carried, Mapping):
        return {}, "missing"
    signed_b64, signature = carried.get("signed_bytes"), carried.get("signature")
    if not isinstance(signed_b64, str) or not isinstance(signature, str):
        return {}, "missing_signed_bytes_or_signature"
    try:
        signed = _b64url_decode_strict(signed_b64)
        statement = json.loads(signed)
    except (ValueError, UnicodeDecodeError):
        return {}, "malformed_signed_bytes"
    if not isinstance(statement, dict):
        return {}, "not_an_object"
    kid = statement.get("kid")
    if isinstance(kid, str) and kid in keys and not _kid_matches_key(kid, keys[kid]):
        return {}, "kid_key_mismatch"
    valid, reason = _verify_signed_bytes(signed, signature, keys, expected_type)
    if not valid:
        return {}, reason or "invalid"
    return statement, None


def carried_approval_problem(
    portable: Mapping[str, Any], receipt: Mapping[str, Any], keys: Mapping[str, str]
) -> str | None:
    """Why the permit and approval a portable receipt carries do not hold, or None (also when it carries
    neither): the permit must be the receipt's and validly signed; an approval its statement names must be
    carried, validly signed, and approve exactly that permit's terms."""
    carried_permit, carried_approval = portable.get("permit"), portable.get("approval")
    if carried_permit is None and carried_approval is None:
        return None
    permit, problem = _carried_statement(carried_permit, keys, "permit")
    if problem is not None:
        return f"permit_{problem}"
    if permit.get("permit_id") != receipt.get("permit_id") or permit.get("tenant_id") != receipt.get("tenant_id"):
        return "permit_not_the_receipts"
    if permit.get("approval") is None:
        return None if carried_approval is None else "approval_not_named"
    approval, problem = _carried_statement(carried_approval, keys, APPROVAL_TYPE)
    if problem is not None:
        return f"approval_{problem}"
    return approval_link_problem(permit, approval)


def verify_portable_standalone(portable: Any, jwks: Any = None, policy: Policy | None = None) -> PortableVerification:
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
    if isinstance(kid, str) and kid in keys and not _kid_matches_key(kid, keys[kid]):
        return verdict(False, "kid_key_mismatch")
    valid, reason = _verify_signed_bytes(signed, signature, keys)
    if not valid:
        return verdict(False, reason)
    # Every unsigned field that restates the signed statement must say exactly what was signed: a consumer
    # may read ``receipt_id`` or the readable ``receipt`` copy without decoding the signed bytes.
    expected = {
        "receipt_id": receipt_id,
        "receipt": statement,
        "signed_bytes_sha256": hashlib.sha256(signed).hexdigest(),
        "alg": "EdDSA",
    }
    for field, value in expected.items():
        if field in portable and portable[field] != value:
            return verdict(False, f"{field}_differs_from_signed_bytes")
    approval_problem = carried_approval_problem(portable, statement, keys)
    if approval_problem is not None:
        return verdict(False, approval_problem)
    from tollgate_client.tlog.policy import verify_transparency

    tenant = statement.get("tenant_id")
    included = verify_transparency(
        portable.get("transparency"), signed, policy, tenant=tenant if isinstance(tenant, str) else None
    )
    return PortableVerification(
        valid=not included.failed,
        reason=included.reason if included.failed else None,
        receipt_id=receipt_id,
        kid=kid,
        outcome=outcome,
        inclusion=included.status,
        inclusion_detail=included.detail,
    )


def fetch_issuer_jwks(issuer: str, *, timeout: float = 10.0) -> Any:
    """The JWKS an issuer publishes at ``issuer`` + ``/.well-known/jwks.json`` (``ValueError`` on any failure)."""
    import httpx

    base = issuer.rstrip("/")
    if not base.startswith(("https://", "http://")):
        raise ValueError("the issuer must be an http(s) URL")
    url = base if base.endswith(JWKS_PATH) else base + JWKS_PATH
    try:
        response = httpx.get(url, timeout=timeout)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as err:
        raise ValueError(f"cannot fetch the issuer's key set from {url}: {err}") from err


def inclusion_sentence(inclusion: str, detail: str) -> str:
    """One line on the transparency-log proof for the command lines."""
    if inclusion == "verified":
        return f"Inclusion VERIFIED: {detail}."
    return f"Inclusion was NOT checked: {detail}."


def main(argv: list[str] | None = None) -> int:
    """``tollgate-verify``: the standalone offline verifier's command line."""
    parser = argparse.ArgumentParser(prog="tollgate-verify", description="Verify a portable receipt offline.")
    parser.add_argument("portable", help="the portable receipt JSON (GET /v1/receipts/{id}/portable)")
    pin = parser.add_mutually_exclusive_group()
    pin.add_argument("--keys", help="a JWKS obtained through a trusted channel: pins the issuer")
    pin.add_argument("--issuer", help="the issuer's base URL: fetches its /.well-known/jwks.json and pins it")
    parser.add_argument("--policy", help="a tollgate.tlog-policy/v1 file: trusted log and witness keys, quorum")
    args = parser.parse_args(argv)
    try:
        document = json.loads(Path(args.portable).read_text(encoding="utf-8"))
        jwks = json.loads(Path(args.keys).read_text(encoding="utf-8")) if args.keys else None
        if args.issuer:
            jwks = fetch_issuer_jwks(args.issuer)
        policy = None
        if args.policy:
            from tollgate_client.tlog.policy import Policy

            policy = Policy.from_json(json.loads(Path(args.policy).read_text(encoding="utf-8")))
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    verdict = verify_portable_standalone(document, jwks, policy)
    fields = ("valid", "reason", "receipt_id", "kid", "outcome", "inclusion", "inclusion_detail")
    print(json.dumps({k: getattr(verdict, k) for k in fields}, indent=2))
    if not verdict.valid:
        print(f"INVALID: {verdict.reason}", file=sys.stderr)
        if verdict.inclusion == "failed":
            print(f"The inclusion proof failed: {verdict.inclusion_detail}", file=sys.stderr)
        return 1
    if jwks is None:
        print(
            f"VALID against the receipt's own key snapshot only: receipt {verdict.receipt_id} ({verdict.outcome}) "
            f"is intact and signed by the key the snapshot names {verdict.kid}. This does not prove who issued it; "
            "pin the issuer with --keys JWKS or --issuer URL."
        )
    else:
        source = f"the key set of {args.issuer}" if args.issuer else f"the key set in {args.keys}"
        print(f"VALID: receipt {verdict.receipt_id} ({verdict.outcome}) is signed by {verdict.kid} of {source}.")
    print(inclusion_sentence(verdict.inclusion, verdict.inclusion_detail))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
