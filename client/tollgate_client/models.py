"""Result records.

The records a client reasons about (wallets, keys, permits, permit requests,
quotes, policies, receipts, evidence, tools, tool-call results) are frozen
dataclasses: amounts are :class:`~decimal.Decimal`, timestamps are aware
:class:`~datetime.datetime`, and ``raw`` keeps the JSON object exactly as the
gateway sent it (fields added by a later gateway version are there).
Auxiliary documents (ledger, pricing, charges, key logs, alerts, JWKS, the
portable receipt itself) are plain JSON objects (:data:`JSONObject`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Generic, TypeVar

__all__ = [
    "ApiKey",
    "Authority",
    "EmergencyRevocation",
    "Evidence",
    "JSONObject",
    "KeyRotation",
    "Page",
    "Permit",
    "PermitRequest",
    "PermitVerification",
    "Policy",
    "PortableVerification",
    "Quote",
    "Receipt",
    "ReceiptVerification",
    "Tool",
    "ToolCallResult",
    "ToolManifest",
    "Wallet",
]

JSONObject = dict[str, Any]
T = TypeVar("T")


def _dec(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def _dec0(value: Any) -> Decimal:
    return Decimal(str(value)) if value is not None else Decimal(0)


def _dt(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    return datetime.fromisoformat(value)


def _str(value: Any) -> str:
    return "" if value is None else str(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _opt_list(value: Any) -> list[str] | None:
    return None if value is None else _list(value)


def _obj(value: Any) -> JSONObject:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: ``{"items", "total", "limit", "offset"}``. Iterable over ``items``."""

    items: list[T]
    total: int
    limit: int
    offset: int

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @classmethod
    def parse(cls, data: Mapping[str, Any], item: Callable[[Any], T]) -> Page[T]:
        return cls(
            items=[item(x) for x in data.get("items") or []],
            total=int(data.get("total") or 0),
            limit=int(data.get("limit") or 0),
            offset=int(data.get("offset") or 0),
        )


