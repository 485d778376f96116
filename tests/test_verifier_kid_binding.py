"""The offline verifiers bind a kid to its key and say what a valid signature proves (adversarial review item 7).

The attack: take a genuine portable receipt, re-sign its statement with an attacker's key, and embed the
attacker's public key in the snapshot under the genuine kid. Before, ``python -m receipts.verify`` answered
"VALID ... signed by sig_<genuine kid>".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from common.canonical import b64url_decode_strict, b64url_encode, canonical_bytes
from receipts.verify import verify_portable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))

from tollgate_client.verify import verify_portable_standalone

GOLDEN = Path(__file__).resolve().parent / "golden" / "portable"
ROOT = Path(__file__).resolve().parent.parent


def _forged() -> dict[str, Any]:
    """The golden valid receipt, its outcome changed, re-signed by an attacker under the genuine kid."""
    doc = json.loads((GOLDEN / "valid.json").read_text())
    statement = json.loads(b64url_decode_strict(doc["signed_bytes"]))
    statement["outcome"] = "failed_refunded"
    attacker = Ed25519PrivateKey.generate()
    signed = canonical_bytes(statement)
    public = attacker.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    doc["signed_bytes"] = b64url_encode(signed)
    doc["signature"] = b64url_encode(attacker.sign(signed))
    doc["receipt"] = statement
    doc["keys"] = {
        "keys": [{"kty": "OKP", "crv": "Ed25519", "x": b64url_encode(public), "kid": statement["kid"], "use": "sig"}]
    }
    return dict(doc)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env)


def test_both_verifiers_refuse_a_key_under_a_kid_it_does_not_derive() -> None:
    forged = _forged()
    assert verify_portable(forged).reason == "kid_key_mismatch"
    assert verify_portable_standalone(forged).reason == "kid_key_mismatch"
    # The same forged key supplied as the "trusted" key set is refused just the same.
    assert verify_portable(forged, forged["keys"]).reason == "kid_key_mismatch"
    assert verify_portable_standalone(forged, forged["keys"]).reason == "kid_key_mismatch"
    # The genuine receipt still verifies in both.
    genuine = json.loads((GOLDEN / "valid.json").read_text())
    assert verify_portable(genuine).valid
    assert verify_portable_standalone(genuine).valid


def test_cli_refuses_the_forgery_and_says_what_a_snapshot_proves(tmp_path: Path) -> None:
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(_forged()))
    done = _run("-m", "receipts.verify", str(forged))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "kid_key_mismatch" in done.stderr
    done = _run("-m", "receipts.verify", str(GOLDEN / "valid.json"))
    assert done.returncode == 0
    assert "own key snapshot only" in done.stdout
    assert "does not prove who issued it" in done.stdout
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(json.loads((GOLDEN / "valid.json").read_text())["keys"]))
    done = _run("-m", "receipts.verify", str(GOLDEN / "valid.json"), "--keys", str(jwks))
    assert done.returncode == 0
    assert "snapshot only" not in done.stdout
    assert f"of the key set in {jwks}" in done.stdout


def test_client_cli_refuses_the_forgery(tmp_path: Path) -> None:
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(_forged()))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "client")}
    done = _run("-m", "tollgate_client.verify", str(forged), env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "kid_key_mismatch" in done.stderr
    done = _run("-m", "tollgate_client.verify", str(GOLDEN / "valid.json"), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "own key snapshot only" in done.stdout


@pytest.mark.django_db(transaction=True)
def test_issuer_pins_the_key_set_fetched_from_the_gateway(live_server: Any, tmp_path: Path) -> None:
    """A receipt signed by this gateway verifies with --issuer; the golden one (another issuer) does not."""
    from receipts.selectors import portable_receipt
    from tests.conftest import make_tenant
    from tests.test_receipts import make_receipt

    receipt = make_receipt(make_tenant("issuer"))
    portable = tmp_path / "mine.json"
    portable.write_text(json.dumps(portable_receipt(receipt)))
    done = _run("-m", "receipts.verify", str(portable), "--issuer", live_server.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"of the key set of {live_server.url}" in done.stdout
    done = _run("-m", "receipts.verify", str(GOLDEN / "valid.json"), "--issuer", live_server.url)
    assert done.returncode == 1
    assert "unknown_kid" in done.stderr
    done = _run("-m", "receipts.verify", str(portable), "--issuer", "http://127.0.0.1:9")
    assert done.returncode == 2
    assert "cannot fetch the issuer's key set" in done.stderr


@pytest.mark.django_db
def test_the_service_refuses_a_stored_key_its_kid_does_not_derive() -> None:
    """Someone who can write the signing-key table replaces the public key stored under the active kid with
    their own: statements they sign under that kid are refused by the service as by the offline verifiers."""
    from django.db import connection

    from audit import signing
    from audit.evidence_core import sign_canonical
    from audit.services import signing_key_ensure
    from common.cache import clear_all

    kid = signing_key_ensure().key_id
    honest = signing.sign_statement({"type": "receipt", "receipt_id": "rcpt_honest"})
    attacker = Ed25519PrivateKey.generate()
    public = b64url_encode(attacker.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    with connection.cursor() as cursor:
        cursor.execute("UPDATE audit_signing_key SET public_key = %s WHERE key_id = %s", [public, kid])
    clear_all()
    forged = {"type": "receipt", "receipt_id": "rcpt_forged", "kid": kid}
    result = signing.verify_statement(forged, sign_canonical(attacker, canonical_bytes(forged)))
    assert (result.valid, result.reason) == (False, "unknown_kid")
    # And nothing signed under the kid verifies until the row is put right: the row is not trusted.
    assert not signing.verify_statement(honest.statement, honest.signature).valid
