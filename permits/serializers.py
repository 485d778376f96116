"""Request and response records for permits, permit requests, quotes and policies."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.models import ServiceCategory
from billing.serializers import MoneyField
from common.pagination import PageQuery, list_envelope
from common.schema import SignedDocumentVerifyRequest
from permits.models import POLICY_FIELDS, Permit, PermitRequest, PolicyBundle, PolicyChangeProposal, Quote
from permits.services.approval_record import permit_signed_approval
from permits.services.policies import policy_rules_problems

MAX_PERMIT_TTL = 30 * 24 * 3600


class ToolNameField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=200, allow_blank=False, **kwargs)


@extend_schema_field({"type": "string", "enum": list(ServiceCategory.values)})
class ServiceCategoryNameField(serializers.CharField):
    """A service category's name. The schema lists the categories; the value is checked, with the
    rest of a policy's rules, by ``policy_rules_problems``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=64, **kwargs)


class ServerSlugField(serializers.SlugField):
    """An upstream server's slug (``mcpgateway.models.UpstreamServer.slug``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=64, **kwargs)


def permit_servers_field(what: str) -> serializers.ListField:
    """A permit's (or a request's) ``allowed_servers`` in a body: optional, with no default, so a body
    without it hashes as before (its idempotency record still replays); null or absent: any server."""
    return serializers.ListField(
        child=ServerSlugField(),
        max_length=100,
        required=False,
        allow_null=True,
        help_text=f"{what}; null or absent: any server.",
    )


class StatusNowField(serializers.ChoiceField):
    """A record's status as of the request (its model's ``effective_status``): a permit, request, quote or
    proposal past ``expires_at`` reads as expired before anything writes the stored status back."""

    def __init__(self, *, choices: list[str], **kwargs: Any) -> None:
        super().__init__(choices=choices, source="*", read_only=True, **kwargs)

    def to_representation(self, value: Any) -> str:
        return value.effective_status(timezone.now())


class PermitTermsRequest(serializers.Serializer):
    """The terms of a permit as a body sends them: to issue one, or to ask a person for one."""

    wallet_id = serializers.CharField(max_length=40)
    allowed_tools = serializers.ListField(child=ToolNameField(), min_length=1, max_length=100)
    max_credits = serializers.DecimalField(max_digits=20, decimal_places=8, min_value=Decimal("0.00000001"))
    max_calls = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    expires_in_seconds = serializers.IntegerField(min_value=60, max_value=MAX_PERMIT_TTL, default=3600)
    subject_key_id = serializers.CharField(min_length=1, max_length=40, required=False, allow_null=True, default=None)


class PermitCreateRequest(PermitTermsRequest):
    """Issue a permit for ``wallet_id`` (the issuer is the caller's wallet)."""

    allowed_servers = permit_servers_field("The upstream servers (slugs) whose tools the permit covers")


class SignedDocumentField(serializers.JSONField):
    pass


class PermitApprovalReference(serializers.Serializer):
    """The approval a permit's signed statement names (docs/decisions.md, Authority, "Approvals are signed")."""

    approval_id = serializers.CharField()
    request_id = serializers.CharField()
    approver = serializers.CharField()
    decided_at = serializers.CharField()
    terms_digest = serializers.CharField()


class PermitApprovalResponse(serializers.Serializer):
    """A person's decision on a permit request, as signed (``signed_statement``, type ``permit_approval``)."""

    approval_id = serializers.CharField()
    decision = serializers.ChoiceField(choices=["approved", "rejected"])
    approver = serializers.CharField()
    decided_at = serializers.DateTimeField()
    permit_id = serializers.CharField(allow_null=True)
    terms_digest = serializers.CharField(allow_null=True)
    key_id = serializers.CharField()
    signature = serializers.CharField()
    signed_statement = serializers.DictField(help_text="The exact statement that was signed (RFC 8785 canonical form).")


class PermitTermsResponse(serializers.ModelSerializer):
    """The terms a permit grants and a permit request asks for, rendered alike by both records
    (each names its fields, in its order, in its ``Meta``)."""

    wallet_id = serializers.CharField()
    max_credits = MoneyField()
    allowed_tools = serializers.ListField(child=serializers.CharField())
    allowed_servers = serializers.ListField(child=serializers.CharField(), allow_null=True)


class PermitResponse(PermitTermsResponse):
    """A permit with its signed statement and live allowance figures. ``approval`` and
    ``issued_via_request_id`` come from the signed statement (empty when it names no approval or its
    signature does not verify), never from an unsigned column."""

    issuer_wallet_id = serializers.CharField(allow_null=True)
    status = StatusNowField(choices=["active", "revoked", "expired", "exhausted"])
    spent_credits = MoneyField()
    remaining_credits = serializers.SerializerMethodField()
    signed_statement = serializers.DictField(help_text="The exact statement that was signed (RFC 8785 canonical form).")
    issued_via_request_id = serializers.SerializerMethodField()
    approval = serializers.SerializerMethodField()

    class Meta:
        model = Permit
        fields = [
            "permit_id",
            "wallet_id",
            "issuer_wallet_id",
            "subject_key_id",
            "allowed_tools",
            "allowed_servers",
            "max_credits",
            "spent_credits",
            "remaining_credits",
            "max_calls",
            "calls_used",
            "status",
            "created_at",
            "expires_at",
            "revoked_at",
            "revoke_reason",
            "issued_via_request_id",
            "approval",
            "key_id",
            "signature",
            "signed_statement",
        ]

    @extend_schema_field(OpenApiTypes.STR)
    def get_remaining_credits(self, obj: Permit) -> str:
        return f"{(obj.max_credits - obj.spent_credits).quantize(Decimal('0.00000001')):f}"

    @extend_schema_field(OpenApiTypes.STR)
    def get_issued_via_request_id(self, obj: Permit) -> str:
        approval = permit_signed_approval(obj)
        return str(approval.get("request_id") or "") if approval is not None else ""

    @extend_schema_field(PermitApprovalReference(allow_null=True))
    def get_approval(self, obj: Permit) -> dict[str, Any] | None:
        return permit_signed_approval(obj)


PermitListResponse = list_envelope("PermitListResponse", PermitResponse)


class PermitListQuery(PageQuery):
    wallet_id = serializers.CharField(required=False)
    status = serializers.ChoiceField(choices=["active", "revoked", "expired", "exhausted"], required=False)
    subject_key_id = serializers.CharField(required=False)
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)
    expires_after = serializers.DateTimeField(required=False)
    expires_before = serializers.DateTimeField(required=False)


