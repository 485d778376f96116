"""Signing keys in the database: activation, rotation, the key file, endpoints, no private material out."""

from __future__ import annotations

import json
import os
import stat
import threading
import time

import pytest
from django.conf import settings
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.db import IntegrityError, connection, connections, transaction
from django.utils import timezone

from audit import keystore
from audit.evidence_core import private_key_from_seed, raw_public_key
from audit.models import AuditEvent, SigningKey, SigningKeyState
from audit.services import signing_key_ensure, signing_key_rotate
from audit.signing import public_key_set, sign_statement, verify_statement, verify_statement_bytes
from common.canonical import b64url_encode

pytestmark = pytest.mark.django_db


@pytest.fixture
def key_file(tmp_path, settings):
    """A private key file for this test only; the environment key is unset."""
    path = tmp_path / "keys" / "signing-keys.json"
    settings.SIGNING_KEY_FILE = str(path)
    settings.SIGNING_KEY_PRIVATE = ""
    return path


def _private_bytes_in_file(path) -> list[str]:
    return [entry["private_key"] for entry in json.loads(path.read_text())["keys"]]


def test_tests_never_use_the_developers_key_file():
    default = settings.BASE_DIR / ".data" / "keys" / "signing-keys.json"
    if str(default) == settings.SIGNING_KEY_FILE:
        assert keystore.key_file_path() != default.resolve()
        assert "tollgate-test-keys-" in str(keystore.key_file_path())


def test_sign_creates_a_key_lazily_and_verifies(key_file):
    assert not SigningKey.objects.exists()
    signed = sign_statement({"type": "quote", "quote_id": "qt_1", "price": "1.50000000"})
    key = SigningKey.objects.get()
    assert key.state == SigningKeyState.ACTIVE
    assert key.key_id.startswith("sig_")
    assert signed.kid == key.key_id == signed.statement["kid"]
    assert verify_statement(signed.statement, signed.signature, expected_type="quote").valid
    assert verify_statement_bytes(signed.canonical, signed.signature, expected_type="quote").valid
    # The key file is owner-only, in an owner-only directory, and holds the private key; the database does not.
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(key_file.parent).st_mode) == 0o700
    private = _private_bytes_in_file(key_file)
    assert len(private) == 1
    assert private[0] not in json.dumps(list(SigningKey.objects.values()), default=str)
    # A second signature reuses the same key (nothing new written).
    sign_statement({"type": "quote"})
    assert SigningKey.objects.count() == 1
    assert len(_private_bytes_in_file(key_file)) == 1


def test_sign_requires_type(key_file):
    with pytest.raises(ValueError):
        sign_statement({"quote_id": "qt_1"})
    with pytest.raises(ValueError):
        sign_statement({"type": ""})


def test_sign_replaces_a_stale_kid(key_file):
    signed = sign_statement({"type": "permit", "kid": "sig_old"})
    assert signed.kid != "sig_old"
    assert verify_statement(signed.statement, signed.signature).valid


def test_verify_rejects_unknown_kid_type_swap_and_tampering(key_file):
    signed = sign_statement({"type": "permit", "permit_id": "pmt_1", "max_credits": "5.00000000"})
    assert verify_statement({**signed.statement, "kid": "sig_unknown"}, signed.signature).reason == "unknown_kid"
    assert verify_statement(signed.statement, signed.signature, expected_type="receipt").reason == "type_mismatch"
    assert verify_statement({**signed.statement, "max_credits": "50.00000000"}, signed.signature).reason == (
        "bad_signature"
    )
    assert verify_statement_bytes(signed.canonical + b" ", signed.signature).reason == "non_canonical"


