"""Approvals in the signed record (docs/decisions.md, Authority, "Approvals are signed").

A person's decision on a permit request is a signed ``permit_approval`` statement; the permit minted
from an approval names it in its own signed statement; authorization, the revocation under human
approval, the API and the evidence read "was this approved" from those statements and never from
``issued_via_request_id``. Attacked as a writer of the permits tables: a column filled in on a
self-issued permit, an approval row's approver edited, an approval of other terms, a sibling's
approval named by another permit.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import sys
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from django.utils import timezone

from audit.evidence_core import approval_link_problem, permit_terms_digest
from audit.models import AuditEvent
from audit.signing import sign_statement, verify_statement
from billing.models import Wallet
from common.canonical import canonical_bytes, sha256_hex
from common.ids import new_id
from permits import exceptions as services_exc
from permits import services
from permits.models import Permit, PermitApproval, PermitRequest, PermitStatus, TenantApprover
from permits.services.approval_record import approval_record_sign, approval_reference
from permits.services.permits import PermitTerms, _mint_permit
from receipts.verify import verify_portable
from tests import factories
from tests.conftest import Tenant
from tests.test_receipts import make_receipt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))
from tollgate_client.verify import verify_portable_standalone

pytestmark = pytest.mark.django_db


def _ask(tenant: Tenant, wallet: Wallet | None = None, **extra: Any) -> dict[str, Any]:
    body = {
        "wallet_id": (wallet or tenant.agent).wallet_id,
        "allowed_tools": ["demo.echo"],
        "max_credits": "5",
        **extra,
    }
    client = tenant.agent_client
    r = client.post("/v1/permit-requests", body, format="json", HTTP_IDEMPOTENCY_KEY=new_id("idem"))
    assert r.status_code == 202, r.content
    return dict(r.json())


def _approver(tenant: Tenant, username: str = "alice") -> tuple[Any, Client]:
    user = get_user_model().objects.create_user(username=username, password="pw-correct-horse")
    TenantApprover.objects.create(user=user, tenant=tenant.sponsor)
    browser = Client()
    assert browser.login(username=username, password="pw-correct-horse")
    return user, browser


def _decide_on_the_page(browser: Client, request_id: str, decision: str) -> None:
    page = browser.get(f"/approvals/{request_id}").content.decode()
    terms = re.search(r'name="terms" value="([0-9a-f]{64})"', page)
    assert terms is not None
    r = browser.post(f"/approvals/{request_id}/decide", {"decision": decision, "terms": terms[1]})
    assert r.status_code == 302


def _self_issued(tenant: Tenant, wallet: Wallet | None = None) -> Permit:
    r = tenant.agent_client.post(
        "/v1/permits",
        {"wallet_id": (wallet or tenant.agent).wallet_id, "allowed_tools": ["*"], "max_credits": "5"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("idem"),
    )
    assert r.status_code == 201, r.content
    return Permit.objects.get(permit_id=r.json()["permit_id"])


def _require_approval(tenant: Tenant) -> list[str]:
    """Turn human approval on for the tenant; the permit ids the policy revoked."""
    policy = services.policy_create(wallet=tenant.sponsor, human_approval_required=True)
    return list(policy.permits_revoked)


def _authorize(tenant: Tenant, permit: Permit) -> Any:
    permit = Permit.objects.get(permit_id=permit.permit_id)
    return services.authorize(
        permit=permit, wallet=tenant.agent, key_id=tenant.agent_key_id, tool="demo.echo", price=Decimal(1)
    )


def _mint_naming(wallet: Wallet, approval: Any, **terms: Any) -> Permit:
    """A permit signed by the gateway's key whose statement names ``approval`` (a reference builder)."""
    with transaction.atomic():
        return _mint_permit(
            terms=PermitTerms(
                wallet=wallet,
                issuer_wallet=Wallet.objects.get(wallet_id=wallet.tenant_id),
                allowed_tools=terms.get("allowed_tools", ["*"]),
                max_credits=Decimal(terms.get("max_credits", 5)),
                max_calls=None,
                expires_at=terms["expires_at"],
            ),
            approval=approval,
        )