class MePermitListQuery(PermitListQuery):
    wallet_id = None  # type: ignore[assignment]
    subject_key_id = None  # type: ignore[assignment]


class PermitVerifyRequest(SignedDocumentVerifyRequest):
    """Verify a permit by id, or a full signed document (``permit`` statement + ``signature``)."""

    id_field = "permit_id"
    document_field = "permit"

    permit_id = serializers.CharField(required=False, max_length=40)
    permit = serializers.DictField(required=False, help_text="The signed statement, as in signed_statement.")
    signature = serializers.CharField(required=False, max_length=200)


class PermitVerifyResponse(serializers.Serializer):
    """Whether the permit is valid now, and every reason it is not."""

    valid = serializers.BooleanField()
    permit_id = serializers.CharField(allow_null=True)
    status = serializers.CharField(allow_null=True)
    signature_valid = serializers.BooleanField()
    key_id = serializers.CharField(allow_null=True)
    reasons = serializers.ListField(
        child=serializers.ChoiceField(
            choices=[
                "bad_signature",
                "approval_invalid",
                "unknown_key",
                "expired",
                "revoked",
                "exhausted",
                "unknown_permit",
            ]
        ),
        help_text="approval_invalid: the approval the permit's statement names does not hold "
        "(missing, edited, or not of this permit's terms).",
    )


