"""Receipts, evidence bundles, portable export, offline verification and refund reconciliation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from django.test import Client

from audit.evidence_core import chain_hash
from audit.models import AuditEvent, ChainHead
from audit.services import signing_key_rotate
from billing.models import LedgerEntry, Wallet
from billing.services import ledger_debit, ledger_refund, tool_price_set
from common.canonical import event_bytes, iso_utc
from common.ids import new_id
from mcpgateway.services import tools_sync
from permits import services as permit_services
from permits.models import Permit
from receipts.models import Receipt, ReconciliationResult, RefundReconciliation
from receipts.selectors import request_document_hash
from receipts.services import receipt_issue, refund_reconciliation_mark_not_executed, refund_reconciliation_open
from receipts.verify import verify_portable
from tests import factories
from tests.conftest import make_tenant
from tests.gateway_helpers import setup_caller
from tests.upstream_server import FaultUpstream

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent


def make_receipt(tenant, *, outcome="success", price="2", charged=True, tool="demo.echo", owed=False, permit=None):
    """A receipt of a call of the agent under ``permit`` (default: one its sponsor issues for ``tool``)."""
    factories.top_up(tenant.agent, 10)
    if permit is None:
        permit = Permit.objects.get(
            permit_id=tenant.sponsor_client.post(
                "/v1/permits",
                {"wallet_id": tenant.agent.wallet_id, "allowed_tools": [tool], "max_credits": "50"},
                format="json",
                HTTP_IDEMPOTENCY_KEY=new_id("idem"),
            ).json()["permit_id"]
        )
    document = {"tool": tool, "arguments": {"text": "hello"}}
    with transaction.atomic():
        permit_services.permit_reserve(permit=permit, amount=Decimal(price))
        entry = ledger_debit(wallet=tenant.agent.wallet_id, amount=Decimal(price), service_category="tooling").entry
        receipt = receipt_issue(
            action_id=new_id("act"),
            wallet=Wallet.objects.get(pk=tenant.agent.pk),
            api_key_id=tenant.agent_key_id,
            tool=tool,
            outcome=outcome,
            request_document=document,
            request_hash=request_document_hash(document),
            response_hash="ab" * 32,
            credits_authorized=Decimal(price),
            credits_charged=Decimal(price) if charged else Decimal(0),
            permit=permit,
            ledger_entry=entry,
            policy_decision_id=new_id("pdec"),
            endpoint="/mcp",
        )
        if owed:
            refund_reconciliation_open(receipt=receipt, amount=Decimal(price), origin="failed_unrefunded")
    return receipt


def test_receipt_endpoints(tenant, other_tenant):
    r = make_receipt(tenant)
    c = tenant.agent_client
    body = c.get(f"/v1/receipts/{r.receipt_id}").json()
    assert body["outcome"] == "success"
    assert body["credits_charged"] == "2.00000000"
    assert body["signed_statement"]["type"] == "receipt"
    assert body["signed_statement"]["audit_event_id"] == body["audit_event_id"]
    assert c.get("/v1/receipts").json()["total"] == 1
    assert c.get("/v1/receipts?outcome=tool_error").json()["total"] == 0
    assert c.get("/v1/receipts?outcome=bogus").status_code == 422
    assert c.get(f"/v1/receipts/permit/{r.permit_id}").json()["total"] == 1
    assert c.get(f"/v1/permits/{r.permit_id}/receipts").json()["total"] == 1
    assert c.get("/v1/me/receipts").json()["total"] == 1
    assert tenant.sponsor_client.get("/v1/me/receipts").json()["total"] == 0
    assert tenant.sponsor_client.get("/v1/receipts").json()["total"] == 1  # descendants are visible
    # Another tenant sees nothing.
    o = other_tenant.sponsor_client
    assert o.get(f"/v1/receipts/{r.receipt_id}").status_code == 404
    assert o.get(f"/v1/evidence/{r.receipt_id}").status_code == 404
    assert o.get(f"/v1/receipts/{r.receipt_id}/portable").status_code == 404
    assert o.get(f"/v1/receipts/permit/{r.permit_id}").status_code == 404
    assert o.get("/v1/receipts").json()["total"] == 0
    assert (
        o.post("/v1/receipts/verify", {"receipt_id": r.receipt_id}, format="json").json()["reason"] == "unknown_receipt"
    )
    # The audit event names the receipt.
    event = AuditEvent.objects.get(event_id=r.audit_event_id)
    assert event.detail["receipt_id"] == r.receipt_id
    assert event.event == "tool_call.success"


def test_evidence_bundle_all_checks_pass(tenant):
    r = make_receipt(tenant)
    for path in (f"/v1/evidence/{r.receipt_id}", f"/v1/receipts/{r.receipt_id}/evidence"):
        body = tenant.agent_client.get(path).json()
        assert body["verification"] == {
            "receipt_signature": "ok",
            "permit_signature": "ok",
            "permit_approval": "skipped",
            "audit_chain": "ok",
            "request_hash": "ok",
        }
        assert body["verified"] is True
        assert body["ledger_entry"]["entry_id"] == r.ledger_entry_id
        assert body["ledger_entry"]["amount"] == "-2.00000000"
        assert body["audit_event"]["event_id"] == r.audit_event_id
        assert body["permit"]["permit_id"] == r.permit_id
        assert "not proof of the downstream effect" in body["claim_boundary"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("outcome", "tool_error"),
        ("credits_charged", "0.00000000"),
        ("tool", "other.tool"),
        ("ledger_entry_id", "led_forged"),
        ("wallet_id", "agt_forged"),
        ("request_hash", "00" * 32),
    ],
)
def test_altered_receipt_fails_verify_and_evidence_names_the_check(tenant, field, value):
    r = make_receipt(tenant)
    forged = dict(r.signed_statement, **{field: value})
    v = tenant.agent_client.post("/v1/receipts/verify", {"receipt": forged, "signature": r.signature}, format="json")
    assert v.json()["valid"] is False
    assert v.json()["reason"] == "bad_signature"
    # Tamper with the stored receipt itself: the evidence map names the failing check.
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE receipts_receipt SET signed_statement = %s WHERE receipt_id = %s",
            [json.dumps(forged), r.receipt_id],
        )
    checks = tenant.agent_client.get(f"/v1/evidence/{r.receipt_id}").json()["verification"]
    assert checks["receipt_signature"] == "bad_signature"
    assert checks["permit_signature"] == "ok"


def test_verify_refuses_an_id_given_beside_a_document_that_signs_another(tenant):
    """The id beside the document is unsigned: it must name the receipt the document signs."""
    r = make_receipt(tenant)
    body = {"receipt": r.signed_statement, "signature": r.signature}
    ok = tenant.agent_client.post("/v1/receipts/verify", {**body, "receipt_id": r.receipt_id}, format="json").json()
    assert (ok["valid"], ok["reason"]) == (True, None)
    other = tenant.agent_client.post(
        "/v1/receipts/verify", {**body, "receipt_id": "rcpt_someoneelse"}, format="json"
    ).json()
    assert (other["valid"], other["reason"], other["receipt_id"]) == (
        False,
        "receipt_id_differs_from_signed_bytes",
        r.receipt_id,
    )


def make_refunded_receipt(tenant):
    """A ``failed_refunded`` receipt as phase 3 writes one: the charge, its refund, credits charged 0."""
    factories.top_up(tenant.agent, 10)
    document = {"tool": "demo.echo", "arguments": {"text": "hello"}}
    with transaction.atomic():
        charge = ledger_debit(wallet=tenant.agent.wallet_id, amount=Decimal(2), service_category="tooling").entry
        refund = ledger_refund(amount=Decimal(2), charge=charge, description="refund: demo.echo did not run")
        return receipt_issue(
            action_id=new_id("act"),
            wallet=Wallet.objects.get(pk=tenant.agent.pk),
            api_key_id=tenant.agent_key_id,
            tool="demo.echo",
            outcome="failed_refunded",
            request_document=document,
            request_hash=request_document_hash(document),
            credits_authorized=Decimal(2),
            credits_charged=Decimal(0),
            ledger_entry=charge,
            refund_entry=refund,
            endpoint="/mcp",
        )


@pytest.mark.parametrize(
    ("entry", "column", "value"),
    [
        ("ledger_entry", "amount", "-1.00000000"),
        ("ledger_entry", "wallet_id", None),  # another wallet of the tenant
        ("ledger_entry", "kind", "fund"),
        ("refund_entry", "amount", "1.00000000"),
        ("refund_entry", "wallet_id", None),
    ],
)
def test_evidence_catches_a_ledger_entry_that_disagrees_with_the_receipt(tenant, entry, column, value):
    """The ledger entries served beside the receipt must be the ones it signed for: the charge of the
    price authorized and the refund of what was not charged, both of the receipt's wallet."""
    r = make_refunded_receipt(tenant)
    assert tenant.agent_client.get(f"/v1/evidence/{r.receipt_id}").json()["verified"] is True
    if value is None:
        value = factories.make_wallet(tenant.sponsor, "other").wallet_id
    with connection.cursor() as cur:
        # Ledger entries are immutable: tampering needs the trigger out of the way, as DDL rights would.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the ledger's balance checks, pending since the writes
        cur.execute("ALTER TABLE billing_ledger_entry DISABLE TRIGGER billing_ledger_entry_immutable")
        columns = [column, "account"] if column == "wallet_id" else [column]  # a wallet's entry names it twice
        cur.execute(
            f"UPDATE billing_ledger_entry SET ({', '.join(columns)}) = ROW({', '.join(['%s'] * len(columns))})"
            " WHERE entry_id = %s",
            [*[value] * len(columns), getattr(r, f"{entry}_id")],
        )
        cur.execute("ALTER TABLE billing_ledger_entry ENABLE TRIGGER billing_ledger_entry_immutable")
    body = tenant.agent_client.get(f"/v1/evidence/{r.receipt_id}").json()
    assert body["verification"]["receipt_signature"] == f"{entry}_mismatch"
    assert body["verified"] is False