def test_an_approval_is_a_signed_statement_the_permit_names(tenant: Tenant) -> None:
    preq = _ask(tenant)
    user, browser = _approver(tenant)
    _decide_on_the_page(browser, preq["request_id"], "approve")

    approval = PermitApproval.objects.get()
    permit = Permit.objects.get()
    statement = approval.signed_statement
    assert verify_statement(statement, approval.signature, expected_type="permit_approval").valid
    assert {k: v for k, v in statement.items() if k != "kid"} == {
        "type": "permit_approval",
        "approval_id": approval.approval_id,
        "request_id": preq["request_id"],
        "tenant_id": tenant.sponsor.wallet_id,
        "wallet_id": tenant.agent.wallet_id,
        "decision": "approved",
        "approver_user_id": user.pk,
        "approver": "alice",
        "decided_at": statement["decided_at"],
        "permit_id": permit.permit_id,
        "terms_digest": permit_terms_digest(permit.signed_statement),
    }
    # The permit's own signed statement names the approval; its terms are what the approval signed.
    assert permit.signed_statement["approval"] == {
        "approval_id": approval.approval_id,
        "request_id": preq["request_id"],
        "approver": "alice",
        "decided_at": statement["decided_at"],
        "terms_digest": statement["terms_digest"],
    }
    assert permit.signed_statement["created_at"] == statement["decided_at"]
    assert approval_link_problem(permit.signed_statement, statement) is None
    assert services.permit_statement_problem(permit) is None
    assert services.permit_approval_standing(permit) == "approved"
    # The decision's audit event carries the digest of the approval's signed bytes.
    event = AuditEvent.objects.get(event="permit_request.approved")
    assert event.detail["approval_id"] == approval.approval_id
    assert event.detail["approval_sha256"] == sha256_hex(canonical_bytes(statement))
    # The API shows both, read from the signed statements.
    polled = tenant.agent_client.get(f"/v1/permit-requests/{preq['request_id']}").json()
    assert polled["approval"]["approval_id"] == approval.approval_id
    assert polled["approval"]["signed_statement"] == statement
    assert polled["permit"]["approval"] == permit.signed_statement["approval"]
    assert polled["permit"]["issued_via_request_id"] == preq["request_id"]


def test_a_rejection_is_signed_too(tenant: Tenant) -> None:
    preq = _ask(tenant)
    user, browser = _approver(tenant, "bob")
    _decide_on_the_page(browser, preq["request_id"], "reject")
    approval = PermitApproval.objects.get()
    assert approval.signed_statement["decision"] == "rejected"
    assert approval.signed_statement["permit_id"] is None
    assert approval.signed_statement["terms_digest"] is None
    assert approval.signed_statement["approver_user_id"] == user.pk
    assert services.approval_statement_problem(approval) is None
    event = AuditEvent.objects.get(event="permit_request.rejected")
    assert event.detail["approval_sha256"] == sha256_hex(canonical_bytes(approval.signed_statement))
    assert not Permit.objects.exists()


def test_permits_signed_before_approvals_were_signed_still_verify(tenant: Tenant) -> None:
    """A statement without ``approval`` (every permit signed before) verifies as it did; a self-issued or
    operator permit names no approval."""
    own = _self_issued(tenant)
    assert "approval" not in own.signed_statement
    assert services.permit_statement_problem(own) is None
    assert _authorize(tenant, own).allowed
    r = tenant.sponsor_client.get(f"/v1/permits/{own.permit_id}").json()
    assert r["approval"] is None
    assert r["issued_via_request_id"] == ""


def test_a_filled_in_request_id_does_not_make_a_self_issued_permit_approved(tenant: Tenant) -> None:
    """The writer of the permits table sets issued_via_request_id (even to a real approved request of a
    sibling wallet) on a permit the agent issued itself: it is not shown as approved, the policy that
    requires approval revokes it, and put back to active it is refused at the call."""
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    sibling_permit = factories.approved_permit(sibling)
    own = _self_issued(tenant)
    Permit.objects.filter(pk=own.pk).update(issued_via_request_id=sibling_permit.issued_via_request_id)

    shown = tenant.agent_client.get(f"/v1/permits/{own.permit_id}").json()
    assert shown["issued_via_request_id"] == ""
    assert shown["approval"] is None
    assert services.permit_approval_standing(Permit.objects.get(pk=own.pk)) == "unapproved"

    revoked = _require_approval(tenant)
    assert own.permit_id in revoked
    assert sibling_permit.permit_id not in revoked
    assert Permit.objects.get(pk=sibling_permit.pk).status == PermitStatus.ACTIVE

    Permit.objects.filter(pk=own.pk).update(status=PermitStatus.ACTIVE, revoked_at=None, revoke_reason="")
    decision = _authorize(tenant, own)
    assert not decision.allowed
    assert decision.refusal is not None
    assert decision.refusal.code == "policy_denied"
    assert decision.refusal.extra["rule"] == "human_approval_required"


