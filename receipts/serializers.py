"""Request and response records for receipts, evidence and refund reconciliation."""

from __future__ import annotations

from rest_framework import serializers

from billing.serializers import MoneyField
from common.pagination import PageQuery, list_envelope
from common.schema import SignedDocumentVerifyRequest
from receipts.models import Outcome, Receipt, RefundReconciliation


class ReceiptResponse(serializers.ModelSerializer):
    """A signed receipt and the ids it links."""

    wallet_id = serializers.CharField()
    permit_id = serializers.CharField(allow_null=True)
    ledger_entry_id = serializers.CharField(allow_null=True)
    refund_entry_id = serializers.CharField(allow_null=True)
    outcome = serializers.ChoiceField(choices=Outcome.choices)
    credits_authorized = MoneyField()
    credits_charged = MoneyField()
    signed_statement = serializers.DictField()

    class Meta:
        model = Receipt
        fields = [
            "receipt_id",
            "action_id",
            "permit_id",
            "wallet_id",
            "api_key_id",
            "tool",
            "outcome",
            "reason_code",
            "request_hash",
            "response_hash",
            "credits_authorized",
            "credits_charged",
            "ledger_entry_id",
            "refund_entry_id",
            "audit_event_id",
            "policy_decision_id",
            "quote_id",
            "upstream_server_id",
            "upstream_url",
            "created_at",
            "key_id",
            "signature",
            "signed_statement",
        ]


ReceiptListResponse = list_envelope("ReceiptListResponse", ReceiptResponse)


class ReceiptListQuery(PageQuery):
    permit_id = serializers.CharField(required=False)
    wallet_id = serializers.CharField(required=False)
    tool = serializers.CharField(required=False)
    outcome = serializers.ChoiceField(choices=Outcome.choices, required=False)


class PermitReceiptQuery(ReceiptListQuery):
    permit_id = None  # type: ignore[assignment]  # the path names the permit


class PermitReceiptsQuery(PermitReceiptQuery):
    wallet_id = None  # type: ignore[assignment]


class MeReceiptQuery(ReceiptListQuery):
    wallet_id = None  # type: ignore[assignment]  # the caller's own wallet


def evidence_transparency_field(what: str) -> serializers.DictField:
    """Where the evidence's ``what`` (receipt or approval) stands in its tenant's transparency log."""
    return serializers.DictField(
        allow_null=True,
        help_text=f'The {what} in its tenant\'s transparency log: {{"leaf_index", "proof": "<tlog-proof@v1>"}} '
        'once integrated, {"status": "pending", "fetch": "<url>"} before (docs/audit-chain.md).',
    )


class VerificationMap(serializers.Serializer):
    """Each check computed at request time: ``ok``, ``skipped`` or a failure reason."""

    receipt_signature = serializers.CharField()
    permit_signature = serializers.CharField()
    permit_approval = serializers.CharField(
        help_text="ok, skipped (the permit names no approval) or why the approval it names does not hold."
    )
    audit_chain = serializers.CharField()
    request_hash = serializers.CharField()


class EvidenceLedgerEntry(serializers.Serializer):
    entry_id = serializers.CharField()
    transaction_id = serializers.CharField()
    wallet_id = serializers.CharField(allow_null=True)
    kind = serializers.CharField()
    amount = MoneyField()
    balance_after = MoneyField(allow_null=True)
    service_category = serializers.CharField()
    description = serializers.CharField()
    correlation_id = serializers.CharField()
    created_at = serializers.DateTimeField()


class EvidenceAuditEvent(serializers.Serializer):
    event_id = serializers.CharField()
    chain = serializers.CharField()
    seq = serializers.IntegerField()
    event = serializers.CharField()
    wallet_id = serializers.CharField(allow_null=True)
    key_id = serializers.CharField(allow_null=True)
    tool = serializers.CharField(allow_null=True)
    endpoint = serializers.CharField(allow_null=True)
    policy_decision_id = serializers.CharField(allow_null=True)
    request_id = serializers.CharField(allow_null=True)
    ok = serializers.BooleanField()
    detail = serializers.DictField()
    created_at = serializers.DateTimeField()
    prev_hash = serializers.CharField()
    hash = serializers.CharField()


class EvidencePermit(serializers.Serializer):
    permit_id = serializers.CharField()
    signed_statement = serializers.DictField()
    signature = serializers.CharField()
    key_id = serializers.CharField()


