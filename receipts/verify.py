"""Offline verification of a portable receipt. Imports no Django; opens no socket unless asked to.

    python -m receipts.verify PORTABLE.json [--keys JWKS.json | --issuer https://gateway.example]

Exit status: 0 when the receipt's signature verifies, 1 when it does not (the
reason is printed), 2 when the input or the key set cannot be read.

Key ids are derived from the public key (``sig_`` + base62 of SHA-256 of the
raw key), so every key used is checked against its kid: a key set that names
an attacker's key with the issuer's kid is refused (``kid_key_mismatch``).

Which keys are trusted decides what a valid signature proves. Without
``--keys`` or ``--issuer`` the key snapshot embedded in the export is used, and
a valid signature proves only that the receipt is intact and matches that
snapshot, not who issued it. Pin the issuer with ``--keys`` (a JWKS obtained
through a trusted channel) or ``--issuer URL`` (fetches ``URL/.well-known/jwks.json``,
the only network access this module makes).

With ``--policy POLICY.json`` (a ``tollgate.tlog-policy/v1``: trusted log keys, witness keys, a
cosignature quorum) the receipt's ``transparency`` member is checked as well: its inclusion proof,
the checkpoint's signature and the cosignations. That check is the client library's
(``tollgate_client.tlog.policy.verify_transparency``), so this verifier and the standalone one
(``tollgate-verify``) cannot disagree on it. A receipt without a proof still verifies its signature,
and the verdict says the inclusion was not checked.

A receipt of a call under a permit a person approved also carries the permit's and the approval's
signed statements (``permit``, ``approval``), checked with the same keys: the permit must be the
receipt's and the approval must approve exactly its terms (docs/audit-chain.md, "Approvals"). That
check is the client library's too (``tollgate_client.verify.carried_approval_problem``), so the two
verifiers cannot disagree on it either.

The same check is importable: ``verify_portable(document, jwks=None, policy=None)``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from audit.evidence_core import kid_matches_key, verify_bytes_with_keys
from common.canonical import b64url_decode_strict
from common.clientlib import client_module

if TYPE_CHECKING:
    from tollgate_client.tlog.policy import Policy

FORMAT = "tollgate.portable-receipt/v1"
JWKS_PATH = "/.well-known/jwks.json"


def tlog_policy_module() -> ModuleType:
    """``tollgate_client.tlog.policy``: the one check of a transparency proof (``client_module``)."""
    return client_module("tlog.policy")


@dataclass(frozen=True)
class PortableVerification:
    """The verdict: ``valid``, a stable ``reason`` code when not, and what was checked."""

    valid: bool
    reason: str | None
    receipt_id: str | None = None
    kid: str | None = None
    outcome: str | None = None
    # What became of the transparency-log proof: verified, not_checked, pending or failed.
    inclusion: str = "not_checked"
    inclusion_detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "reason": self.reason,
            "receipt_id": self.receipt_id,
            "kid": self.kid,
            "outcome": self.outcome,
            "inclusion": self.inclusion,
            "inclusion_detail": self.inclusion_detail,
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


def fetch_issuer_jwks(issuer: str, *, timeout: float = 10.0) -> Any:
    """The JWKS an issuer publishes at ``issuer`` + ``/.well-known/jwks.json`` (``ValueError`` on any failure)."""
    from urllib.error import URLError
    from urllib.request import urlopen

    base = issuer.rstrip("/")
    if not base.startswith(("https://", "http://")):
        raise ValueError("the issuer must be an http(s) URL")
    url = base if base.endswith(JWKS_PATH) else base + JWKS_PATH
    try:
        with urlopen(url, timeout=timeout) as response:  # noqa: S310 - the scheme is checked above
            return json.loads(response.read(1_000_000).decode("utf-8"))
    except (URLError, OSError, ValueError) as err:
        raise ValueError(f"cannot fetch the issuer's key set from {url}: {err}") from err


def verify_portable(document: Any, jwks: Any = None, policy: Policy | None = None) -> PortableVerification:
    """Verify a portable receipt against ``jwks`` (default: the snapshot it carries) and a tlog ``policy``."""
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
    base: dict[str, Any] = {"receipt_id": receipt_id, "kid": kid, "outcome": outcome}
    try:
        keys = keys_from_jwks(jwks if jwks is not None else document.get("keys"))
    except ValueError:
        return PortableVerification(False, "no_key_set", **base)
    if document.get("kid") != kid:
        return PortableVerification(False, "kid_mismatch", **base)
    if isinstance(kid, str) and kid in keys and not kid_matches_key(kid, keys[kid]):
        # A key set naming some other key with this kid: the kid is derived from the key it names.
        return PortableVerification(False, "kid_key_mismatch", **base)
    result = verify_bytes_with_keys(signed, signature, keys, expected_type="receipt")
    if not result.valid:
        return PortableVerification(False, result.reason, **base)
    disagreeing = unsigned_field_disagreeing(document, statement, signed)
    if disagreeing is not None:
        return PortableVerification(False, f"{disagreeing}_differs_from_signed_bytes", **base)
    approval_problem = client_module("verify").carried_approval_problem(document, statement, keys)
    if approval_problem is not None:
        return PortableVerification(False, approval_problem, **base)
    tenant = statement.get("tenant_id")
    included = tlog_policy_module().verify_transparency(
        document.get("transparency"), signed, policy, tenant=tenant if isinstance(tenant, str) else None
    )
    if included.failed:
        return PortableVerification(
            False, included.reason, **base, inclusion="failed", inclusion_detail=included.detail
        )
    return PortableVerification(True, None, **base, inclusion=included.status, inclusion_detail=included.detail)


def unsigned_field_disagreeing(document: Mapping[str, Any], statement: Mapping[str, Any], signed: bytes) -> str | None:
    """The first unsigned field of a portable receipt that restates the signed statement and disagrees with it.

    A consumer may read ``receipt_id`` or the readable ``receipt`` copy without decoding the signed bytes,
    so every field that restates them must say exactly what was signed (each is optional; ``kid`` is
    checked before the signature, as ``kid_mismatch``).
    """
    expected = {
        "receipt_id": statement.get("receipt_id"),
        "receipt": statement,
        "signed_bytes_sha256": hashlib.sha256(signed).hexdigest(),
        "alg": "EdDSA",
    }
    for field, value in expected.items():
        if field in document and document[field] != value:
            return field
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m receipts.verify", description="Verify a portable receipt offline.")
    parser.add_argument("portable", help="the portable receipt JSON (GET /v1/receipts/{id}/portable)")
    pin = parser.add_mutually_exclusive_group()
    pin.add_argument("--keys", help="a JWKS obtained through a trusted channel: pins the issuer")
    pin.add_argument("--issuer", help="the issuer's base URL: fetches its /.well-known/jwks.json and pins it")
    parser.add_argument("--policy", help="a tollgate.tlog-policy/v1 file: trusted log and witness keys, quorum")
    args = parser.parse_args(argv)
    try:
        document = json.loads(Path(args.portable).read_text(encoding="utf-8"))
        jwks = json.loads(Path(args.keys).read_text(encoding="utf-8")) if args.keys else None
        policy_doc = json.loads(Path(args.policy).read_text(encoding="utf-8")) if args.policy else None
        policy = tlog_policy_module().Policy.from_json(policy_doc) if policy_doc is not None else None
    except (OSError, ValueError) as err:
        print(f"error: cannot read input: {err}", file=sys.stderr)
        return 2
    if args.issuer:
        try:
            jwks = fetch_issuer_jwks(args.issuer)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    verdict = verify_portable(document, jwks, policy)
    print(json.dumps(verdict.as_dict(), indent=2))
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
    if verdict.inclusion == "verified":
        print(f"Inclusion VERIFIED: {verdict.inclusion_detail}.")
    else:
        print(f"Inclusion was NOT checked: {verdict.inclusion_detail}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