def test_an_approved_permit_is_authorized_under_human_approval(tenant: Tenant) -> None:
    permit = factories.approved_permit(tenant.agent, allowed_tools=["demo.echo"])
    assert _require_approval(tenant) == []
    assert _authorize(tenant, permit).allowed


def test_an_approval_row_whose_approver_was_edited_is_invalid(tenant: Tenant) -> None:
    permit = factories.approved_permit(tenant.agent, allowed_tools=["demo.echo"])
    approval = PermitApproval.objects.get(permit_id=permit.permit_id)
    PermitApproval.objects.filter(pk=approval.pk).update(approver="mallory")
    assert services.permit_statement_problem(permit) == "approval_statement_mismatch:approver"
    decision = _authorize(tenant, permit)
    assert decision.refusal is not None
    assert decision.refusal.code == "permit_signature_invalid"
    assert decision.refusal.extra["reason"] == "approval_statement_mismatch:approver"

    # The approver edited inside the signed statement as well: the signature no longer verifies.
    forged = {**approval.signed_statement, "approver": "mallory"}
    PermitApproval.objects.filter(pk=approval.pk).update(signed_statement=forged)
    problem = services.permit_statement_problem(permit)
    assert problem is not None
    assert problem.startswith("approval_bad_signature:")
    # A permit whose approval does not hold is revoked when approval becomes required.
    assert _require_approval(tenant) == [permit.permit_id]


def test_a_deleted_approval_row_is_missing(tenant: Tenant) -> None:
    permit = factories.approved_permit(tenant.agent)
    PermitApproval.objects.filter(permit_id=permit.permit_id).delete()
    assert services.permit_statement_problem(permit) == "approval_missing"
    assert services.permit_approval_standing(permit) == "unapproved"


def test_an_approval_of_other_terms_is_a_digest_mismatch(tenant: Tenant) -> None:
    """A permit signed with a higher allowance than the approval it names signed the digest of."""
    preq = PermitRequest.objects.get(request_id=_ask(tenant)["request_id"])
    user, _ = _approver(tenant)
    now = timezone.now()

    def approve_lower(terms: dict[str, Any]) -> dict[str, Any]:
        approval, _digest = approval_record_sign(
            preq=preq, user=user, decided_at=now, permit_terms={**terms, "max_credits": "5.00000000"}
        )
        return approval_reference(approval)

    permit = _mint_naming(tenant.agent, approve_lower, max_credits=500, expires_at=now + timedelta(hours=1))
    assert permit.signed_statement["max_credits"] == "500.00000000"
    assert services.permit_statement_problem(permit) == "approval_terms_digest_mismatch"
    decision = _authorize(tenant, permit)
    assert decision.refusal is not None
    assert decision.refusal.code == "permit_signature_invalid"


def test_a_siblings_approval_named_by_another_permit_is_refused(tenant: Tenant) -> None:
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    theirs = factories.approved_permit(sibling, allowed_tools=["*"])
    approval = PermitApproval.objects.get(permit_id=theirs.permit_id)
    permit = _mint_naming(tenant.agent, lambda _terms: approval_reference(approval), expires_at=theirs.expires_at)
    assert services.permit_statement_problem(permit) == "approval_mismatch:permit_id"
    assert services.permit_approval_standing(permit) == "unapproved"
    assert not _authorize(tenant, permit).allowed
    # The same approval named by another permit of the same wallet: refused for the same reason.
    again = _mint_naming(sibling, lambda _terms: approval_reference(approval), expires_at=theirs.expires_at)
    assert services.permit_statement_problem(again) == "approval_mismatch:permit_id"


