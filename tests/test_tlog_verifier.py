"""Both offline verifiers check a portable receipt's transparency-log proof against a trust policy.

``receipts.verify.verify_portable`` (the checkout's) and ``tollgate_client.verify.verify_portable_standalone``
(the installed client's) must give the same verdict on every document: a receipt included in its
tenant's log under a checkpoint cosigned by the quorum verifies; each attack is refused with its reason
named: a proof from a rewritten or forked log that the witnesses did not cosign, a deleted leaf, a
checkpoint signed by the wrong key, a proof from another tenant's log, a tampered proof or cosignature.
No database.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))

from tollgate_client.tlog import POLICY_FORMAT, Cosigner, Policy, format_note, generate_signer, parse_note
from tollgate_client.verify import verify_portable_standalone
from tollgate_client.witness import Witness, add_checkpoint_body

from receipts.verify import verify_portable
from tests.tlog_helpers import MemoryLog

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "portable"
TENANT = "spn_GoldenTenant000000000001"


def _receipt() -> dict[str, Any]:
    return json.loads((GOLDEN / "valid.json").read_text())


def _signed(receipt: dict[str, Any]) -> bytes:
    text = receipt["signed_bytes"]
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class World:
    """A tenant's log holding the golden receipt among other statements, and two witnesses."""

    def __init__(self, tmp_path: Path, tenant: str = TENANT) -> None:
        self.receipt = _receipt()
        self.log = MemoryLog.for_tenant(tenant)
        for i in range(6):
            self.log.append(f"earlier statement {i}".encode())
        self.index = self.log.append(_signed(self.receipt))
        for i in range(4):
            self.log.append(f"later statement {i}".encode())
        self.witnesses = [
            Witness(
                cosigner=Cosigner(f"witness.test/w{n}", Ed25519PrivateKey.generate()),
                logs=[self.log.signer.verifier],
                state_file=tmp_path / f"w{n}.json",
            )
            for n in (1, 2)
        ]

    def cosigned(self, log: MemoryLog | None = None, witnesses: list[Witness] | None = None) -> str:
        log = log or self.log
        note = log.checkpoint()
        lines = []
        for w in witnesses or self.witnesses:
            held = w.latest(log.origin)
            old = 0 if held is None else held[0]
            lines.append(w.add_checkpoint(add_checkpoint_body(old, log.consistency(old), note), now=1_800_000_000))
        return note + "".join(lines)

    def policy(self, quorum: int = 2, logs: list[MemoryLog] | None = None, **extra: Any) -> Policy:
        return Policy.from_json(
            {
                "format": POLICY_FORMAT,
                "logs": [str(log.signer.verifier) for log in logs or [self.log]],
                "witnesses": [w.verifier_key for w in self.witnesses],
                "quorum": quorum,
                **extra,
            }
        )

    def with_proof(self, note: str, index: int | None = None, log: MemoryLog | None = None) -> dict[str, Any]:
        index = self.index if index is None else index
        return {**self.receipt, "transparency": {"leaf_index": index, "proof": (log or self.log).proof(index, note)}}


def both(document: Any, policy: Policy | None) -> tuple[bool, str | None, str]:
    """The verdict of both verifiers, which must agree."""
    a = verify_portable(document, None, policy)
    b = verify_portable_standalone(document, None, policy)
    assert (a.valid, a.reason, a.inclusion, a.inclusion_detail) == (b.valid, b.reason, b.inclusion, b.inclusion_detail)
    return a.valid, a.reason, a.inclusion


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_an_included_cosigned_receipt_verifies(world):
    document = world.with_proof(world.cosigned())
    assert both(document, world.policy()) == (True, None, "verified")
    verdict = verify_portable(document, None, world.policy())
    assert f"at index {world.index} of 11" in verdict.inclusion_detail


def test_a_receipt_without_a_proof_still_verifies_and_says_so(world):
    assert both(world.receipt, world.policy()) == (True, None, "not_checked")
    assert both(world.receipt, None) == (True, None, "not_checked")
    pending = {**world.receipt, "transparency": {"status": "pending", "fetch": "https://gw.test/v1/tlog/proof"}}
    assert both(pending, world.policy()) == (True, None, "pending")
    # A policy may require the proof.
    strict = world.policy(require_proof=True)
    assert both(world.receipt, strict) == (False, "tlog_proof_missing", "failed")
    assert both(pending, strict) == (False, "tlog_proof_pending", "failed")
    # A proof without a policy to check it against is not checked either.
    assert both(world.with_proof(world.cosigned()), None) == (True, None, "not_checked")