def test_evidence_detects_tampered_request_document_and_audit_chain(tenant):
    r = make_receipt(tenant)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE receipts_receipt SET request_document = %s WHERE receipt_id = %s",
            [json.dumps({"tool": "demo.echo", "arguments": {"text": "bye"}}), r.receipt_id],
        )
        # Tampering needs the immutability trigger out of the way, as an attacker with DDL rights would.
        cur.execute("ALTER TABLE audit_event DISABLE TRIGGER audit_event_immutable")
        cur.execute("UPDATE audit_event SET ok = NOT ok WHERE event_id = %s", [r.audit_event_id])
        cur.execute("ALTER TABLE audit_event ENABLE TRIGGER audit_event_immutable")
    body = tenant.agent_client.get(f"/v1/evidence/{r.receipt_id}").json()
    assert body["verification"]["request_hash"] == "mismatch"
    assert body["verification"]["audit_chain"].startswith("broken_at_seq_")
    assert body["verified"] is False


def forge_event(event_id: str, **changes: object) -> AuditEvent:
    """What a careful attacker with write access to ``audit_event`` does: edit a row and recompute its own hash."""
    event = AuditEvent.objects.get(event_id=event_id)
    for name, value in changes.items():
        setattr(event, name, value)
    fields = (event.chain, event.seq, event.event_id, event.event, event.tenant_id, event.wallet_id, event.key_id,
              event.tool, event.endpoint, event.policy_decision_id, event.request_id, event.ok, event.detail,
              iso_utc(event.created_at))  # fmt: skip
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE audit_event DISABLE TRIGGER audit_event_immutable")
        cur.execute(
            "UPDATE audit_event SET ok = %s, detail = %s, hash = %s WHERE event_id = %s",
            [event.ok, json.dumps(event.detail), chain_hash(event.prev_hash, event_bytes(*fields)), event_id],
        )
        cur.execute("ALTER TABLE audit_event ENABLE TRIGGER audit_event_immutable")
    return event