def _receipt(tenant: Tenant, permit: Permit) -> Any:
    return make_receipt(tenant, permit=permit)


def test_the_evidence_carries_and_checks_the_approval(tenant: Tenant) -> None:
    permit = factories.approved_permit(tenant.agent, allowed_tools=["demo.echo"])
    receipt = _receipt(tenant, permit)
    body = tenant.agent_client.get(f"/v1/evidence/{receipt.receipt_id}").json()
    assert body["verification"]["permit_approval"] == "ok"
    assert body["verified"] is True
    approval = PermitApproval.objects.get(permit_id=permit.permit_id)
    assert body["approval"]["approval_id"] == approval.approval_id
    assert body["approval"]["signed_statement"] == approval.signed_statement

    PermitApproval.objects.filter(pk=approval.pk).update(approver="mallory")
    body = tenant.agent_client.get(f"/v1/evidence/{receipt.receipt_id}").json()
    assert body["verification"]["permit_approval"] == "approval_statement_mismatch:approver"
    assert body["verified"] is False

    # A self-issued permit's receipt: nothing to check.
    other = _receipt(tenant, _self_issued(tenant))
    body = tenant.agent_client.get(f"/v1/evidence/{other.receipt_id}").json()
    assert body["verification"]["permit_approval"] == "skipped"
    assert body["approval"] is None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _both_verifiers(portable: dict[str, Any]) -> tuple[str | None, str | None]:
    reference = verify_portable(portable)
    standalone = verify_portable_standalone(portable)
    assert reference.valid == standalone.valid
    return reference.reason, standalone.reason


def test_the_offline_verifiers_check_the_approval_a_portable_receipt_carries(tenant: Tenant) -> None:
    permit = factories.approved_permit(tenant.agent, allowed_tools=["demo.echo"])
    receipt = _receipt(tenant, permit)
    portable = tenant.agent_client.get(f"/v1/receipts/{receipt.receipt_id}/portable").json()
    assert set(portable["permit"]) == {"signed_bytes", "signature"}
    assert json.loads(base64.urlsafe_b64decode(portable["approval"]["signed_bytes"] + "==")) == (
        PermitApproval.objects.get(permit_id=permit.permit_id).signed_statement
    )
    assert _both_verifiers(portable) == (None, None)

    missing = {k: v for k, v in portable.items() if k != "approval"}
    assert _both_verifiers(missing) == ("approval_missing", "approval_missing")

    # An approval of another permit (a sibling's, validly signed) carried instead.
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    theirs = PermitApproval.objects.get(permit_id=factories.approved_permit(sibling).permit_id)
    swapped = copy.deepcopy(portable)
    swapped["approval"] = {
        "signed_bytes": _b64(canonical_bytes(theirs.signed_statement)),
        "signature": theirs.signature,
    }
    assert _both_verifiers(swapped) == ("approval_mismatch:permit_id", "approval_mismatch:permit_id")

    # The approver edited in the carried bytes: the approval's signature fails.
    edited = copy.deepcopy(portable)
    statement = json.loads(base64.urlsafe_b64decode(portable["approval"]["signed_bytes"] + "=="))
    edited["approval"]["signed_bytes"] = _b64(canonical_bytes({**statement, "approver": "mallory"}))
    assert _both_verifiers(edited) == ("approval_bad_signature", "approval_bad_signature")

    # A validly signed approval of other terms (a lower allowance) than the permit's.
    lower = sign_statement({**statement, "terms_digest": "00" * 32})
    digest = copy.deepcopy(portable)
    digest["approval"] = {"signed_bytes": _b64(lower.canonical), "signature": lower.signature}
    assert _both_verifiers(digest) == ("approval_mismatch:terms_digest", "approval_mismatch:terms_digest")

    # Another permit carried beside the receipt.
    other = factories.approved_permit(tenant.agent)
    foreign = copy.deepcopy(portable)
    foreign["permit"] = {"signed_bytes": _b64(canonical_bytes(other.signed_statement)), "signature": other.signature}
    assert _both_verifiers(foreign) == ("permit_not_the_receipts", "permit_not_the_receipts")

    # A self-issued permit's portable receipt carries neither and verifies as before.
    plain = tenant.agent_client.get(f"/v1/receipts/{_receipt(tenant, _self_issued(tenant)).receipt_id}/portable").json()
    assert "permit" not in plain
    assert "approval" not in plain
    assert _both_verifiers(plain) == (None, None)