def test_the_signature_is_still_checked_first(world):
    document = world.with_proof(world.cosigned())
    signature = base64.urlsafe_b64decode(document["signature"] + "==")
    forged = bytes([signature[0] ^ 1]) + signature[1:]
    document["signature"] = base64.urlsafe_b64encode(forged).decode().rstrip("=")
    assert both(document, world.policy()) == (False, "bad_signature", "not_checked")


def test_a_rewritten_leaf_is_not_covered_by_the_quorum(world):
    """The operator rewrites another statement and re-signs: the witnesses refuse, the quorum is not met."""
    world.cosigned()  # the witnesses hold the genuine tree
    forged = world.log.copy_rewritten(2, b"earlier statement 2, rewritten")
    note = forged.checkpoint()
    for witness in world.witnesses:
        with pytest.raises(Exception, match="fork"):
            witness.add_checkpoint(add_checkpoint_body(forged.size, [], note))
    document = world.with_proof(note, log=forged)
    assert both(document, world.policy()) == (False, "tlog_cosignature_quorum", "failed")
    # With no quorum the forged proof would pass: the witnesses are what catches it.
    assert both(document, world.policy(quorum=0))[0] is True


def test_a_deleted_leaf_cannot_be_proven(world):
    note = world.cosigned()
    document = world.with_proof(note)
    shorter = world.log.copy_without(world.index)
    shorter.append(b"filler")
    # The receipt's own proof against the new checkpoint: the leaf is not where the receipt says.
    other_note = shorter.checkpoint() + "".join(
        w.cosigner.cosign(shorter.checkpoint().split("\n\n")[0].encode() + b"\n", 1_800_000_000).line()
        for w in world.witnesses
    )
    stale = {**document, "transparency": {"leaf_index": world.index, "proof": shorter.proof(world.index, other_note)}}
    assert both(stale, world.policy()) == (False, "tlog_inclusion_failed", "failed")


def test_a_fork_shown_to_one_witness_only(world, tmp_path):
    """A fork that only one witness saw carries one cosignature: a quorum of two refuses it."""
    fork = world.log.copy_rewritten(world.index, _signed(world.receipt))
    fork.append(b"forked statement")
    first_witness_only = world.cosigned(fork, world.witnesses[:1])
    document = world.with_proof(first_witness_only, log=fork)
    assert both(document, world.policy(quorum=2)) == (False, "tlog_cosignature_quorum", "failed")
    assert both(document, world.policy(quorum=1)) == (True, None, "verified")


def test_a_checkpoint_signed_by_the_wrong_key(world):
    impostor = generate_signer(world.log.origin)
    note = world.log.checkpoint(signer=impostor)
    text = note.split("\n\n")[0] + "\n"
    cosigns = "".join(w.cosigner.cosign(text.encode(), 1_800_000_000).line() for w in world.witnesses)
    document = world.with_proof(note + cosigns)
    assert both(document, world.policy()) == (False, "tlog_checkpoint_not_signed_by_log", "failed")
    # The log's key name and id with a signature that fails: refused as a bad signature.
    genuine = world.cosigned()
    text, sigs = parse_note(genuine)
    from tollgate_client.tlog import NoteSignature

    broken = NoteSignature(sigs[0].name, sigs[0].key_id, bytes([sigs[0].signature[0] ^ 1]) + sigs[0].signature[1:])
    document = world.with_proof(format_note(text, [broken, *sigs[1:]]))
    assert both(document, world.policy()) == (False, "tlog_bad_checkpoint_signature", "failed")


def test_a_proof_from_another_tenants_log(world, tmp_path):
    other = World(tmp_path, tenant="spn_OtherTenant0000000000001")
    # The same two witnesses follow both tenants' logs.
    world.witnesses = other.witnesses = [
        Witness(
            cosigner=Cosigner(f"witness.test/both{n}", Ed25519PrivateKey.generate()),
            logs=[world.log.signer.verifier, other.log.signer.verifier],
            state_file=tmp_path / f"both{n}.json",
        )
        for n in (1, 2)
    ]
    # The other tenant's log holds the same statement bytes (copied there by the operator).
    document = other.with_proof(other.cosigned())
    # Trusting only this tenant's log: unknown log. Trusting both: refused as another tenant's log.
    assert both(document, world.policy()) == (False, "tlog_unknown_log", "failed")
    assert both(document, world.policy(logs=[world.log, other.log])) == (False, "tlog_other_tenant_log", "failed")