class PermitRequestCreate(PermitTermsRequest):
    """Ask a human for a permit the agent cannot mint itself."""

    expires_in_seconds = serializers.IntegerField(
        min_value=60, max_value=MAX_PERMIT_TTL, default=3600, help_text="Lifetime of the permit once approved."
    )
    justification = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    allowed_servers = permit_servers_field("The upstream servers (slugs) whose tools the permit would cover")


class PermitRequestResponse(PermitTermsResponse):
    """A permit request; ``permit`` holds the minted permit once a human has approved it."""

    status = StatusNowField(choices=["pending", "approved", "rejected", "expired"])
    permit = PermitResponse(allow_null=True)
    approval = PermitApprovalResponse(allow_null=True, read_only=True)
    poll_url = serializers.SerializerMethodField()
    card_url = serializers.SerializerMethodField()
    permit_ttl_seconds = serializers.IntegerField()

    class Meta:
        model = PermitRequest
        fields = [
            "request_id",
            "wallet_id",
            "status",
            "allowed_tools",
            "allowed_servers",
            "max_credits",
            "max_calls",
            "permit_ttl_seconds",
            "subject_key_id",
            "justification",
            "created_at",
            "expires_at",
            "decided_at",
            "decision_note",
            "approval",
            "permit",
            "poll_url",
            "card_url",
        ]

    @extend_schema_field(OpenApiTypes.STR)
    def get_poll_url(self, obj: PermitRequest) -> str:
        return f"/v1/permit-requests/{obj.request_id}"

    @extend_schema_field(OpenApiTypes.STR)
    def get_card_url(self, obj: PermitRequest) -> str:
        return f"/v1/permit-requests/{obj.request_id}/card"


PermitRequestListResponse = list_envelope("PermitRequestListResponse", PermitRequestResponse)


class PermitRequestListQuery(PageQuery):
    status = serializers.ChoiceField(choices=["pending", "approved", "rejected", "expired"], required=False)


class QuoteCreateRequest(serializers.Serializer):
    """Quote one call of ``tool`` for ``wallet_id``."""

    wallet_id = serializers.CharField(max_length=40)
    tool = ToolNameField()


class QuoteResponse(serializers.ModelSerializer):
    """A signed price for one call; ``active`` means spendable."""

    wallet_id = serializers.CharField()
    status = StatusNowField(choices=["active", "consumed", "expired"])
    quoted_credits = MoneyField()
    signed_statement = serializers.DictField()

    class Meta:
        model = Quote
        fields = [
            "quote_id",
            "wallet_id",
            "tool",
            "quoted_credits",
            "status",
            "created_at",
            "expires_at",
            "consumed_at",
            "key_id",
            "signature",
            "signed_statement",
        ]


QuoteListResponse = list_envelope("QuoteListResponse", QuoteResponse)


class QuoteListQuery(PageQuery):
    status = serializers.ChoiceField(choices=["active", "consumed", "expired"], required=False)
    tool = serializers.CharField(required=False)