def _staff(*permissions: str) -> Client:
    from django.contrib.auth.models import Group, Permission

    user = get_user_model().objects.create_user(new_id("staff"), is_staff=True)
    for label in permissions:
        if label.startswith("group:"):
            user.groups.add(Group.objects.get(name=label.removeprefix("group:")))
            continue
        app_label, codename = label.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    browser = Client()
    browser.force_login(user)
    return browser


def test_the_console_shows_approval_from_the_signed_record(tenant: Tenant) -> None:
    approved = factories.approved_permit(tenant.agent)
    own = _self_issued(tenant)
    Permit.objects.filter(pk=own.pk).update(issued_via_request_id=approved.issued_via_request_id)
    viewer = _staff("permits.view_permit")
    page = viewer.get(f"/admin/permits/permit/{quote(approved.permit_id)}/change/").content.decode()
    assert "Approved by " in page
    page = viewer.get(f"/admin/permits/permit/{quote(own.permit_id)}/change/").content.decode()
    assert "NOT approved" in page
    assert "Approved by " not in page

    approval = PermitApproval.objects.get(permit_id=approved.permit_id)
    PermitApproval.objects.filter(pk=approval.pk).update(approver="mallory")
    page = viewer.get(f"/admin/permits/permit/{quote(approved.permit_id)}/change/").content.decode()
    assert "approval_statement_mismatch:approver" in page

    # The signed approvals: the auditor role sees them (and that this row is not what was signed);
    # a staff user with another permission does not.
    auditor = _staff("group:Read-only auditor")
    listing = auditor.get("/admin/permits/permitapproval/")
    assert listing.status_code == 200
    assert "statement_mismatch:approver" in listing.content.decode()
    assert viewer.get("/admin/permits/permitapproval/").status_code == 403


def test_the_services_check_and_the_clients_copy_agree(tenant: Tenant) -> None:
    """``audit.evidence_core`` (the service's) and ``tollgate_client.verify`` (the offline verifiers')
    give the same verdict on the same pair of statements, honest and attacked."""
    from tollgate_client import verify as client_verify

    from audit import evidence_core

    permit = factories.approved_permit(tenant.agent)
    approval = PermitApproval.objects.get(permit_id=permit.permit_id).signed_statement
    statement = permit.signed_statement
    cases = [
        (statement, approval),
        (statement, {**approval, "decision": "rejected"}),
        (statement, {**approval, "approver": "mallory"}),
        (statement, {**approval, "wallet_id": "agt_other"}),
        ({**statement, "max_credits": "500.00000000"}, approval),
        ({**statement, "approval": None}, approval),
        (statement, {**approval, "type": "permit"}),
        (statement, "not an object"),
    ]
    verdicts = [evidence_core.approval_link_problem(p, a) for p, a in cases]
    assert verdicts == [client_verify.approval_link_problem(p, a) for p, a in cases]
    assert verdicts == [
        None,
        "approval_not_approved",
        "approval_mismatch:approver",
        "approval_mismatch:wallet_id",
        "approval_terms_digest_mismatch",
        "approval_not_named",
        "approval_type_mismatch",
        "approval_not_an_object",
    ]
    assert evidence_core.permit_terms_digest(statement) == client_verify.permit_terms_digest(statement)


