"""The verifier's trust policy and the check of a portable receipt's ``transparency`` member.

Policy file (JSON, ``tollgate.tlog-policy/v1``)::

    {
      "format": "tollgate.tlog-policy/v1",
      "logs": ["gw.example/tlog/spn_X+1a2b3c4d+AR..."],      # log note keys; the key name is the origin,
                                                             # or {"origin": "...", "key": "<note key>"}
      "witnesses": ["witness.example/w1+5e6f7a8b+BA..."],    # cosignature/v1 keys (type 0x04)
      "quorum": 1,                                           # valid cosignatures required
      "require_proof": false                                 # a receipt without a proof is then invalid
    }

The ``transparency`` member of a portable receipt is either
``{"leaf_index": N, "proof": "<tlog-proof@v1 text>"}`` or ``{"status": "pending", "fetch": "<url>"}``
(the statement is not in a checkpoint yet). The leaf is the statement's signed bytes themselves: the
leaf hash is ``SHA-256(0x00 || signed_bytes)`` (docs/decisions.md, Evidence).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tollgate_client.tlog.checkpoint import Checkpoint, TlogProof, tenant_of_origin
from tollgate_client.tlog.merkle import ProofError, leaf_hash, verify_inclusion
from tollgate_client.tlog.note import ALG_COSIGNATURE_V1, ALG_ED25519, NoteError, Verifier, parse_note

__all__ = [
    "POLICY_FORMAT",
    "Policy",
    "TransparencyVerdict",
    "parse_log_key",
    "verify_checkpoint_note",
    "verify_transparency",
]

POLICY_FORMAT = "tollgate.tlog-policy/v1"


def parse_log_key(entry: Any) -> tuple[str, Verifier]:
    """``(origin, note key)`` of a followed log: a note verifier string (the origin is the key's name)
    or ``{"origin": ..., "key": <note verifier string>}``; ``ValueError`` when it is neither."""
    if isinstance(entry, Mapping):
        origin, key = entry.get("origin"), entry.get("key")
        if not isinstance(origin, str) or not origin or "\n" in origin:
            raise ValueError("a log's 'origin' is one non-empty line")
    else:
        origin, key = None, entry
    if not isinstance(key, str):
        raise ValueError("a log key is a note verifier string")
    try:
        verifier = Verifier.parse(key)
    except NoteError as exc:
        raise ValueError(f"a log key: {exc}") from exc
    if verifier.alg != ALG_ED25519:
        raise ValueError("a log key is an Ed25519 note key (type 0x01)")
    return origin or verifier.name, verifier


@dataclass(frozen=True)
class Policy:
    """Trusted log keys (with their origins), trusted witness keys and the cosignature quorum."""

    logs: tuple[tuple[str, Verifier], ...]
    witnesses: tuple[Verifier, ...] = ()
    quorum: int = 0
    require_proof: bool = False

    @classmethod
    def from_json(cls, document: Any) -> Policy:
        """Parse a policy document; ``ValueError`` names what is wrong."""
        if not isinstance(document, Mapping) or document.get("format") != POLICY_FORMAT:
            raise ValueError(f"not a {POLICY_FORMAT} document")
        logs, witnesses = document.get("logs"), document.get("witnesses", [])
        quorum, require = document.get("quorum", 0), document.get("require_proof", False)
        if not isinstance(logs, list) or not logs or not isinstance(witnesses, list):
            raise ValueError("'logs' is a non-empty list of note keys and 'witnesses' a list of cosigner keys")
        if not isinstance(quorum, int) or isinstance(quorum, bool) or not 0 <= quorum <= len(witnesses):
            raise ValueError("'quorum' is a whole number between 0 and the number of witnesses")
        if not isinstance(require, bool):
            raise ValueError("'require_proof' is true or false")
        log_keys = tuple(parse_log_key(k) for k in logs)
        try:
            witness_keys = tuple(Verifier.parse(k) for k in witnesses)
        except NoteError as exc:
            raise ValueError(str(exc)) from exc
        if any(k.alg != ALG_COSIGNATURE_V1 for k in witness_keys):
            raise ValueError("a witness key is a cosignature/v1 key (type 0x04)")
        return cls(log_keys, witness_keys, quorum, require)


@dataclass(frozen=True)
class TransparencyVerdict:
    """What the transparency check found.

    ``status``: ``verified`` (inclusion proven under a trusted, quorum-cosigned checkpoint),
    ``not_checked`` (no proof, or no policy to check it against), ``pending`` (the gateway has not
    logged it yet) or ``failed`` (then ``reason`` names why and ``detail`` explains).
    """

    status: str
    reason: str | None = None
    detail: str = ""
    origin: str | None = None
    tree_size: int | None = None
    leaf_index: int | None = None
    cosigners: tuple[str, ...] = field(default=())

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def _fail(reason: str, detail: str, **extra: Any) -> TransparencyVerdict:
    return TransparencyVerdict("failed", reason, detail, **extra)


def verify_checkpoint_note(note: str, policy: Policy) -> tuple[Checkpoint, tuple[str, ...]] | TransparencyVerdict:
    """The checkpoint of ``note`` and the witnesses that cosigned it, if it meets ``policy``; else a failure."""
    try:
        text, signatures = parse_note(note)
        checkpoint = Checkpoint.parse(text)
    except NoteError as exc:
        return _fail("tlog_malformed_checkpoint", str(exc))
    log_keys = [key for origin, key in policy.logs if origin == checkpoint.origin]
    if not log_keys:
        return _fail(
            "tlog_unknown_log", f"the checkpoint's origin {checkpoint.origin!r} is not a log the policy trusts"
        )
    data = text.encode("utf-8")
    # The log's own signature: a line under a trusted key's name and id must verify, and one must exist.
    signed_by_log = False
    for sig in signatures:
        for key in log_keys:
            if key.matches(sig):
                if not key.verify(data, sig):
                    return _fail("tlog_bad_checkpoint_signature", "the log's signature on the checkpoint fails")
                signed_by_log = True
    if not signed_by_log:
        return _fail(
            "tlog_checkpoint_not_signed_by_log",
            f"no signature of a trusted key of {checkpoint.origin!r} on the checkpoint (signed by another key?)",
        )
    cosigners: list[str] = []
    for sig in signatures:
        for key in policy.witnesses:
            if key.matches(sig):
                if not key.verify(data, sig):
                    return _fail("tlog_bad_cosignature", f"the cosignature of witness {key.name} does not verify")
                if key.name not in cosigners:
                    cosigners.append(key.name)
    if len(cosigners) < policy.quorum:
        return _fail(
            "tlog_cosignature_quorum",
            f"{len(cosigners)} trusted witness cosignature(s), the policy requires {policy.quorum}",
            origin=checkpoint.origin,
            tree_size=checkpoint.size,
            cosigners=tuple(cosigners),
        )
    return checkpoint, tuple(cosigners)


def verify_transparency(
    transparency: Any, signed_bytes: bytes, policy: Policy | None, *, tenant: str | None = None
) -> TransparencyVerdict:
    """Check a portable receipt's ``transparency`` member against ``policy``.

    The inclusion proof must lead from ``SHA-256(0x00 || signed_bytes)`` at the stated index to the
    root of a checkpoint signed by a trusted key of its origin and cosigned by ``policy.quorum``
    trusted witnesses. When ``tenant`` is given (the statement's ``tenant_id``), the origin must be
    that tenant's log: a proof from another tenant's log is refused even if that log is trusted.
    """
    if transparency is None:
        if policy is not None and policy.require_proof:
            return _fail("tlog_proof_missing", "the policy requires an inclusion proof and the receipt carries none")
        return TransparencyVerdict("not_checked", "no_proof", "the receipt carries no inclusion proof")
    if not isinstance(transparency, Mapping):
        return _fail("tlog_malformed_transparency", "the transparency member is not an object")
    if transparency.get("status") == "pending":
        if policy is not None and policy.require_proof:
            return _fail("tlog_proof_pending", "the statement is not in a checkpoint yet; fetch the proof later")
        fetch = transparency.get("fetch")
        return TransparencyVerdict("pending", "pending", f"not logged yet; the proof will be at {fetch}")
    proof_text, leaf_index = transparency.get("proof"), transparency.get("leaf_index")
    if not isinstance(proof_text, str) or not isinstance(leaf_index, int) or isinstance(leaf_index, bool):
        return _fail("tlog_malformed_transparency", "expected {'leaf_index': int, 'proof': '<tlog-proof@v1>'}")
    if policy is None:
        return TransparencyVerdict(
            "not_checked", "no_policy", "an inclusion proof is present but no policy names the keys to trust"
        )
    try:
        proof = TlogProof.parse(proof_text)
    except NoteError as exc:
        return _fail("tlog_malformed_proof", str(exc))
    if proof.index != leaf_index:
        return _fail("tlog_index_mismatch", f"the proof is for index {proof.index}, the receipt says {leaf_index}")
    checked = verify_checkpoint_note(proof.checkpoint_note, policy)
    if isinstance(checked, TransparencyVerdict):
        return checked
    checkpoint, cosigners = checked
    where: dict[str, Any] = {"origin": checkpoint.origin, "tree_size": checkpoint.size, "leaf_index": leaf_index}
    if tenant is not None and tenant_of_origin(checkpoint.origin) != tenant:
        return _fail(
            "tlog_other_tenant_log",
            f"the proof is from the log {checkpoint.origin!r}, not the log of tenant {tenant!r}",
            **where,
        )
    try:
        verify_inclusion(leaf_index, checkpoint.size, leaf_hash(signed_bytes), proof.path, checkpoint.root_hash)
    except ProofError as exc:
        return _fail("tlog_inclusion_failed", f"{exc} ({exc.reason})", **where)
    return TransparencyVerdict(
        "verified",
        None,
        f"in {checkpoint.origin} at index {leaf_index} of {checkpoint.size}",
        cosigners=cosigners,
        **where,
    )