def test_exactly_one_active_key_is_enforced_by_the_database(key_file):
    signing_key_ensure()
    now = timezone.now()
    other = keystore.material(private_key_from_seed(bytes(32)))
    with pytest.raises(IntegrityError), transaction.atomic():
        SigningKey.objects.create(
            key_id=other.kid, public_key=other.public_key, state="active", created_at=now, activated_at=now
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        SigningKey.objects.create(key_id=other.kid, public_key=other.public_key, state="retired", created_at=now)


def test_rotation_keeps_old_statements_verifiable(key_file):
    before = sign_statement({"type": "receipt", "receipt_id": "rcpt_1"})
    old_kid = before.kid
    new_key = signing_key_rotate(actor="test")
    assert new_key.key_id != old_kid
    old = SigningKey.objects.get(key_id=old_kid)
    assert old.state == SigningKeyState.RETIRED
    assert old.retired_at is not None
    assert SigningKey.objects.filter(state="active").get() == new_key
    after = sign_statement({"type": "receipt", "receipt_id": "rcpt_2"})
    assert after.kid == new_key.key_id
    assert verify_statement(before.statement, before.signature, expected_type="receipt").valid
    assert verify_statement(after.statement, after.signature, expected_type="receipt").valid
    assert set(public_key_set()) == {old_kid, new_key.key_id}
    # Both private keys stay in the file; the rotation is audited on the system chain.
    assert len(_private_bytes_in_file(key_file)) == 2
    event = AuditEvent.objects.get(event="signing_key.rotated")
    assert event.chain == "system"
    assert event.detail["retired_key_ids"] == [old_kid]


def test_management_commands(key_file, capsys):
    call_command("ensure_signing_key")
    first = SigningKey.objects.get(state="active")
    call_command("ensure_signing_key")  # idempotent
    assert SigningKey.objects.count() == 1
    call_command("rotate_signing_key")
    second = SigningKey.objects.get(state="active")
    assert second.key_id != first.key_id
    out = capsys.readouterr().out
    for private in _private_bytes_in_file(key_file):
        assert private not in out
    assert AuditEvent.objects.filter(event="signing_key.activated").count() == 1


def test_ensure_adopts_an_unused_key_from_the_file(key_file):
    stored = keystore.generate_and_store()
    assert signing_key_ensure().key_id == stored.kid


def test_environment_key_is_used(key_file, settings):
    seed = bytes(range(32))
    settings.SIGNING_KEY_PRIVATE = b64url_encode(seed)
    expected = keystore.material(private_key_from_seed(seed))
    signed = sign_statement({"type": "permit"})
    assert signed.kid == expected.kid
    assert SigningKey.objects.get().public_key == b64url_encode(raw_public_key(expected.private_key))
    assert not key_file.exists()  # nothing written when the environment holds the key


def test_ensure_repairs_an_active_key_without_private_part(key_file):
    from audit.exceptions import SigningKeyUnavailable

    now = timezone.now()
    orphan = keystore.material(private_key_from_seed(b"\x07" * 32))
    SigningKey.objects.create(
        key_id=orphan.kid, public_key=orphan.public_key, state="active", created_at=now, activated_at=now
    )
    keystore._cache.pop(orphan.kid, None)
    with pytest.raises(SigningKeyUnavailable):
        sign_statement({"type": "permit"})
    repaired = signing_key_ensure(repair=True)
    assert repaired.key_id != orphan.kid
    assert SigningKey.objects.get(key_id=orphan.kid).state == SigningKeyState.RETIRED


def test_signing_is_fast(key_file):
    import time

    sign_statement({"type": "warmup"})
    statement = {"type": "receipt", "receipt_id": "rcpt_x", "wallet_id": "agt_x", "outcome": "success"}
    n = 200
    started = time.perf_counter()
    for _ in range(n):
        sign_statement(statement)
    per_call = (time.perf_counter() - started) / n
    assert per_call < 0.002, f"{per_call * 1e6:.0f} us per signature"


# --- HTTP -------------------------------------------------------------------------


def test_active_key_endpoint_is_public(anon_client, key_file):
    r = anon_client.get("/v1/signing-keys/active")
    assert r.status_code == 200, r.content
    body = r.json()
    key = SigningKey.objects.get(state="active")
    assert body == {
        "key_id": key.key_id,
        "algorithm": "Ed25519",
        "public_key": key.public_key,
        "state": "active",
        "created_at": body["created_at"],
        "activated_at": body["activated_at"],
        "retired_at": None,
    }
    assert r["X-Request-Id"]


def test_key_detail_active_retired_and_unknown(anon_client, key_file):
    old = signing_key_ensure()
    new = signing_key_rotate()
    r = anon_client.get(f"/v1/signing-keys/{old.key_id}")
    assert r.status_code == 200
    assert r.json()["state"] == "retired"
    assert r.json()["retired_at"]
    assert anon_client.get(f"/v1/signing-keys/{new.key_id}").json()["state"] == "active"
    r = anon_client.get("/v1/signing-keys/sig_doesnotexist")
    assert r.status_code == 404
    assert r.json()["detail"]["error"] == "not_found"
    assert anon_client.get("/v1/signing-keys/active").json()["key_id"] == new.key_id


def test_jwks(anon_client, key_file):
    old = signing_key_ensure()
    new = signing_key_rotate()
    r = anon_client.get("/.well-known/jwks.json")
    assert r.status_code == 200
    keys = r.json()["keys"]
    assert [k["kid"] for k in keys] == [new.key_id, old.key_id]
    for jwk, state in zip(keys, ["active", "retired"], strict=True):
        assert jwk["kty"] == "OKP"
        assert jwk["crv"] == "Ed25519"
        assert jwk["use"] == "sig"
        assert jwk["alg"] == "EdDSA"
        assert jwk["status"] == state
        assert "d" not in jwk  # never the private part
    assert keys[0]["x"] == new.public_key


def test_a_bad_key_on_a_public_endpoint_is_still_401(anon_client, key_file):
    anon_client.credentials(HTTP_X_API_KEY="tg_key_bogus_0000")
    assert anon_client.get("/v1/signing-keys/active").status_code == 401


def test_no_private_key_in_responses_or_admin(anon_client, key_file, admin_client):
    signing_key_ensure()
    signing_key_rotate()
    secrets = _private_bytes_in_file(key_file)
    pages = [
        anon_client.get("/v1/signing-keys/active").content,
        anon_client.get("/.well-known/jwks.json").content,
        admin_client.get("/admin/audit/signingkey/").content,
    ]
    key = SigningKey.objects.get(state="active")
    r = admin_client.get(f"/admin/audit/signingkey/{quote(key.key_id)}/change/")
    assert r.status_code == 200
    pages.append(r.content)
    for content in pages:
        for secret in secrets:
            assert secret.encode() not in content
    # Read-only console: no add page, no delete page.
    assert admin_client.get("/admin/audit/signingkey/add/").status_code == 403
    assert admin_client.get(f"/admin/audit/signingkey/{quote(key.key_id)}/delete/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_concurrent_rotations_take_turns(key_file):
    """Two rotations at once: the one that waited retires the key the other activated (it found no
    active row once the other committed, and its insert broke the one-active-key index)."""
    signing_key_ensure()
    first = SigningKey.objects.get(state="active").key_id
    started = threading.Barrier(2)
    answers: list[object] = []

    def rotate() -> None:
        try:
            started.wait()
            answers.append(signing_key_rotate(actor="test").key_id)
        except Exception as exc:  # reported by the assertion below
            answers.append(exc)
        finally:
            connections.close_all()

    # Hold the first rotation's lock on the active row until both are under way.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM audit_signing_key WHERE state = 'active' FOR UPDATE")
        threads = [threading.Thread(target=rotate) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
    for thread in threads:
        thread.join(30)
    assert all(isinstance(answer, str) for answer in answers), answers
    active = SigningKey.objects.get(state="active")
    assert active.key_id in answers
    assert set(SigningKey.objects.filter(state="retired").values_list("key_id", flat=True)) == (
        {first, *answers} - {active.key_id}
    )