def test_an_approved_receipt_verifies_offline_in_a_subprocess_without_django(tenant: Tenant, tmp_path: Path) -> None:
    import subprocess

    root = Path(__file__).resolve().parent.parent
    receipt = _receipt(tenant, factories.approved_permit(tenant.agent, allowed_tools=["demo.echo"]))
    portable = tenant.agent_client.get(f"/v1/receipts/{receipt.receipt_id}/portable").json()
    guard = tmp_path / "sitecustomize.py"
    guard.write_text(
        "import sys\n"
        "class _NoDjango:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'django' or name.startswith('django.'):\n"
        "            raise ImportError('django imported')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NoDjango())\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{root}"}
    for name, document in (("good", portable), ("missing", {k: v for k, v in portable.items() if k != "approval"})):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document))
        done = subprocess.run(
            [sys.executable, "-m", "receipts.verify", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path
        )
        if name == "good":
            assert done.returncode == 0, done.stderr
        else:
            assert done.returncode == 1
            assert "INVALID: approval_missing" in done.stderr


@pytest.mark.django_db(transaction=True)
def test_an_approval_and_a_rejection_racing_sign_one_decision() -> None:
    import threading

    from django.db import connection

    from tests.conftest import make_tenant

    tenant = make_tenant("race")
    preq = _ask(tenant)
    user, _ = _approver(tenant)
    barrier = threading.Barrier(2)

    def decide(approve: bool) -> None:
        barrier.wait()
        try:
            services.permit_request_decide(request_id=preq["request_id"], user=user, approve=approve)
        except services_exc.RequestAlreadyDecided:
            pass
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(approve,)) for approve in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    decided = PermitRequest.objects.get(request_id=preq["request_id"])
    approval = PermitApproval.objects.get()
    assert approval.decision == decided.status
    assert approval.permit_id == decided.permit_id
    assert services.approval_statement_problem(approval) is None
    if decided.permit is not None:
        assert decided.permit.signed_statement["approval"]["approval_id"] == approval.approval_id
    # The page names the signed decision.
    _user, browser = _approver(tenant, "carol")
    page = browser.get(f"/approvals/{preq['request_id']}").content.decode()
    assert f'<code id="approval-id">{approval.approval_id}</code>' in page


def test_governed_calls_read_approval_from_the_signed_record(settings: Any, fault_server: Any, tenant: Tenant) -> None:
    """Through the gateway (its one-round-trip lookup and claim): under human approval an approved permit
    calls; a self-issued one with a filled-in request id, put back to active, is refused; an approved
    permit whose approval row was edited is refused."""
    from tests.gateway_helpers import Caller, fresh_upstream

    fresh_upstream(settings, fault_server, timeout=0.5)
    factories.top_up(tenant.agent, 100)
    approved = factories.approved_permit(tenant.agent, allowed_tools=["*"], max_credits=50)
    edited = factories.approved_permit(tenant.agent, allowed_tools=["*"], max_credits=50)
    own = _self_issued(tenant)
    assert _require_approval(tenant) == [own.permit_id]
    Permit.objects.filter(pk=own.pk).update(
        status=PermitStatus.ACTIVE,
        revoked_at=None,
        revoke_reason="",
        issued_via_request_id=approved.issued_via_request_id,
    )
    PermitApproval.objects.filter(permit_id=edited.permit_id).update(approver="mallory")

    ok = Caller(tenant, approved.permit_id).rpc("echo", {"text": "hi"}).json()
    assert "result" in ok, ok
    refused = Caller(tenant, own.permit_id).rpc("echo", {"text": "hi"}).json()
    assert refused["error"]["data"]["error"] == "policy_denied", refused
    assert refused["error"]["data"]["rule"] == "human_approval_required"
    invalid = Caller(tenant, edited.permit_id).rpc("echo", {"text": "hi"}).json()
    assert invalid["error"]["data"]["error"] == "permit_signature_invalid", invalid
    assert Permit.objects.get(pk=own.pk).spent_credits == 0
    assert Permit.objects.get(pk=edited.pk).spent_credits == 0


def test_verifying_a_permit_names_an_approval_that_does_not_hold(tenant: Tenant) -> None:
    permit = factories.approved_permit(tenant.agent)
    body = {"permit": permit.signed_statement, "signature": permit.signature}
    assert tenant.agent_client.post("/v1/permits/verify", body, format="json").json()["reasons"] == []
    PermitApproval.objects.filter(permit_id=permit.permit_id).update(approver="mallory")
    for request in (body, {"permit_id": permit.permit_id}):
        verdict = tenant.agent_client.post("/v1/permits/verify", request, format="json").json()
        assert verdict["valid"] is False
        assert verdict["signature_valid"] is True
        assert verdict["reasons"] == ["approval_invalid"]
