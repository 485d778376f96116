"""The gateway's transparency log (docs/audit-chain.md, "The transparency log"): leaves, integration, serving.

Every signed statement becomes a pending leaf in its own INSERT; the integrator gives leaves their
index under the tenant's log lock, stores the hashes of complete subtrees and signs a checkpoint that
the client library verifies; the public endpoints serve checkpoints, proofs and tiles that the
library's verifiers accept.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
from decimal import Decimal

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from tollgate_client.tlog.policy import Policy, verify_transparency
from tollgate_client.verify import main as standalone_verify

from audit.chain_verification import audit_chain_verify
from common.canonical import canonical_bytes
from permits.models import PermitApproval, TenantApprover
from permits.services import permit_request_create, permit_request_decide
from receipts.verify import verify_portable
from tests import factories
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import setup_caller
from tests.test_receipts import make_receipt
from tlog.keys import key_file_path, log_verifiers, origin_of
from tlog.lib import checkpoint, merkle, note, tiles
from tlog.models import Leaf, Log, PendingLeaf
from tlog.services import chain_checkpoint_id, tlog_chain_checkpoint_append, tlog_integrate

pytestmark = pytest.mark.django_db


def governed_call(tenant: Tenant) -> str:
    """One successful governed call; its receipt id."""
    caller = setup_caller(tenant)
    body = caller.rpc("echo", {"text": "hi"}).json()
    assert "result" in body, body
    return str(body["result"]["_meta"]["io.tollgate/receipt-id"])


def rfc_root(hashes: list[bytes]) -> bytes:
    """MTH of RFC 9162 section 2.1.1, by its recursion (the reference the stored hashes must agree with)."""
    if len(hashes) == 1:
        return hashes[0]
    k = 1 << ((len(hashes) - 1).bit_length() - 1)
    return merkle.node_hash(rfc_root(hashes[:k]), rfc_root(hashes[k:]))


def leaves_of(tenant_id: str) -> list[bytes]:
    return [bytes(b) for b in Leaf.objects.filter(tenant_id=tenant_id).order_by("idx").values_list("leaf", flat=True)]


def test_a_governed_call_appends_pending_leaves_and_the_integrator_signs_a_checkpoint(fault, tenant):
    receipt_id = governed_call(tenant)
    tenant_id = tenant.sponsor.tenant_id
    pending = dict(PendingLeaf.objects.filter(tenant_id=tenant_id).values_list("statement_id", "kind"))
    assert pending[receipt_id] == "receipt"
    assert {"receipt", "permit", "audit_event"} <= set(pending.values())
    done = tlog_integrate(tenant_id=tenant_id)
    assert done is not None
    assert (done.old_size, done.size) == (0, len(pending))
    assert not PendingLeaf.objects.filter(tenant_id=tenant_id).exists()
    leaves = leaves_of(tenant_id)
    stored = {(lv, ix): bytes(h) for lv, ix, h in connection.cursor().execute(
        "SELECT level, idx, hash FROM tlog_tree_hash WHERE tenant_id = %s", [tenant_id]).fetchall()}  # fmt: skip
    log = Log.objects.get(tenant_id=tenant_id)
    expected_root = rfc_root([merkle.leaf_hash(leaf) for leaf in leaves])
    assert bytes(log.root_hash) == expected_root == merkle.tree_hash(log.size, lambda lv, ix: stored[(lv, ix)])
    text, signatures = note.parse_note(log.checkpoint)
    assert note.verified_signatures(text, signatures, log_verifiers(tenant_id)) == log_verifiers(tenant_id)
    body = checkpoint.Checkpoint.parse(text)
    assert (body.origin, body.size, body.root_hash) == (origin_of(tenant_id), len(leaves), expected_root)


def add_pending(tenant_id: str, count: int, *, prefix: str = "ckp") -> list[bytes]:
    """``count`` pending leaves that carry their own bytes (the audit-chain checkpoint's way)."""
    leaves = [f'{{"n":{i},"tenant":"{tenant_id}","p":"{prefix}"}}'.encode() for i in range(count)]
    PendingLeaf.objects.bulk_create(
        PendingLeaf(
            tenant_id=tenant_id,
            kind="audit_checkpoint",
            statement_id=f"{prefix}_{i}",
            leaf=leaf,
            created_at=timezone.now(),
        )
        for i, leaf in enumerate(leaves)
    )
    return leaves


def test_proofs_consistency_and_tiles_are_served_and_verify(anon_client, tenant):
    tenant_id = tenant.sponsor.tenant_id
    first = add_pending(tenant_id, 300, prefix="a")
    assert anon_client.get(f"/tlog/{tenant_id}/proof/a_7").status_code == 202
    tlog_integrate(tenant_id=tenant_id)
    old_note = anon_client.get(f"/tlog/{tenant_id}/checkpoint").content.decode()
    second = add_pending(tenant_id, 213, prefix="b")
    tlog_integrate(tenant_id=tenant_id)
    leaves = [*[bytes(b) for b in leaves_of(tenant_id)]]
    # Audit events of the fixtures come first; the added leaves follow in order.
    assert leaves[-513:] == first + second

    r = anon_client.get(f"/tlog/{tenant_id}/checkpoint")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain")
    assert r["ETag"]
    assert anon_client.get(f"/tlog/{tenant_id}/checkpoint", HTTP_IF_NONE_MATCH=r["ETag"]).status_code == 304
    text, signatures = note.parse_note(r.content.decode())
    assert note.verified_signatures(text, signatures, log_verifiers(tenant_id))
    head = checkpoint.Checkpoint.parse(text)
    assert head.size == len(leaves)
    assert head.root_hash == rfc_root([merkle.leaf_hash(leaf) for leaf in leaves])

    # The published key: the verifier string of this log and the key listing beside the JWKS.
    key_line = anon_client.get(f"/tlog/{tenant_id}/key").content.decode().splitlines()[0]
    assert note.Verifier.parse(key_line) == log_verifiers(tenant_id)[0]
    assert key_line.startswith(origin_of(tenant_id) + "+")
    keys = anon_client.get("/.well-known/tlog-keys").json()
    assert keys["keys"][0]["public_key"] == note.b64encode(log_verifiers(tenant_id)[0].public_key)
    # The private key stays in its owner-only file: never in what is served.
    assert stat.S_IMODE(os.stat(key_file_path()).st_mode) == 0o600
    seed = json.loads(key_file_path().read_text())["private_key"]
    served = [anon_client.get(f"/tlog/{tenant_id}/{p}").content.decode() for p in ("key", "checkpoint")]
    assert not any(seed in text for text in [*served, json.dumps(keys)])

    # An inclusion proof for a leaf, under the latest checkpoint.
    index = leaves.index(first[7])
    proof = checkpoint.TlogProof.parse(anon_client.get(f"/tlog/{tenant_id}/proof/a_7").content.decode())
    assert proof.index == index
    merkle.verify_inclusion(index, head.size, merkle.leaf_hash(first[7]), proof.path, head.root_hash)

    # Consistency from the older checkpoint to the latest.
    old = checkpoint.Checkpoint.from_note(old_note)
    r = anon_client.get(f"/tlog/{tenant_id}/consistency", {"old": old.size, "new": head.size})
    path = [note.b64decode_strict(line) for line in r.content.decode().splitlines()]
    merkle.verify_consistency(old.size, head.size, path, old.root_hash, head.root_hash)
    assert anon_client.get(f"/tlog/{tenant_id}/consistency", {"old": 0, "new": 1}).status_code == 422
    assert anon_client.get(f"/tlog/{tenant_id}/consistency", {"old": 1, "new": head.size + 1}).status_code == 422

    # Tiles: a monitor rebuilds the tree from them alone; full tiles are immutable.
    def fetch(level: int, index: int, width: int) -> bytes:
        response = anon_client.get(f"/tlog/{tenant_id}/{tiles.tile_path(level, index, width)}")
        assert response.status_code == 200, response.content
        if width == tiles.TILE_WIDTH:
            assert response["Cache-Control"] == "public, max-age=31536000, immutable"
        return bytes(response.content)

    assert merkle.tree_hash(head.size, tiles.hash_reader_from_tiles(head.size, fetch)) == head.root_hash
    bundle = tenant.sponsor_client.get(f"/tlog/{tenant_id}/{tiles.tile_path('entries', 0)}")
    assert bundle["Cache-Control"] == "private, max-age=31536000, immutable"
    assert tiles.parse_entry_bundle(bundle.content) == leaves[:256]
    assert anon_client.get(f"/tlog/{tenant_id}/{tiles.tile_path(0, 9)}").status_code == 404
    assert anon_client.get(f"/tlog/{tenant_id}/{tiles.tile_path(0, 2, 255)}").status_code == 404
    assert anon_client.get(f"/tlog/{tenant_id}/tile/0/002.p/0255").status_code == 404


def test_entry_bundles_are_served_to_the_tenant_and_the_operator_only(
    anon_client, tenant, other_tenant, operator_client
):
    """An entry bundle holds the leaves themselves (audit events, reasons, ids): it is the tenant's. Anyone
    else, anonymous or another tenant's key, is told 404 as for a log that does not exist; hash tiles,
    checkpoints and proofs stay public (docs/decisions.md, Evidence, "Who may read a log")."""
    tenant_id = tenant.sponsor.tenant_id
    leaves = add_pending(tenant_id, 3)
    tlog_integrate(tenant_id=tenant_id)
    size = Log.objects.get(tenant_id=tenant_id).size
    entries = f"/tlog/{tenant_id}/{tiles.tile_path('entries', 0, size)}"
    nowhere = f"/tlog/nobody/{tiles.tile_path('entries', 0, size)}"
    for outsider in (anon_client, other_tenant.sponsor_client, other_tenant.agent_client):
        for path in (entries, nowhere):
            r = outsider.get(path)
            assert r.status_code == 404, (path, r.content)
            assert r.json()["detail"] == {"error": "not_found", "message": "No such tile in this log (yet)."}
    assert client_for("tg_not_a_key").get(entries).status_code == 401
    for reader in (tenant.sponsor_client, tenant.agent_client, operator_client):
        r = reader.get(entries)
        assert r.status_code == 200, r.content
        assert r["Cache-Control"] == "private, max-age=3600"
        assert tiles.parse_entry_bundle(r.content)[-3:] == leaves
    # What carries hashes only stays public.
    r = anon_client.get(f"/tlog/{tenant_id}/{tiles.tile_path(0, 0, size)}")
    assert (r.status_code, r["Cache-Control"]) == (200, "public, max-age=3600")
    assert anon_client.get(f"/tlog/{tenant_id}/checkpoint").status_code == 200
    assert anon_client.get(f"/tlog/{tenant_id}/proof/ckp_1").status_code == 200


def test_the_key_of_a_tenant_without_a_log_is_404(anon_client, tenant):
    r = anon_client.get("/tlog/nobody/key")
    assert (r.status_code, r.json()["detail"]["error"]) == (404, "not_found")
    add_pending(tenant.sponsor.tenant_id, 1)
    tlog_integrate(tenant_id=tenant.sponsor.tenant_id)
    assert anon_client.get(f"/tlog/{tenant.sponsor.tenant_id}/key").status_code == 200


def test_a_proof_for_an_unknown_id_finds_the_pending_table_by_index(anon_client, tenant):
    """The lookup of a pending statement is one index probe on (tenant, statement id), never a walk of
    the tenant's pending rows filtered by id (a backlog makes that a scan per anonymous request)."""
    tenant_id = tenant.sponsor.tenant_id
    add_pending(tenant_id, 50)
    with CaptureQueriesContext(connection) as queries:
        assert anon_client.get(f"/tlog/{tenant_id}/proof/rcpt_unknown").status_code == 404
    pending = [q["sql"] for q in queries.captured_queries if "tlog_pending_leaf" in q["sql"]]
    assert len(pending) == 1, pending
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a few rows: make the planner show its index
        cursor.execute("EXPLAIN " + pending[0])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "tlog_pending_statement" in plan, plan
    assert "Filter" not in plan, plan


def test_a_pending_leaf_whose_statement_is_missing_is_skipped_not_blocking(tenant, caplog):
    """A pending receipt whose row is gone (or is another tenant's now) can never be read: it is kept
    out of the tree, logged at error with its ids, and the leaves after it are integrated."""
    tenant_id = tenant.sponsor.tenant_id
    before = add_pending(tenant_id, 2, prefix="x")
    PendingLeaf.objects.create(
        tenant_id=tenant_id, kind="receipt", statement_id="rcpt_gone", leaf=None, created_at=timezone.now()
    )
    after = add_pending(tenant_id, 2, prefix="y")
    with caplog.at_level("ERROR", logger="tollgate.tlog"):
        done = tlog_integrate(tenant_id=tenant_id)
    assert done is not None
    leaves = [bytes(b) for b in leaves_of(tenant_id)]
    assert leaves[-4:] == before + after
    assert not Leaf.objects.filter(statement_id="rcpt_gone").exists()
    assert not PendingLeaf.objects.filter(tenant_id=tenant_id).exists()
    assert any("rcpt_gone" in r.getMessage() and tenant_id in r.getMessage() for r in caplog.records)
    # The log goes on: the next statement is integrated too.
    later = add_pending(tenant_id, 1, prefix="z")
    tlog_integrate(tenant_id=tenant_id)
    assert [bytes(b) for b in leaves_of(tenant_id)][-1:] == later


def test_a_statement_is_proven_only_in_its_own_tenants_log(anon_client, tenant, other_tenant):
    add_pending(tenant.sponsor.tenant_id, 3)
    add_pending(other_tenant.sponsor.tenant_id, 3, prefix="o")
    tlog_integrate(tenant_id=tenant.sponsor.tenant_id)
    tlog_integrate(tenant_id=other_tenant.sponsor.tenant_id)
    assert anon_client.get(f"/tlog/{tenant.sponsor.tenant_id}/proof/ckp_1").status_code == 200
    r = anon_client.get(f"/tlog/{other_tenant.sponsor.tenant_id}/proof/ckp_1")
    assert r.status_code == 404
    assert r.json()["detail"] == {"error": "not_found", "message": "No statement with this id in this log."}
    r = anon_client.get("/tlog/nobody/checkpoint")
    assert (r.status_code, r.json()["detail"]["message"]) == (404, "No such log, or it has no checkpoint yet.")


def test_a_real_call_is_verified_end_to_end_by_tollgate_verify(fault, tenant, tmp_path, capsys):
    receipt_id = governed_call(tenant)
    tenant_id = tenant.sponsor.tenant_id
    client = tenant.agent_client
    before = client.get(f"/v1/receipts/{receipt_id}/portable").json()
    assert before["transparency"] == {
        "status": "pending",
        "fetch": f"http://testserver/tlog/{tenant_id}/proof/{receipt_id}".replace(
            "http://testserver", settings.PUBLIC_BASE_URL.rstrip("/")
        ),
    }
    assert client.get(f"/v1/evidence/{receipt_id}").json()["transparency"]["status"] == "pending"
    tlog_integrate(tenant_id=tenant_id)
    portable = client.get(f"/v1/receipts/{receipt_id}/portable").json()
    assert set(portable["transparency"]) == {"leaf_index", "proof"}
    assert client.get(f"/v1/evidence/{receipt_id}").json()["transparency"] == portable["transparency"]
    policy = {"format": "tollgate.tlog-policy/v1", "logs": [str(log_verifiers(tenant_id)[0])], "require_proof": True}
    (tmp_path / "portable.json").write_text(json.dumps(portable))
    (tmp_path / "policy.json").write_text(json.dumps(policy))
    (tmp_path / "jwks.json").write_text(json.dumps(client.get("/.well-known/jwks.json").json()))
    argv = [
        str(tmp_path / "portable.json"),
        "--keys",
        str(tmp_path / "jwks.json"),
        "--policy",
        str(tmp_path / "policy.json"),
    ]
    assert standalone_verify(argv) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert '"inclusion": "verified"' in out
    assert f"Inclusion VERIFIED: in {origin_of(tenant_id)} at index {portable['transparency']['leaf_index']}" in out
    assert verify_portable(portable, None, Policy.from_json(policy)).inclusion == "verified"


def test_a_recorded_chain_checkpoint_is_a_leaf_once_and_an_evidence_read_adds_none(anon_client, tenant):
    tenant_id = tenant.sponsor.tenant_id
    r = tenant.sponsor_client.post("/v1/audit/verify-chain", {}, format="json")
    assert r.status_code == 200, r.content
    signed = dict(r.json()["checkpoint"])
    signed.pop("signature")
    canonical = canonical_bytes(signed)
    statement_id = chain_checkpoint_id(canonical)
    assert PendingLeaf.objects.get(tenant_id=tenant_id, statement_id=statement_id).kind == "audit_checkpoint"
    tlog_chain_checkpoint_append(tenant_id, canonical)  # the same checkpoint recorded twice
    tlog_chain_checkpoint_append("system", canonical)  # the system chain has no tenant log
    assert not PendingLeaf.objects.filter(tenant_id="system").exists()
    tlog_integrate(tenant_id=tenant_id)
    assert Leaf.objects.filter(tenant_id=tenant_id, statement_id=statement_id).count() == 1
    assert not PendingLeaf.objects.filter(tenant_id=tenant_id).exists()
    proof = checkpoint.TlogProof.parse(anon_client.get(f"/tlog/{tenant_id}/proof/{statement_id}").content.decode())
    head = checkpoint.Checkpoint.from_note(Log.objects.get(tenant_id=tenant_id).checkpoint)
    merkle.verify_inclusion(proof.index, head.size, merkle.leaf_hash(canonical), proof.path, head.root_hash)
    # Reading evidence verifies the chain and signs a checkpoint too, but only recorded ones are logged.
    audit_chain_verify(chain=tenant_id)
    assert not PendingLeaf.objects.filter(tenant_id=tenant_id).exists()


@pytest.mark.django_db(transaction=True)  # the worker loop closes old connections first
def test_the_command_integrates_every_tenant_once(tenant, other_tenant):
    previous = signal.getsignal(signal.SIGTERM)
    add_pending(tenant.sponsor.tenant_id, 3)
    add_pending(other_tenant.sponsor.tenant_id, 2)
    out = io.StringIO()
    try:
        call_command("tlog_integrate", "--once", stdout=out)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert out.getvalue().startswith("integrated ")
    assert not PendingLeaf.objects.exists()
    assert Log.objects.filter(tenant_id__in=[tenant.sponsor.tenant_id, other_tenant.sponsor.tenant_id]).count() == 2


def test_a_new_kind_is_one_trigger_line(tenant):
    """A statement table the trigger function does not name (as the approval decision's) needs only its
    trigger: the id is read from the row generically, and a row without a tenant is no leaf."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE decisions (approval_id text, tenant_id text)")
        cursor.execute(
            "CREATE TRIGGER tlog_leaf_decision AFTER INSERT ON decisions "
            "FOR EACH ROW EXECUTE FUNCTION tlog_leaf_pending('approval_decision', 'approval_id')"
        )
        cursor.execute("INSERT INTO decisions VALUES ('apr_1', %s), ('apr_2', NULL)", [tenant.sponsor.tenant_id])
    found = PendingLeaf.objects.filter(kind="approval_decision").values_list("tenant_id", "statement_id")
    assert list(found) == [(tenant.sponsor.tenant_id, "apr_1")]


def test_an_approval_decision_is_a_leaf_whose_inclusion_proof_verifies(tenant, anon_client):
    """A person's signed decision (approve or reject) is a pending leaf of its tenant's log in its own INSERT;
    integrated, its proof leads from its signed bytes to the signed checkpoint, and the evidence bundle of a
    receipt under the approved permit carries the approval's transparency."""
    tenant_id = tenant.sponsor.tenant_id
    permit = factories.approved_permit(tenant.agent, allowed_tools=["demo.echo"])
    approval = PermitApproval.objects.get(permit_id=permit.permit_id)
    pending = PendingLeaf.objects.filter(kind="permit_approval").values_list("tenant_id", "statement_id")
    assert list(pending) == [(tenant_id, approval.approval_id)]
    receipt = make_receipt(tenant, permit=permit)
    body = tenant.agent_client.get(f"/v1/evidence/{receipt.receipt_id}").json()
    assert body["approval"]["transparency"]["status"] == "pending"

    tlog_integrate(tenant_id=tenant_id)
    leaf = Leaf.objects.get(tenant_id=tenant_id, statement_id=approval.approval_id)
    assert (leaf.kind, bytes(leaf.leaf)) == ("permit_approval", canonical_bytes(approval.signed_statement))
    body = tenant.agent_client.get(f"/v1/evidence/{receipt.receipt_id}").json()
    transparency = body["approval"]["transparency"]
    assert transparency["leaf_index"] == leaf.idx
    policy = Policy.from_json(
        {"format": "tollgate.tlog-policy/v1", "logs": [str(v) for v in log_verifiers(tenant_id)], "quorum": 0}
    )
    verdict = verify_transparency(transparency, canonical_bytes(approval.signed_statement), policy, tenant=tenant_id)
    assert verdict.status == "verified", verdict
    # The proof is of this statement only: another statement's bytes do not lead to the root.
    other = verify_transparency(transparency, canonical_bytes(permit.signed_statement), policy, tenant=tenant_id)
    assert other.status != "verified"
    # The served proof is the same.
    assert anon_client.get(f"/tlog/{tenant_id}/proof/{approval.approval_id}").status_code == 200


def test_a_rejection_is_a_leaf_too(tenant):
    tenant_id = tenant.sponsor.tenant_id
    approver = get_user_model().objects.create_user("rejecter")
    TenantApprover.objects.create(user=approver, tenant_id=tenant_id)
    preq = permit_request_create(
        wallet=tenant.agent, requested_by_key_id="", allowed_tools=["demo.echo"], max_credits=Decimal(5),
        max_calls=None, permit_ttl_seconds=3600, subject_key_id=None, justification="",
        idempotency_scope="test:reject", idempotency_key="k1", request_hash="k1",
    ).permit_request  # fmt: skip
    permit_request_decide(request_id=preq.request_id, user=approver, approve=False)
    approval = PermitApproval.objects.get(decision="rejected")
    tlog_integrate(tenant_id=tenant_id)
    leaf = Leaf.objects.get(tenant_id=tenant_id, statement_id=approval.approval_id)
    assert (leaf.kind, bytes(leaf.leaf)) == ("permit_approval", canonical_bytes(approval.signed_statement))