def test_evidence_anchors_the_receipt_event_in_the_chain_above_it(tenant):
    """An event rewritten with its own hash recomputed still links below; the link above it breaks."""
    r = make_receipt(tenant)
    make_receipt(tenant)  # later events: the receipt's event is not the chain's last
    event = AuditEvent.objects.get(event_id=r.audit_event_id)
    assert event.seq < ChainHead.objects.get(chain=event.chain).seq
    assert tenant.agent_client.get(f"/v1/evidence/{r.receipt_id}").json()["verified"] is True
    forge_event(r.audit_event_id, ok=False, detail={**event.detail, "note": "rewritten"})
    for path in (f"/v1/evidence/{r.receipt_id}", f"/v1/receipts/{r.receipt_id}/evidence"):
        body = tenant.agent_client.get(path).json()
        assert body["verification"] == {
            "receipt_signature": "ok",
            "permit_signature": "ok",
            "permit_approval": "skipped",
            "audit_chain": f"broken_at_seq_{event.seq + 1}:prev_hash_mismatch",
            "request_hash": "ok",
        }
        assert body["verified"] is False


def test_evidence_catches_the_last_event_rewritten_with_its_hash_recomputed(tenant):
    r = make_receipt(tenant)
    event = AuditEvent.objects.get(event_id=r.audit_event_id)
    assert event.seq == ChainHead.objects.get(chain=event.chain).seq
    forge_event(r.audit_event_id, ok=False)
    body = tenant.agent_client.get(f"/v1/evidence/{r.receipt_id}").json()
    assert body["verification"]["audit_chain"] == f"broken_at_seq_{event.seq}:head_mismatch"
    assert body["verified"] is False


