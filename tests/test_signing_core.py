"""Signed statements without the database: golden vectors, independent checks, rejections."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import nacl.exceptions
import nacl.signing
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.evidence_core import (
    key_id_for_public_key,
    private_key_from_seed,
    raw_public_key,
    sign_canonical,
    verify_bytes_with_keys,
    verify_statement_with_keys,
)
from common.canonical import b64url_decode_strict, b64url_encode, canonical_bytes

GOLDEN = json.loads((Path(__file__).parent / "golden" / "signing_vectors.json").read_text(encoding="utf-8"))
KEYS = {GOLDEN["kid"]: GOLDEN["public_key"]}


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def test_golden_key_is_the_rfc8032_test_key():
    private = private_key_from_seed(bytes.fromhex(GOLDEN["test_seed_hex"]))
    raw = raw_public_key(private)
    assert raw.hex() == GOLDEN["public_key_hex"]
    # RFC 8032 section 7.1, TEST 1.
    assert raw.hex() == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    assert key_id_for_public_key(raw) == GOLDEN["kid"]
    assert GOLDEN["kid"].startswith("sig_")
    assert len(GOLDEN["kid"]) == 26


@pytest.mark.parametrize("vector", GOLDEN["vectors"], ids=lambda v: v["statement"]["type"])
def test_golden_vectors_with_project_code(vector):
    canonical = bytes.fromhex(vector["canonical_hex"])
    assert canonical_bytes(vector["statement"]) == canonical
    assert verify_statement_with_keys(vector["statement"], vector["signature"], KEYS).valid
    assert verify_bytes_with_keys(canonical, vector["signature"], KEYS).valid
    # Ed25519 is deterministic: the same seed signs the same bytes identically.
    private = private_key_from_seed(bytes.fromhex(GOLDEN["test_seed_hex"]))
    assert sign_canonical(private, canonical) == vector["signature"]


@pytest.mark.parametrize("vector", GOLDEN["vectors"], ids=lambda v: v["statement"]["type"])
def test_golden_vectors_with_pynacl_only(vector):
    """An independent check: PyNaCl (libsodium) and the committed hex, none of the project's code."""
    canonical = bytes.fromhex(vector["canonical_hex"])
    verify_key = nacl.signing.VerifyKey(bytes.fromhex(GOLDEN["public_key_hex"]))
    verify_key.verify(canonical, _unb64url(vector["signature"]))
    assert json.loads(canonical) == vector["statement"]
    assert json.loads(canonical)["kid"] == GOLDEN["kid"]
    tampered = bytearray(canonical)
    tampered[len(tampered) // 2] ^= 0x01
    with pytest.raises(nacl.exceptions.BadSignatureError):
        verify_key.verify(bytes(tampered), _unb64url(vector["signature"]))
    # libsodium derives the same public key from the committed test seed.
    assert bytes(nacl.signing.SigningKey(bytes.fromhex(GOLDEN["test_seed_hex"])).verify_key) == bytes.fromhex(
        GOLDEN["public_key_hex"]
    )


@pytest.mark.parametrize("vector", GOLDEN["vectors"], ids=lambda v: v["statement"]["type"])
def test_golden_vectors_with_plain_cryptography(vector):
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(GOLDEN["public_key_hex"])).verify(
        _unb64url(vector["signature"]), bytes.fromhex(vector["canonical_hex"])
    )


def test_golden_canonical_form_details():
    receipt = next(v for v in GOLDEN["vectors"] if v["statement"]["type"] == "receipt")
    text = bytes.fromhex(receipt["canonical_hex"]).decode("utf-8")
    assert '": ' not in text
    assert '", "' not in text
    assert "\\u0001" in text
    assert "\\n" in text
    assert "\\t" in text
    assert "é" in text
    # RFC 8785 sorts keys by UTF-16 code units: U+1F600 (D83D DE00) before U+FB33.
    assert text.index("emoji key") < text.index("hebrew key")


VECTOR = GOLDEN["vectors"][0]


def test_rejects_unknown_kid():
    result = verify_statement_with_keys(VECTOR["statement"], VECTOR["signature"], {})
    assert (result.valid, result.reason) == (False, "unknown_kid")