class PolicyRules(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False)
    allowed_tools = serializers.ListField(
        child=ToolNameField(), required=False, allow_null=True, help_text="null: any tool"
    )
    denied_tools = serializers.ListField(child=ToolNameField(), required=False)
    max_credits_per_call = serializers.DecimalField(
        max_digits=20, decimal_places=8, min_value=Decimal("0"), required=False, allow_null=True
    )
    max_daily_credits = serializers.DecimalField(
        max_digits=20,
        decimal_places=8,
        min_value=Decimal("0"),
        required=False,
        allow_null=True,
        help_text=(
            "Credits per UTC day for the subtree the policy binds: on an agent, the agent with every wallet "
            "below it; on a sponsor, each of its agents with every wallet below that agent. null: no cap."
        ),
    )
    allowed_categories = serializers.ListField(
        child=ServiceCategoryNameField(), required=False, allow_null=True, help_text="null: any category"
    )
    allowed_servers = serializers.ListField(
        child=ServerSlugField(),
        required=False,
        allow_null=True,
        help_text="The upstream servers (slugs) whose tools the bound wallets may call; null: any server.",
    )
    human_approval_required = serializers.BooleanField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The rules' contents are held to ``policy_rules_problems``, the check the console's form and
        the services run too. The lists are checked as sent: DRF's CharField would turn ``[1]`` into
        ``["1"]``, which the console (reading JSON) refuses."""
        sent = self.initial_data if isinstance(self.initial_data, dict) else {}
        rules: dict[str, Any] = dict(attrs)
        for name in ("allowed_tools", "denied_tools", "allowed_categories", "allowed_servers"):
            if name in attrs and name in sent:
                rules[name] = sent[name]
        errors: dict[str, Any] = {}
        for problem in policy_rules_problems(rules):
            node: dict[Any, Any] = errors
            for part in problem["loc"][:-1]:
                node = node.setdefault(part, {})
            node.setdefault(problem["loc"][-1], []).append(serializers.ErrorDetail(problem["msg"], problem["type"]))
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class PolicyBundleCreate(PolicyRules):
    """A policy bundle for ``wallet_id`` and every wallet below it."""

    wallet_id = serializers.CharField(max_length=40)


class PolicyBundlePatch(PolicyRules):
    """Change some rules; omitted fields keep their value."""


class PolicyBundleResponse(serializers.ModelSerializer):
    """A policy bundle."""

    wallet_id = serializers.CharField()
    max_credits_per_call = MoneyField(allow_null=True)
    max_daily_credits = MoneyField(allow_null=True)
    allowed_tools = serializers.ListField(child=serializers.CharField(), allow_null=True)
    denied_tools = serializers.ListField(child=serializers.CharField())
    allowed_categories = serializers.ListField(child=serializers.CharField(), allow_null=True)
    allowed_servers = serializers.ListField(child=serializers.CharField(), allow_null=True)

    class Meta:
        model = PolicyBundle
        fields = [
            "policy_id",
            "wallet_id",
            *POLICY_FIELDS,
            "created_by_wallet_id",
            "version",
            "created_at",
            "updated_at",
        ]


PolicyBundleListResponse = list_envelope("PolicyBundleListResponse", PolicyBundleResponse)


class PolicyChangeProposalResponse(serializers.ModelSerializer):
    """A policy change that relaxes human approval, recorded instead of applied: it takes effect only
    when a second person confirms it in the operator console before ``expires_at``."""

    policy_id = serializers.CharField()
    status = StatusNowField(choices=["pending", "confirmed", "rejected", "expired", "superseded"])
    relaxes = serializers.ListField(
        child=serializers.ChoiceField(choices=["enabled", "human_approval_required"]),
        help_text="The rules whose change relaxes human approval.",
    )
    changes = serializers.DictField(help_text="The rules the change sets, as they would be stored.")
    before = serializers.DictField(help_text="Those rules' values when the change was proposed.")

    class Meta:
        model = PolicyChangeProposal
        fields = [
            "proposal_id",
            "policy_id",
            "status",
            "relaxes",
            "changes",
            "before",
            "policy_version",
            "created_at",
            "expires_at",
            "decided_at",
        ]


class PolicyListQuery(PageQuery):
    wallet_id = serializers.CharField(required=False)


class AuthoritySummaryResponse(serializers.Serializer):
    """What the caller's own wallet may do right now."""

    wallet_id = serializers.CharField()
    wallet_type = serializers.CharField()
    wallet_status = serializers.CharField()
    balance = MoneyField()
    daily_spend = MoneyField()
    human_approval_required = serializers.BooleanField()
    policies = PolicyBundleResponse(many=True)
    active_permits = PermitResponse(many=True)
    pending_permit_requests = PermitRequestResponse(many=True)