@dataclass(frozen=True, kw_only=True)
class Wallet:
    wallet_id: str
    wallet_type: str
    parent_wallet_id: str | None
    tenant_id: str
    name: str
    status: str
    frozen_reason: str
    balance: Decimal
    daily_spent: Decimal
    total_spent: Decimal
    budget: Decimal | None
    daily_limit: Decimal | None
    refill_threshold: Decimal | None
    refill_amount: Decimal | None
    expires_at: datetime | None
    created_at: datetime | None
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Wallet:
        return cls(
            wallet_id=_str(d.get("wallet_id")),
            wallet_type=_str(d.get("wallet_type")),
            parent_wallet_id=_opt_str(d.get("parent_wallet_id")),
            tenant_id=_str(d.get("tenant_id")),
            name=_str(d.get("name")),
            status=_str(d.get("status")),
            frozen_reason=_str(d.get("frozen_reason")),
            balance=_dec0(d.get("balance")),
            daily_spent=_dec0(d.get("daily_spent")),
            total_spent=_dec0(d.get("total_spent")),
            budget=_dec(d.get("budget")),
            daily_limit=_dec(d.get("daily_limit")),
            refill_threshold=_dec(d.get("refill_threshold")),
            refill_amount=_dec(d.get("refill_amount")),
            expires_at=_dt(d.get("expires_at")),
            created_at=_dt(d.get("created_at")),
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class ApiKey:
    """An API key record. ``secret`` is set only on create and rotate (shown once); never printed by repr."""

    key_id: str
    wallet_id: str | None
    name: str
    masked_key: str
    status: str
    created_at: datetime | None
    revoked_at: datetime | None
    revoke_reason: str
    rotated_from: str
    secret: str | None = field(default=None, repr=False)
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ApiKey:
        return cls(
            key_id=_str(d.get("key_id")),
            wallet_id=_opt_str(d.get("wallet_id")),
            name=_str(d.get("name")),
            masked_key=_str(d.get("masked_key")),
            status=_str(d.get("status")),
            created_at=_dt(d.get("created_at")),
            revoked_at=_dt(d.get("revoked_at")),
            revoke_reason=_str(d.get("revoke_reason")),
            rotated_from=_str(d.get("rotated_from")),
            secret=_opt_str(d.get("secret")),
            raw={k: v for k, v in d.items() if k != "secret"},
        )


@dataclass(frozen=True, kw_only=True)
class KeyRotation:
    old_key_id: str
    old_key_revoked: bool
    new_key: ApiKey

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KeyRotation:
        return cls(
            old_key_id=_str(d.get("old_key_id")),
            old_key_revoked=bool(d.get("old_key_revoked")),
            new_key=ApiKey.from_dict(_obj(d.get("new_key"))),
        )


@dataclass(frozen=True, kw_only=True)
class EmergencyRevocation:
    wallet_id: str
    revoked_count: int
    revoked_key_ids: list[str]
    reason: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EmergencyRevocation:
        return cls(
            wallet_id=_str(d.get("wallet_id")),
            revoked_count=int(d.get("revoked_count") or 0),
            revoked_key_ids=_list(d.get("revoked_key_ids")),
            reason=_str(d.get("reason")),
        )


@dataclass(frozen=True, kw_only=True)
class Permit:
    """A signed permit. ``signed_statement`` + ``signature`` (+ ``key_id``) are the evidence."""

    permit_id: str
    wallet_id: str
    issuer_wallet_id: str | None
    subject_key_id: str | None
    allowed_tools: list[str]
    allowed_servers: list[str] | None  # the upstream servers (slugs) it covers; None: any
    max_credits: Decimal
    spent_credits: Decimal
    remaining_credits: Decimal
    max_calls: int | None
    calls_used: int
    status: str
    created_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None
    revoke_reason: str
    issued_via_request_id: str
    key_id: str
    signature: str
    signed_statement: JSONObject
    # The approval the signed statement names (approval_id, request_id, approver, decided_at,
    # terms_digest); None for a permit no person approved.
    approval: JSONObject | None = None
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Permit:
        max_calls = d.get("max_calls")
        return cls(
            permit_id=_str(d.get("permit_id")),
            wallet_id=_str(d.get("wallet_id")),
            issuer_wallet_id=_opt_str(d.get("issuer_wallet_id")),
            subject_key_id=_opt_str(d.get("subject_key_id")),
            allowed_tools=_list(d.get("allowed_tools")),
            allowed_servers=_opt_list(d.get("allowed_servers")),
            max_credits=_dec0(d.get("max_credits")),
            spent_credits=_dec0(d.get("spent_credits")),
            remaining_credits=_dec0(d.get("remaining_credits")),
            max_calls=None if max_calls is None else int(max_calls),
            calls_used=int(d.get("calls_used") or 0),
            status=_str(d.get("status")),
            created_at=_dt(d.get("created_at")),
            expires_at=_dt(d.get("expires_at")),
            revoked_at=_dt(d.get("revoked_at")),
            revoke_reason=_str(d.get("revoke_reason")),
            issued_via_request_id=_str(d.get("issued_via_request_id")),
            key_id=_str(d.get("key_id")),
            signature=_str(d.get("signature")),
            signed_statement=_obj(d.get("signed_statement")),
            approval=_obj(d["approval"]) if isinstance(d.get("approval"), Mapping) else None,
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class PermitVerification:
    valid: bool
    permit_id: str | None
    status: str | None
    signature_valid: bool
    key_id: str | None
    reasons: list[str]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PermitVerification:
        return cls(
            valid=bool(d.get("valid")),
            permit_id=_opt_str(d.get("permit_id")),
            status=_opt_str(d.get("status")),
            signature_valid=bool(d.get("signature_valid")),
            key_id=_opt_str(d.get("key_id")),
            reasons=_list(d.get("reasons")),
        )


@dataclass(frozen=True, kw_only=True)
class PermitRequest:
    """A request for a human to grant a permit. ``permit`` is the minted permit once approved."""

    request_id: str
    wallet_id: str
    status: str
    allowed_tools: list[str]
    allowed_servers: list[str] | None  # the upstream servers (slugs) the permit would cover; None: any
    max_credits: Decimal
    max_calls: int | None
    permit_ttl_seconds: int
    subject_key_id: str | None
    justification: str
    created_at: datetime | None
    expires_at: datetime | None
    decided_at: datetime | None
    decision_note: str
    permit: Permit | None
    poll_url: str
    card_url: str
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PermitRequest:
        permit = d.get("permit")
        max_calls = d.get("max_calls")
        return cls(
            request_id=_str(d.get("request_id")),
            wallet_id=_str(d.get("wallet_id")),
            status=_str(d.get("status")),
            allowed_tools=_list(d.get("allowed_tools")),
            allowed_servers=_opt_list(d.get("allowed_servers")),
            max_credits=_dec0(d.get("max_credits")),
            max_calls=None if max_calls is None else int(max_calls),
            permit_ttl_seconds=int(d.get("permit_ttl_seconds") or 0),
            subject_key_id=_opt_str(d.get("subject_key_id")),
            justification=_str(d.get("justification")),
            created_at=_dt(d.get("created_at")),
            expires_at=_dt(d.get("expires_at")),
            decided_at=_dt(d.get("decided_at")),
            decision_note=_str(d.get("decision_note")),
            permit=Permit.from_dict(permit) if isinstance(permit, Mapping) else None,
            poll_url=_str(d.get("poll_url")),
            card_url=_str(d.get("card_url")),
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class Quote:
    """A signed price for one call of ``tool`` (status ``active|consumed|expired``; 600 s lifetime)."""

    quote_id: str
    wallet_id: str
    tool: str
    quoted_credits: Decimal
    status: str
    created_at: datetime | None
    expires_at: datetime | None
    consumed_at: datetime | None
    key_id: str
    signature: str
    signed_statement: JSONObject
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Quote:
        return cls(
            quote_id=_str(d.get("quote_id")),
            wallet_id=_str(d.get("wallet_id")),
            tool=_str(d.get("tool")),
            quoted_credits=_dec0(d.get("quoted_credits")),
            status=_str(d.get("status")),
            created_at=_dt(d.get("created_at")),
            expires_at=_dt(d.get("expires_at")),
            consumed_at=_dt(d.get("consumed_at")),
            key_id=_str(d.get("key_id")),
            signature=_str(d.get("signature")),
            signed_statement=_obj(d.get("signed_statement")),
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A policy bundle applying to a wallet and the wallets below it."""

    policy_id: str
    wallet_id: str
    name: str
    enabled: bool
    allowed_tools: list[str] | None
    denied_tools: list[str]
    max_credits_per_call: Decimal | None
    max_daily_credits: Decimal | None
    allowed_categories: list[str] | None
    allowed_servers: list[str] | None  # upstream server slugs; None: any
    human_approval_required: bool
    version: int
    created_at: datetime | None
    updated_at: datetime | None
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Policy:
        return cls(
            policy_id=_str(d.get("policy_id")),
            wallet_id=_str(d.get("wallet_id")),
            name=_str(d.get("name")),
            enabled=bool(d.get("enabled", True)),
            allowed_tools=_opt_list(d.get("allowed_tools")),
            denied_tools=_list(d.get("denied_tools")),
            max_credits_per_call=_dec(d.get("max_credits_per_call")),
            max_daily_credits=_dec(d.get("max_daily_credits")),
            allowed_categories=_opt_list(d.get("allowed_categories")),
            allowed_servers=_opt_list(d.get("allowed_servers")),
            human_approval_required=bool(d.get("human_approval_required")),
            version=int(d.get("version") or 0),
            created_at=_dt(d.get("created_at")),
            updated_at=_dt(d.get("updated_at")),
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class PolicyChangeProposal:
    """A policy change that relaxes human approval (202 from ``PATCH /v1/policies/{id}``): nothing
    changed yet; it applies when a second person confirms it in the operator console."""

    proposal_id: str
    policy_id: str
    status: str
    relaxes: list[str]
    changes: JSONObject
    before: JSONObject
    policy_version: int
    created_at: datetime | None
    expires_at: datetime | None
    decided_at: datetime | None
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PolicyChangeProposal:
        return cls(
            proposal_id=_str(d.get("proposal_id")),
            policy_id=_str(d.get("policy_id")),
            status=_str(d.get("status")),
            relaxes=_list(d.get("relaxes")),
            changes=_obj(d.get("changes")),
            before=_obj(d.get("before")),
            policy_version=int(d.get("policy_version") or 0),
            created_at=_dt(d.get("created_at")),
            expires_at=_dt(d.get("expires_at")),
            decided_at=_dt(d.get("decided_at")),
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class Receipt:
    """The signed receipt of one governed action (every outcome, including denials)."""

    receipt_id: str
    action_id: str
    permit_id: str | None
    wallet_id: str
    api_key_id: str
    tool: str
    outcome: str
    reason_code: str
    request_hash: str
    response_hash: str
    credits_authorized: Decimal
    credits_charged: Decimal
    ledger_entry_id: str | None
    refund_entry_id: str | None
    audit_event_id: str
    policy_decision_id: str
    quote_id: str
    created_at: datetime | None
    key_id: str
    signature: str
    signed_statement: JSONObject
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)
    # The upstream server the call was sent to and its URL (None: a local tool, a refused call, or a
    # receipt issued before the gateway recorded them).
    upstream_server_id: str | None = None
    upstream_url: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Receipt:
        return cls(
            receipt_id=_str(d.get("receipt_id")),
            action_id=_str(d.get("action_id")),
            permit_id=_opt_str(d.get("permit_id")),
            wallet_id=_str(d.get("wallet_id")),
            api_key_id=_str(d.get("api_key_id")),
            tool=_str(d.get("tool")),
            outcome=_str(d.get("outcome")),
            reason_code=_str(d.get("reason_code")),
            request_hash=_str(d.get("request_hash")),
            response_hash=_str(d.get("response_hash")),
            credits_authorized=_dec0(d.get("credits_authorized")),
            credits_charged=_dec0(d.get("credits_charged")),
            ledger_entry_id=_opt_str(d.get("ledger_entry_id")),
            refund_entry_id=_opt_str(d.get("refund_entry_id")),
            audit_event_id=_str(d.get("audit_event_id")),
            policy_decision_id=_str(d.get("policy_decision_id")),
            quote_id=_str(d.get("quote_id")),
            created_at=_dt(d.get("created_at")),
            key_id=_str(d.get("key_id")),
            signature=_str(d.get("signature")),
            signed_statement=_obj(d.get("signed_statement")),
            raw=dict(d),
            upstream_server_id=_opt_str(d.get("upstream_server_id")),
            upstream_url=_opt_str(d.get("upstream_url")),
        )


@dataclass(frozen=True, kw_only=True)
class ReceiptVerification:
    valid: bool
    reason: str | None
    receipt_id: str | None
    kid: str | None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReceiptVerification:
        return cls(
            valid=bool(d.get("valid")),
            reason=_opt_str(d.get("reason")),
            receipt_id=_opt_str(d.get("receipt_id")),
            kid=_opt_str(d.get("kid")),
        )


@dataclass(frozen=True, kw_only=True)
class PortableVerification:
    """The offline verdict on a portable receipt: ``valid``, a stable ``reason`` code when not.

    ``inclusion`` says what became of its transparency-log proof (tollgate_client.tlog.policy):
    ``verified``, ``not_checked`` (no proof, or no policy), ``pending`` or ``failed``;
    ``inclusion_detail`` explains it in words.
    """

    valid: bool
    reason: str | None
    receipt_id: str | None = None
    kid: str | None = None
    outcome: str | None = None
    inclusion: str = "not_checked"
    inclusion_detail: str = ""

    def __bool__(self) -> bool:
        return self.valid


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """The evidence bundle: receipt, permit, ledger entries, audit event and the ``verification`` map."""

    receipt: Receipt
    permit: JSONObject | None
    ledger_entry: JSONObject | None
    refund_ledger_entry: JSONObject | None
    audit_event: JSONObject | None
    verification: dict[str, str]
    verified: bool
    claim_boundary: str
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Evidence:
        def opt(name: str) -> JSONObject | None:
            value = d.get(name)
            return dict(value) if isinstance(value, Mapping) else None

        return cls(
            receipt=Receipt.from_dict(_obj(d.get("receipt"))),
            permit=opt("permit"),
            ledger_entry=opt("ledger_entry"),
            refund_ledger_entry=opt("refund_ledger_entry"),
            audit_event=opt("audit_event"),
            verification={str(k): str(v) for k, v in _obj(d.get("verification")).items()},
            verified=bool(d.get("verified")),
            claim_boundary=_str(d.get("claim_boundary")),
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class Authority:
    """``GET /v1/me/authority``: what the caller's wallet may do right now."""

    wallet_id: str
    wallet_type: str
    wallet_status: str
    balance: Decimal
    daily_spend: Decimal
    human_approval_required: bool
    policies: list[Policy]
    active_permits: list[Permit]
    pending_permit_requests: list[PermitRequest]
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Authority:
        return cls(
            wallet_id=_str(d.get("wallet_id")),
            wallet_type=_str(d.get("wallet_type")),
            wallet_status=_str(d.get("wallet_status")),
            balance=_dec0(d.get("balance")),
            daily_spend=_dec0(d.get("daily_spend")),
            human_approval_required=bool(d.get("human_approval_required")),
            policies=[Policy.from_dict(p) for p in d.get("policies") or []],
            active_permits=[Permit.from_dict(p) for p in d.get("active_permits") or []],
            pending_permit_requests=[PermitRequest.from_dict(p) for p in d.get("pending_permit_requests") or []],
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool definition (MCP shape) with Tollgate's price and category from ``_meta``."""

    name: str
    description: str
    title: str | None
    input_schema: JSONObject
    output_schema: JSONObject | None
    annotations: JSONObject | None
    category: str | None
    price_credits: Decimal | None
    callable: bool
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Tool:
        meta = _obj(d.get("_meta"))
        output_schema, annotations = d.get("outputSchema"), d.get("annotations")
        return cls(
            name=_str(d.get("name")),
            description=_str(d.get("description")),
            title=_opt_str(d.get("title")),
            input_schema=_obj(d.get("inputSchema")),
            output_schema=dict(output_schema) if isinstance(output_schema, Mapping) else None,
            annotations=dict(annotations) if isinstance(annotations, Mapping) else None,
            category=_opt_str(meta.get("io.tollgate/category")),
            price_credits=_dec(meta.get("io.tollgate/price-credits")),
            callable=bool(meta.get("io.tollgate/callable")),
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class ToolManifest:
    name: str
    version: str
    mcp_endpoint: str | None
    tools: list[Tool]
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolManifest:
        return cls(
            name=_str(d.get("name")),
            version=_str(d.get("version")),
            mcp_endpoint=_opt_str(d.get("mcp_endpoint")),
            tools=[Tool.from_dict(t) for t in d.get("tools") or []],
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class ToolCallResult:
    """The answer to one governed tool call. Every outcome has a receipt.

    ``outcome`` is ``success``, ``tool_error``, ``denied``,
    ``insufficient_funds``, ``failed_refunded``, ``failed_unrefunded``,
    ``response_rejected`` or ``delivery_uncertain``. ``result`` is the MCP
    ``CallToolResult`` when the tool answered (``success``, ``tool_error``);
    otherwise ``error`` is the JSON-RPC error object (``code``, ``message``,
    ``data`` with ``error`` = the reason code). ``replayed`` is true when the
    gateway returned the stored answer of an earlier call with the same
    ``idempotency_key``. ``delivery_uncertain`` needs external reconciliation:
    never retry it with a new key.
    """

    outcome: str
    receipt_id: str
    action_id: str
    replayed: bool
    idempotency_key: str
    credits_charged: Decimal | None
    reason_code: str | None
    result: JSONObject | None
    error: JSONObject | None

    @property
    def ok(self) -> bool:
        return self.outcome == "success"

    @property
    def is_error(self) -> bool:
        return self.outcome != "success"

    @property
    def structured_content(self) -> JSONObject | None:
        value = (self.result or {}).get("structuredContent")
        return dict(value) if isinstance(value, Mapping) else None

    @property
    def content(self) -> list[JSONObject]:
        value = (self.result or {}).get("content")
        return [dict(c) for c in value if isinstance(c, Mapping)] if isinstance(value, list) else []