def test_tampered_proofs_and_cosignatures(world):
    note = world.cosigned()
    document = world.with_proof(note)
    lines = document["transparency"]["proof"].split("\n")
    lines[2] = base64.b64encode(bytes(32)).decode()  # the first path hash
    tampered = {**document, "transparency": {**document["transparency"], "proof": "\n".join(lines)}}
    assert both(tampered, world.policy()) == (False, "tlog_inclusion_failed", "failed")
    wrong_index = {**document, "transparency": {**document["transparency"], "leaf_index": world.index + 1}}
    assert both(wrong_index, world.policy()) == (False, "tlog_index_mismatch", "failed")
    other_leaf = world.with_proof(note, index=world.index + 1)
    other_leaf["transparency"]["leaf_index"] = world.index + 1
    assert both(other_leaf, world.policy()) == (False, "tlog_inclusion_failed", "failed")
    text, sigs = parse_note(note)
    bad = sigs[1]
    from tollgate_client.tlog import NoteSignature

    flipped = NoteSignature(
        bad.name, bad.key_id, bad.signature[:10] + bytes([bad.signature[10] ^ 1]) + bad.signature[11:]
    )
    document = world.with_proof(format_note(text, [sigs[0], flipped, sigs[2]]))
    assert both(document, world.policy()) == (False, "tlog_bad_cosignature", "failed")
    garbled = {**world.receipt, "transparency": {"leaf_index": 1, "proof": "not a proof"}}
    assert both(garbled, world.policy()) == (False, "tlog_malformed_proof", "failed")
    assert both({**world.receipt, "transparency": [1]}, world.policy()) == (
        False,
        "tlog_malformed_transparency",
        "failed",
    )


def test_policy_files_are_validated(world):
    good = {"format": POLICY_FORMAT, "logs": [str(world.log.signer.verifier)], "witnesses": [], "quorum": 0}
    Policy.from_json(good)
    for bad in (
        {**good, "format": "other"},
        {**good, "logs": []},
        {**good, "quorum": 1},
        {**good, "quorum": True},
        {**good, "witnesses": [str(world.log.signer.verifier)]},  # a note key is not a cosigner key
        {**good, "logs": [world.witnesses[0].verifier_key]},  # nor the reverse
        {**good, "logs": ["not a key"]},
    ):
        with pytest.raises(ValueError):
            Policy.from_json(bad)


@pytest.mark.parametrize("module", ["receipts.verify", "tollgate_client.verify"])
def test_command_lines_explain(world, tmp_path, module):
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {
                "format": POLICY_FORMAT,
                "logs": [str(world.log.signer.verifier)],
                "witnesses": [w.verifier_key for w in world.witnesses],
                "quorum": 2,
            }
        )
    )
    good, plain, bad = tmp_path / "good.json", tmp_path / "plain.json", tmp_path / "bad.json"
    good.write_text(json.dumps(world.with_proof(world.cosigned())))
    plain.write_text(json.dumps(world.receipt))
    bad.write_text(json.dumps(world.with_proof(world.cosigned(witnesses=world.witnesses[:1]))))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "client")} if module.startswith("tollgate_client") else None

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
        )

    done = run(str(good), "--policy", str(policy))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Inclusion VERIFIED" in done.stdout
    done = run(str(plain), "--policy", str(policy))
    assert done.returncode == 0
    assert "Inclusion was NOT checked" in done.stdout
    done = run(str(bad), "--policy", str(policy))
    assert done.returncode == 1
    assert "tlog_cosignature_quorum" in done.stderr
    assert "policy requires 2" in done.stderr
    policy.write_text("{}")
    assert run(str(good), "--policy", str(policy)).returncode == 2


def test_the_client_wrapper_carries_the_inclusion_verdict(world):
    """``verify_portable_offline`` (the reference verifier here, in a checkout) reports the inclusion too."""
    from tollgate_client.verify import verify_portable_offline

    verdict = verify_portable_offline(world.with_proof(world.cosigned()), None, world.policy())
    assert (verdict.valid, verdict.inclusion) == (True, "verified")
    assert verify_portable_offline(world.receipt).inclusion == "not_checked"