def test_rejects_every_changed_field():
    for key in VECTOR["statement"]:
        if key in ("kid", "type"):
            continue
        changed = {**VECTOR["statement"], key: "x"}
        result = verify_statement_with_keys(changed, VECTOR["signature"], KEYS)
        assert (result.valid, result.reason) == (False, "bad_signature"), key
    added = {**VECTOR["statement"], "extra": True}
    assert verify_statement_with_keys(added, VECTOR["signature"], KEYS).reason == "bad_signature"


def test_rejects_every_flipped_byte():
    canonical = bytes.fromhex(VECTOR["canonical_hex"])
    for i in range(len(canonical)):
        tampered = bytearray(canonical)
        tampered[i] ^= 0x20
        assert not verify_bytes_with_keys(bytes(tampered), VECTOR["signature"], KEYS).valid, i


def test_rejects_swapped_type():
    statement = VECTOR["statement"]
    assert verify_statement_with_keys(statement, VECTOR["signature"], KEYS, expected_type="permit").valid
    result = verify_statement_with_keys(statement, VECTOR["signature"], KEYS, expected_type="receipt")
    assert (result.valid, result.reason) == (False, "type_mismatch")
    relabelled = {**statement, "type": "receipt"}
    assert verify_statement_with_keys(relabelled, VECTOR["signature"], KEYS).reason == "bad_signature"


def test_rejects_non_canonical_bytes():
    canonical = bytes.fromhex(VECTOR["canonical_hex"])
    statement = json.loads(canonical)
    variants = [
        json.dumps(statement).encode(),  # whitespace
        json.dumps(dict(reversed(statement.items())), separators=(",", ":"), ensure_ascii=False).encode(),
        canonical[:-1] + b" }",
        canonical.replace(b'"type":"permit"', b'"type":"p\\u0065rmit"'),  # escaped letter
        canonical[:1] + b'"type":"permit",' + canonical[1:],  # duplicate key
    ]
    for data in variants:
        assert data != canonical
        result = verify_bytes_with_keys(data, VECTOR["signature"], KEYS)
        assert (result.valid, result.reason) == (False, "non_canonical"), data
    assert verify_bytes_with_keys(b"not json", VECTOR["signature"], KEYS).reason == "invalid_json"
    assert verify_bytes_with_keys(b'{"type":"x","n":NaN}', VECTOR["signature"], KEYS).reason == "invalid_json"
    assert verify_bytes_with_keys(b"[1]", VECTOR["signature"], KEYS).reason == "not_an_object"


def test_rejects_malformed_signatures():
    sig = VECTOR["signature"]
    for bad in [sig + "=", sig[:-1], sig + "AA", sig.replace(sig[5], "+", 1), "", "!" * 86]:
        result = verify_statement_with_keys(VECTOR["statement"], bad, KEYS)
        assert not result.valid
        assert result.reason in ("malformed_signature", "bad_signature"), bad
    # A different spelling of the same bytes (non-zero trailing bits) is refused.
    last = sig[-1]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    sibling = sig[:-1] + alphabet[alphabet.index(last) ^ 1]
    assert _unb64url(sibling) == _unb64url(sig)
    assert verify_statement_with_keys(VECTOR["statement"], sibling, KEYS).reason == "malformed_signature"


def test_missing_type_or_kid():
    statement = {k: v for k, v in VECTOR["statement"].items() if k != "type"}
    assert verify_statement_with_keys(statement, VECTOR["signature"], KEYS).reason == "missing_type"
    statement = {k: v for k, v in VECTOR["statement"].items() if k != "kid"}
    assert verify_statement_with_keys(statement, VECTOR["signature"], KEYS).reason == "missing_kid"


def test_strict_base64url():
    for data in [b"", b"\x00", b"\xff\xfe", bytes(range(64))]:
        assert b64url_decode_strict(b64url_encode(data)) == data
    for bad in ["a", "ab=", "a+b/", "ab cd"]:
        with pytest.raises(ValueError):
            b64url_decode_strict(bad)


def test_verification_core_imports_no_django():
    code = (
        "import sys, audit.evidence_core, common.canonical; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework')); "
        "assert not bad, bad"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
