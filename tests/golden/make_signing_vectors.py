"""Regenerate ``signing_vectors.json`` (run once; the committed file is the reference).

    .venv/bin/python tests/golden/make_signing_vectors.py

The seed is the RFC 8032 section 7.1 TEST 1 secret key: a published test
vector, never a key any Tollgate deployment uses. Ed25519 signatures are
deterministic, so regenerating yields the same file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from audit.evidence_core import (  # noqa: E402
    key_id_for_public_key,
    private_key_from_seed,
    raw_public_key,
    sign_canonical,
)
from common.canonical import b64url_encode, canonical_bytes  # noqa: E402

SEED_HEX = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"

STATEMENTS: list[dict[str, Any]] = [
    {
        "type": "permit",
        "permit_id": "pmt_0123456789abcdefghijKL",
        "wallet_id": "agt_0123456789abcdefghijKL",
        "allowed_tools": ["partner.notes.write", "search.web"],
        "max_credits": "25.00000000",
        "expires_at": "2026-12-01T00:00:00Z",
    },
    {
        "type": "receipt",
        "receipt_id": "rcpt_0123456789abcdefghijKL",
        "outcome": "success",
        "note": 'caf\u00e9 \u20ac \U0001f600 "quoted" back\\slash\nline\ttab \u0001',
        "units": 3,
        "ok": True,
        "refund": None,
        "nested": {"\u00e9": 1, "z": [], "a": {}, "\U0001f600": "emoji key", "\ufb33": "hebrew key"},
    },
    {
        "type": "audit_checkpoint",
        "chain": "spn_0123456789abcdefghijKL",
        "size": 1000,
        "head_hash": "3f" * 32,
        "issued_at": "2026-11-21T20:51:00.123456Z",
    },
]


def main() -> None:
    private_key = private_key_from_seed(bytes.fromhex(SEED_HEX))
    raw = raw_public_key(private_key)
    kid = key_id_for_public_key(raw)
    vectors = []
    for statement in STATEMENTS:
        body = {**statement, "kid": kid}
        canonical = canonical_bytes(body)
        vectors.append(
            {
                "statement": body,
                "canonical_hex": canonical.hex(),
                "signature": sign_canonical(private_key, canonical),
            }
        )
    out = {
        "description": "Tollgate signed-statement test vectors: RFC 8785 bytes, Ed25519 signature (base64url).",
        "test_seed_hex": SEED_HEX,
        "public_key_hex": raw.hex(),
        "public_key": b64url_encode(raw),
        "kid": kid,
        "vectors": vectors,
    }
    path = Path(__file__).with_name("signing_vectors.json")
    path.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