def test_evidence_of_an_honest_receipt_below_the_head_verifies(tenant):
    first, second = make_receipt(tenant), make_receipt(tenant)
    for r in (first, second):
        body = tenant.agent_client.get(f"/v1/evidence/{r.receipt_id}").json()
        assert body["verification"]["audit_chain"] == "ok"
        assert body["verified"] is True
    chain = AuditEvent.objects.get(event_id=first.audit_event_id).chain
    assert AuditEvent.objects.get(event_id=first.audit_event_id).seq < ChainHead.objects.get(chain=chain).seq


def _post_json(client, path: str, body: object):
    """A body the test client would not encode itself (lone surrogates): sent as \\u escapes."""
    return client.post(path, data=json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("text", ["\ud800", "rcpt_\x00", "sig_\udfff"])
def test_verifying_a_document_with_text_that_cannot_be_stored_is_invalid_not_500(tenant, text):
    r = make_receipt(tenant)
    for document in (
        {"type": "receipt", "receipt_id": text},
        {"type": "receipt", "receipt_id": text, "kid": text},
        {**r.signed_statement, "receipt_id": text},
        {**r.signed_statement, "kid": text},
    ):
        v = _post_json(tenant.agent_client, "/v1/receipts/verify", {"receipt": document, "signature": "AA"})
        assert v.status_code == 200, v.content
        body = v.json()
        assert body["valid"] is False
        assert body["receipt_id"] in (None, r.receipt_id)
        assert body["kid"] in (None, r.key_id)


# --- A float argument of 2**53 or more reads back from jsonb as an integer --------------------


@pytest.fixture
def echo_upstream(settings):
    with FaultUpstream() as upstream:
        settings.UPSTREAM_MCP_URL = upstream.url
        tools_sync(remote_tools=upstream.tools())  # "echo" takes any object: numbers pass its inputSchema
        tool_price_set(tool="echo", credits=Decimal("1"))
        yield upstream


def test_evidence_of_a_call_with_large_float_arguments_verifies(tenant, echo_upstream):
    arguments = {"a": 1e20, "b": [1.5e300, -(2.0**60)], "c": {"d": 9007199254740993.0}, "e": 0.5}
    caller = setup_caller(tenant)
    call = caller.invoke("echo", arguments)
    assert call.status_code == 200, call.content
    receipt = Receipt.objects.get(receipt_id=call.json()["receipt_id"])
    assert receipt.request_document["arguments"]["a"] == 10**20  # how jsonb gives it back
    for path in (f"/v1/evidence/{receipt.receipt_id}", f"/v1/receipts/{receipt.receipt_id}/evidence"):
        r = tenant.agent_client.get(path)
        assert r.status_code == 200, r.content
        assert r.json()["verification"]["request_hash"] == "ok"
        assert r.json()["verified"] is True, r.json()["verification"]
    # The dashboard's evidence page serves the same bundle to a staff session.
    staff = get_user_model().objects.create_user(username="ops", password="pw-ops-12345", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_receipt"))
    client = Client()
    client.force_login(staff)
    page = client.get(f"/dashboard/evidence/{receipt.receipt_id}")
    assert page.status_code == 200
    assert page.json()["verified"] is True


def test_the_stored_large_integers_map_back_to_the_floats_that_were_hashed():
    for value in (1e20, 1.5e300, -1.5e300, 2.0**60, 9007199254740993.0, 2.0**53, 1.7976931348623157e308):
        stored = json.loads(json.dumps({"tool": "t", "arguments": {"v": int(value)}}))
        assert request_document_hash(stored) == request_document_hash({"tool": "t", "arguments": {"v": value}})


def test_receipt_signed_before_rotation_still_verifies(tenant):
    before = make_receipt(tenant)
    signing_key_rotate()
    after = make_receipt(tenant)
    assert after.key_id != before.key_id
    for r in (before, after):
        v = tenant.agent_client.post("/v1/receipts/verify", {"receipt_id": r.receipt_id}, format="json").json()
        assert v == {"valid": True, "reason": None, "receipt_id": r.receipt_id, "kid": r.key_id}
        assert tenant.agent_client.get(f"/v1/evidence/{r.receipt_id}").json()["verified"] is True
        portable = tenant.agent_client.get(f"/v1/receipts/{r.receipt_id}/portable").json()
        assert verify_portable(portable).valid


def test_portable_receipt_verifies_in_a_subprocess_without_database_or_network(tenant, tmp_path):
    r = make_receipt(tenant)
    portable = tenant.agent_client.get(f"/v1/receipts/{r.receipt_id}/portable").json()
    assert "matches the supplied public key snapshot" in portable["what_a_valid_signature_proves"]
    path = tmp_path / "portable.json"
    path.write_text(json.dumps(portable))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(tenant.agent_client.get("/.well-known/jwks.json").json()))
    # A guard that makes any socket or Django import fail inside the child process.
    guard = tmp_path / "sitecustomize.py"
    guard.write_text(
        "import socket, sys\n"
        "class _NoNet(socket.socket):\n"
        "    def __init__(self, *a, **k):\n"
        "        raise RuntimeError('network access attempted')\n"
        "socket.socket = _NoNet\n"
        "class _NoDjango:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'django' or name.startswith('django.'):\n"
        "            raise ImportError('django imported')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NoDjango())\n"
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    for extra in ([], ["--keys", str(jwks)]):
        done = subprocess.run(
            [sys.executable, "-m", "receipts.verify", str(path), *extra],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        assert "VALID" in done.stdout
    portable["signature"] = portable["signature"][:-4] + (
        "AAAA" if not portable["signature"].endswith("AAAA") else "BBBB"
    )
    path.write_text(json.dumps(portable))
    done = subprocess.run(
        [sys.executable, "-m", "receipts.verify", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 1
    assert "INVALID" in done.stderr


def test_reconciliation_list_and_retry(tenant, operator_client):
    r = make_receipt(tenant, outcome="failed_unrefunded", charged=True, owed=True)
    before = Wallet.objects.get(pk=tenant.agent.pk).balance
    listing = operator_client.get("/v1/receipts/reconciliation/refunds").json()
    assert [i["receipt_id"] for i in listing["items"]] == [r.receipt_id]
    assert tenant.agent_client.get("/v1/receipts/reconciliation/refunds").json()["total"] == 1
    assert operator_client.get("/v1/receipts/reconciliation/refunds?status=resolved").json()["total"] == 0
    assert operator_client.get("/v1/receipts/reconciliation/refunds?status=other").status_code == 422
    # Wallet keys cannot post refunds.
    assert tenant.sponsor_client.post(f"/v1/receipts/reconciliation/refunds/{r.receipt_id}/retry").status_code == 403
    res = operator_client.post(f"/v1/receipts/reconciliation/refunds/{r.receipt_id}/retry")
    assert res.status_code == 200
    assert res.json()["refunded"] is True
    item = res.json()["item"]
    assert item["status"] == "resolved"
    refund = LedgerEntry.objects.get(entry_id=item["refund_entry_id"])
    assert refund.amount == Decimal("2")
    assert refund.refund_of_id == r.ledger_entry_id
    assert Wallet.objects.get(pk=tenant.agent.pk).balance == before + 2
    # The permit allowance is released with the refund.
    assert Permit.objects.get(pk=r.permit_id).spent_credits == 0
    # Retrying again posts nothing more.
    again = operator_client.post(f"/v1/receipts/reconciliation/refunds/{r.receipt_id}/retry").json()
    assert again["item"]["refund_entry_id"] == item["refund_entry_id"]
    assert LedgerEntry.objects.filter(refund_of_id=r.ledger_entry_id, wallet__isnull=False).count() == 1
    assert AuditEvent.objects.filter(event="reconciliation.refund_posted").count() == 1
    assert operator_client.get("/v1/receipts/reconciliation/refunds?status=resolved").json()["total"] == 1
    assert operator_client.post("/v1/receipts/reconciliation/refunds/rcpt_nope/retry").status_code == 404


def test_retry_that_cannot_post_stays_pending_with_the_reason(tenant, operator_client):
    r = make_receipt(tenant, outcome="failed_unrefunded", owed=True)
    # A closed wallet accepts no refund (status set directly: closing needs a zero balance).
    Wallet.objects.filter(pk=tenant.agent.pk).update(status="closed")
    res = operator_client.post(f"/v1/receipts/reconciliation/refunds/{r.receipt_id}/retry").json()
    assert res["refunded"] is False
    assert res["item"]["status"] == "pending"
    assert res["item"]["attempts"] == 1
    assert res["item"]["last_error"]
    assert RefundReconciliation.objects.get(receipt=r).status == "pending"


def test_operator_marks_delivery_uncertain_not_executed(tenant, operator_client):
    r = make_receipt(tenant, outcome="delivery_uncertain")
    item = refund_reconciliation_mark_not_executed(receipt_id=r.receipt_id, actor="ops")
    assert item.status == "pending"
    assert item.amount == Decimal("2")
    ok = make_receipt(tenant, outcome="success")
    with pytest.raises(Exception, match="delivery_uncertain"):
        refund_reconciliation_mark_not_executed(receipt_id=ok.receipt_id, actor="ops")
    assert operator_client.post(f"/v1/receipts/reconciliation/refunds/{r.receipt_id}/retry").json()["refunded"]


def test_a_refund_item_does_not_name_the_operator_to_the_wallet(tenant, operator_client):
    """The item is listed to the wallet's keys; the console username that marked it is for operators
    (the reconciliation result, the audit event)."""
    r = make_receipt(tenant, outcome="delivery_uncertain")
    refund_reconciliation_mark_not_executed(receipt_id=r.receipt_id, actor="admin:alice", note="upstream log: no call")
    listed = tenant.agent_client.get("/v1/receipts/reconciliation/refunds").json()["items"]
    assert [item["reason"] for item in listed] == ["marked not executed: upstream log: no call"]
    assert "alice" not in json.dumps(listed)
    assert ReconciliationResult.objects.get(receipt=r).actor == "admin:alice"

    bare = make_receipt(tenant, outcome="delivery_uncertain")
    refund_reconciliation_mark_not_executed(receipt_id=bare.receipt_id, actor="admin:alice")
    assert RefundReconciliation.objects.get(receipt=bare).reason == "marked not executed"


def test_migration_drops_the_operator_from_reasons_recorded_before(tenant):
    import importlib

    from django.db import connection

    migration = importlib.import_module("receipts.migrations.0005_reconciliation_reason_without_actor")
    noted, backfilled = (make_receipt(tenant, outcome="delivery_uncertain") for _ in range(2))
    for receipt, actor, note in ((noted, "admin:bob", "checked"), (backfilled, "", "marked not executed by ops")):
        ReconciliationResult.objects.create(
            receipt=receipt, tenant_id=receipt.tenant_id, verdict="not_executed", actor=actor, note=note
        )
        RefundReconciliation.objects.create(
            receipt=receipt,
            tenant_id=receipt.tenant_id,
            amount=Decimal("2"),
            origin="operator_not_executed",
            reason=f"marked not executed by {actor or 'ops'}: {note}",
        )
    with connection.cursor() as cursor:
        cursor.execute(migration.Migration.operations[0].sql)
    assert RefundReconciliation.objects.get(receipt=noted).reason == "marked not executed: checked"
    assert RefundReconciliation.objects.get(receipt=backfilled).reason == "marked not executed"


def test_concurrent_retries_post_exactly_one_refund(transactional_db):
    t = make_tenant("retry")
    from tests.conftest import client_for
    from tests.factories import make_operator_key

    r = make_receipt(t, outcome="failed_unrefunded", owed=True)
    op = make_operator_key().secret
    barrier = threading.Barrier(10)
    codes: list[int] = []

    def worker():
        barrier.wait()
        try:
            codes.append(client_for(op).post(f"/v1/receipts/reconciliation/refunds/{r.receipt_id}/retry").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert codes == [200] * 10
    assert LedgerEntry.objects.filter(refund_of_id=r.ledger_entry_id, wallet__isnull=False).count() == 1
    assert RefundReconciliation.objects.get(receipt=r).status == "resolved"


def test_receipts_are_immutable(tenant):
    r = make_receipt(tenant)
    r.outcome = "tool_error"
    with pytest.raises(RuntimeError):
        r.save()
    assert Receipt.objects.get(pk=r.pk).outcome == "success"