class EvidenceApproval(serializers.Serializer):
    """The signed approval (type ``permit_approval``) the permit's statement names."""

    approval_id = serializers.CharField()
    signed_statement = serializers.DictField()
    signature = serializers.CharField()
    key_id = serializers.CharField()
    transparency = evidence_transparency_field("approval")


class EvidenceBundleResponse(serializers.Serializer):
    """The single buyer-facing artifact: receipt, permit, its approval, ledger entry, audit event and checks."""

    receipt = ReceiptResponse()
    permit = EvidencePermit(allow_null=True)
    approval = EvidenceApproval(allow_null=True)
    ledger_entry = EvidenceLedgerEntry(allow_null=True)
    refund_ledger_entry = EvidenceLedgerEntry(allow_null=True)
    audit_event = EvidenceAuditEvent(allow_null=True)
    verification = VerificationMap()
    verified = serializers.BooleanField(help_text="True when every check is ok or skipped.")
    transparency = evidence_transparency_field("receipt")
    claim_boundary = serializers.CharField()


class ReceiptEvidenceResponse(EvidenceBundleResponse):
    """The evidence of one receipt (same content as the evidence bundle)."""


class PublicKeySet(serializers.Serializer):
    keys = serializers.ListField(child=serializers.DictField())


class PortableSigned(serializers.Serializer):
    """Another signed statement carried by a portable receipt: its exact signed bytes and signature."""

    signed_bytes = serializers.CharField(help_text="base64url of the RFC 8785 canonical bytes that were signed")
    signature = serializers.CharField()


class PortableReceiptResponse(serializers.Serializer):
    """A receipt verifiable offline: the exact signed bytes, signature, kid and a key snapshot; for a
    call under a permit a person approved, also the permit's and the approval's signed statements."""

    format = serializers.CharField()
    receipt_id = serializers.CharField()
    kid = serializers.CharField()
    alg = serializers.CharField()
    signed_bytes = serializers.CharField(help_text="base64url of the RFC 8785 canonical bytes that were signed")
    signed_bytes_sha256 = serializers.CharField()
    signature = serializers.CharField()
    receipt = serializers.DictField()
    permit = PortableSigned(required=False, help_text="The permit's statement, when it names an approval.")
    approval = PortableSigned(required=False, help_text="The approval (permit_approval) the permit names.")
    keys = PublicKeySet()
    what_a_valid_signature_proves = serializers.CharField()
    verify_with = serializers.CharField()
    transparency = serializers.DictField(
        required=False,
        help_text='Unsigned: {"leaf_index", "proof": "<tlog-proof@v1>"} once the receipt is in a checkpoint of '
        'its tenant\'s log, {"status": "pending", "fetch": "<url>"} before; absent for a receipt the log never had.',
    )


class ReceiptVerifyRequest(SignedDocumentVerifyRequest):
    """Verify by ``receipt_id``, or a receipt document (``receipt`` statement + ``signature``)."""

    id_field = "receipt_id"
    document_field = "receipt"

    receipt_id = serializers.CharField(required=False, max_length=40)
    receipt = serializers.DictField(required=False)
    signature = serializers.CharField(required=False, max_length=200)


class ReceiptVerifyResponse(serializers.Serializer):
    """Whether the receipt's signature verifies, and why not."""

    valid = serializers.BooleanField()
    reason = serializers.CharField(allow_null=True)
    receipt_id = serializers.CharField(allow_null=True)
    kid = serializers.CharField(allow_null=True)


class RefundReconciliationItem(serializers.ModelSerializer):
    """A refund owed for a receipt."""

    receipt_id = serializers.CharField()
    wallet_id = serializers.CharField(source="receipt.wallet_id")
    tool = serializers.CharField(source="receipt.tool")
    outcome = serializers.CharField(source="receipt.outcome")
    amount = MoneyField()
    refund_entry_id = serializers.CharField(allow_null=True)

    class Meta:
        model = RefundReconciliation
        fields = [
            "receipt_id",
            "wallet_id",
            "tool",
            "outcome",
            "amount",
            "status",
            "origin",
            "reason",
            "attempts",
            "last_error",
            "refund_entry_id",
            "created_at",
            "resolved_at",
        ]


RefundReconciliationListResponse = list_envelope("RefundReconciliationListResponse", RefundReconciliationItem)


class RefundReconciliationQuery(PageQuery):
    status = serializers.ChoiceField(choices=["pending", "resolved"], default="pending")


class RefundReconciliationRetryResponse(serializers.Serializer):
    """The item after the retry: ``resolved`` with the refund entry, or still ``pending`` with the reason."""

    item = RefundReconciliationItem()
    refunded = serializers.BooleanField()
