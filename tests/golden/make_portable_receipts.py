"""Regenerate the golden portable receipts under tests/golden/portable/.

    .venv/bin/python tests/golden/make_portable_receipts.py

They are signed with the RFC 8032 section 7.1 TEST 1 key (a published test
key, never a service key), so anyone can reproduce them. ``expected.json``
maps each file to the verdict the offline verifier must give. Imports no Django.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from audit.evidence_core import key_id_for_public_key, private_key_from_seed, raw_public_key, sign_canonical  # noqa: E402
from common.canonical import b64url_encode, canonical_bytes, sha256_hex  # noqa: E402
from receipts.verify import FORMAT  # noqa: E402

SEED_HEX = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
OTHER_SEED_HEX = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb"  # RFC 8032 TEST 2
OUT = Path(__file__).resolve().parent / "portable"


def _key(seed_hex: str) -> tuple[Any, str, str]:
    private = private_key_from_seed(bytes.fromhex(seed_hex))
    raw = raw_public_key(private)
    return private, key_id_for_public_key(raw), b64url_encode(raw)


def _portable(statement: dict[str, Any], private: Any, jwks: list[dict[str, str]]) -> dict[str, Any]:
    signed = canonical_bytes(statement)
    return {
        "format": FORMAT,
        "receipt_id": statement["receipt_id"],
        "kid": statement["kid"],
        "alg": "EdDSA",
        "signed_bytes": b64url_encode(signed),
        "signed_bytes_sha256": sha256_hex(signed),
        "signature": sign_canonical(private, signed),
        "receipt": statement,
        "keys": {"keys": jwks},
        "what_a_valid_signature_proves": "golden test vector",
        "verify_with": "python -m receipts.verify PORTABLE.json [--keys JWKS.json]",
    }


def main() -> None:
    private, kid, public = _key(SEED_HEX)
    other_private, other_kid, other_public = _key(OTHER_SEED_HEX)
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": public, "kid": kid, "use": "sig", "alg": "EdDSA", "status": "active"}
    statement = {
        "type": "receipt",
        "receipt_id": "rcpt_GoldenVector00000000001",
        "tenant_id": "spn_GoldenTenant000000000001",
        "action_id": "act_GoldenAction000000000001",
        "wallet_id": "agt_GoldenAgent0000000000001",
        "permit_id": "pmt_GoldenPermit000000000001",
        "api_key_id": "key_GoldenKey00000000000001",
        "tool": "notes.append",
        "outcome": "success",
        "reason_code": "",
        "request_hash": "3" * 64,
        "response_hash": "4" * 64,
        "credits_authorized": "0.50000000",
        "credits_charged": "0.50000000",
        "ledger_entry_id": "led_GoldenEntry00000000001",
        "refund_entry_id": None,
        "quote_id": None,
        "audit_event_id": "evt_GoldenEvent00000000001",
        "policy_decision_id": "pdec_GoldenDecision000000001",
        "created_at": "2026-11-21T12:00:00.000000Z",
        "kid": kid,
    }
    cases: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    valid = _portable(statement, private, [jwk])
    cases["valid.json"] = (valid, {"valid": True, "reason": None})

    tampered = copy.deepcopy(valid)
    forged = dict(statement, credits_charged="0.00000000")
    tampered["signed_bytes"] = b64url_encode(canonical_bytes(forged))
    tampered["receipt"] = forged
    cases["tampered_amount.json"] = (tampered, {"valid": False, "reason": "bad_signature"})

    readable = copy.deepcopy(valid)
    readable["receipt"] = dict(statement, outcome="tool_error")
    cases["readable_copy_differs.json"] = (readable, {"valid": False, "reason": "receipt_differs_from_signed_bytes"})

    top_level = copy.deepcopy(valid)
    top_level["receipt_id"] = "rcpt_0000000000000000000000"
    cases["top_level_id_differs.json"] = (top_level, {"valid": False, "reason": "receipt_id_differs_from_signed_bytes"})

    wrong_key = _portable(statement, other_private, [jwk])
    cases["signed_by_other_key.json"] = (wrong_key, {"valid": False, "reason": "bad_signature"})

    unknown = _portable(dict(statement, kid=other_kid), other_private, [jwk])
    cases["unknown_kid.json"] = (unknown, {"valid": False, "reason": "unknown_kid"})

    pretty = copy.deepcopy(valid)
    pretty["signed_bytes"] = b64url_encode(json.dumps(statement, indent=1).encode())
    cases["non_canonical_bytes.json"] = (pretty, {"valid": False, "reason": "non_canonical"})

    quote = copy.deepcopy(valid)
    as_quote = dict(statement, type="quote")
    quote_bytes = canonical_bytes(as_quote)
    quote.update(
        signed_bytes=b64url_encode(quote_bytes), signature=sign_canonical(private, quote_bytes), receipt=as_quote
    )
    cases["wrong_type.json"] = (quote, {"valid": False, "reason": "type_mismatch"})

    OUT.mkdir(exist_ok=True)
    expected = {}
    for name, (document, verdict) in cases.items():
        (OUT / name).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        expected[name] = verdict
    (OUT / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    jwks = {"keys": [jwk, {**jwk, "kid": other_kid, "x": other_public, "status": "retired"}]}
    (OUT / "jwks_both_keys.json").write_text(json.dumps(jwks, indent=2) + "\n")
    print(f"wrote {len(cases)} portable receipts to {OUT}")


if __name__ == "__main__":
    main()
