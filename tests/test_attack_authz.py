"""Object-level authorization matrix (OWASP API1), driven by the OpenAPI document.

Every operation in ``/openapi.json`` that takes an identifier (a path or query
parameter, or a top-level request body field, named ``*_id`` or ``chain``) must
have a case in ``CASES`` or a documented entry in ``ALLOW_LIST``; a new
id-bearing operation without either fails ``test_every_id_bearing_operation_has_a_case``.

Each case aims tenant A's keys (sponsor and agent) at tenant B's objects
(wallets, keys, permits, a permit request, a quote, a policy, a receipt with a
refund owed), and A's agent key at its parent's and a sibling's objects. The
expected answers follow docs/architecture.md, "Tenancy and authority": wallet-addressed operations on a
wallet outside the caller's reach are 403 ``wallet_access_denied``;
object-addressed reads are 404 ``not_found``; list filters naming a foreign
object return nothing, and every unfiltered listing (audit events included)
shows nothing of the parent, a sibling or another tenant. Every probe must also leave the target untouched
(snapshots of its rows before and after) and must not echo any target
identifier the attacker did not send.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Count, Sum
from rest_framework.test import APIClient

from access.models import APIKey, KeyRotationLog
from audit.models import Alert, AuditEvent
from billing.models import ChargeIdempotency, LedgerEntry, Wallet
from billing.services import ledger_debit, tool_price_set
from common.ids import new_id
from mcpgateway import services as gateway_services
from mcpgateway.models import Action
from permits import services as permit_services
from permits.models import Permit, PermitRequest, PolicyBundle, Quote
from receipts.models import Receipt, RefundReconciliation
from receipts.selectors import request_document_hash
from receipts.services import receipt_issue, refund_reconciliation_open
from tests import factories
from tests.conftest import Tenant, client_for, make_tenant

pytestmark = pytest.mark.django_db

TOOL = "authz.echo"
HTTP_METHODS = ("get", "post", "put", "patch", "delete")
_keys = itertools.count(1)


# --- The schema side: which operations take an identifier ------------------------------------


def _is_id_name(name: str) -> bool:
    return name.endswith("_id") or name == "chain"


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        node = schema["components"]["schemas"][name]
    return node


def id_bearing_operations(schema: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    """(method, path) -> the identifier inputs of that operation (``path:wallet_id``, ``body:permit_id``...)."""
    found: dict[tuple[str, str], list[str]] = {}
    for path, item in schema["paths"].items():
        shared = item.get("parameters", [])
        for method, op in item.items():
            if method not in HTTP_METHODS:
                continue
            names = [f"{p['in']}:{p['name']}" for p in [*shared, *op.get("parameters", [])] if _is_id_name(p["name"])]
            for media in op.get("requestBody", {}).get("content", {}).values():
                body = _resolve(schema, media.get("schema") or {})
                names += [f"body:{name}" for name in body.get("properties", {}) if _is_id_name(name)]
            if names:
                found[(method, path)] = sorted(set(names))
    return found


# --- The world: attackers and the objects they aim at ----------------------------------------


@dataclass
class Attacker:
    label: str
    client: APIClient
    wallet_id: str
    key_id: str
    permit_id: str  # a permit of its own wallet, for the "foreign quote with my own permit" probe


@dataclass
class Target:
    """One wallet outside the attacker's reach and one object of every kind that belongs to it."""

    label: str
    wallet_id: str
    tenant_id: str
    key_id: str
    permit_id: str
    request_id: str
    quote_id: str
    policy_id: str
    receipt_id: str
    audit_event_id: str
    policy_decision_id: str
    correlation_id: str  # the request id of an audit event written for this wallet
    ledger_entry_id: str
    permit_statement: dict[str, Any]
    permit_signature: str
    receipt_statement: dict[str, Any]
    receipt_signature: str
    same_tenant: bool = False  # the attacker's own tenant (its parent or a sibling)
    is_parent: bool = False

    def ids(self) -> set[str]:
        return {
            self.wallet_id,
            self.key_id,
            self.permit_id,
            self.request_id,
            self.quote_id,
            self.policy_id,
            self.receipt_id,
            self.audit_event_id,
            self.policy_decision_id,
            self.correlation_id,
            self.ledger_entry_id,
        }


def register_tool() -> None:
    gateway_services.tools_sync(
        remote_tools=[{"name": TOOL, "description": "authz matrix tool", "inputSchema": {"type": "object"}}]
    )
    tool_price_set(tool=TOOL, credits=Decimal("2"))


def _issue_permit(issuer_client: APIClient, wallet_id: str) -> str:
    r = issuer_client.post(
        "/v1/permits",
        {"wallet_id": wallet_id, "allowed_tools": [TOOL], "max_credits": "50"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )
    assert r.status_code == 201, r.content
    return str(r.json()["permit_id"])


def build_target(
    label: str, wallet: Wallet, owner: APIClient, issuer: APIClient, *, same_tenant: bool, is_parent: bool = False
) -> Target:
    """Create, through the API with the wallet's own keys and through the services, one object of each kind."""
    factories.top_up(wallet, 20)
    target_key = factories.make_key(wallet, f"{label}-target")
    permit_id = _issue_permit(issuer, wallet.wallet_id)
    r = owner.post(
        "/v1/permit-requests",
        {"wallet_id": wallet.wallet_id, "allowed_tools": [TOOL], "max_credits": "5", "justification": label},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pr"),
    )
    assert r.status_code == 202, r.content
    request_id = r.json()["request_id"]
    r = owner.post("/v1/quotes", {"wallet_id": wallet.wallet_id, "tool": TOOL}, format="json")
    assert r.status_code == 201, r.content
    quote_id = r.json()["quote_id"]
    r = owner.post(
        "/v1/policies",
        {"wallet_id": wallet.wallet_id, "name": f"{label}-policy", "denied_tools": ["never.*"]},
        format="json",
    )
    assert r.status_code == 201, r.content
    policy_id = r.json()["policy_id"]
    quote_event = AuditEvent.objects.filter(event="quote.created", wallet_id=wallet.wallet_id).latest("created_at")
    assert quote_event.request_id, "audit events written during a request carry its request id"

    permit = Permit.objects.get(permit_id=permit_id)
    document = {"tool": TOOL, "arguments": {"text": label}}
    with transaction.atomic():
        permit_services.permit_reserve(permit=permit, amount=Decimal("2"))
        entry = ledger_debit(wallet=wallet.wallet_id, amount=Decimal("2"), service_category="tooling").entry
        receipt = receipt_issue(
            action_id=new_id("act"),
            wallet=Wallet.objects.get(pk=wallet.pk),
            api_key_id=target_key.key.key_id,
            tool=TOOL,
            outcome="failed_unrefunded",
            request_document=document,
            request_hash=request_document_hash(document),
            response_hash="ab" * 32,
            credits_authorized=Decimal("2"),
            credits_charged=Decimal("2"),
            permit=permit,
            ledger_entry=entry,
            policy_decision_id=new_id("pdec"),
            endpoint="/mcp",
        )
        refund_reconciliation_open(receipt=receipt, amount=Decimal("2"), origin="failed_unrefunded")
    permit.refresh_from_db()
    return Target(
        label=label,
        wallet_id=wallet.wallet_id,
        tenant_id=wallet.tenant_id,
        key_id=target_key.key.key_id,
        permit_id=permit_id,
        request_id=request_id,
        quote_id=quote_id,
        policy_id=policy_id,
        receipt_id=receipt.receipt_id,
        audit_event_id=receipt.audit_event_id,
        policy_decision_id=receipt.policy_decision_id,
        correlation_id=str(quote_event.request_id),
        ledger_entry_id=entry.entry_id,
        permit_statement=dict(permit.signed_statement),
        permit_signature=permit.signature,
        receipt_statement=dict(receipt.signed_statement),
        receipt_signature=receipt.signature,
        same_tenant=same_tenant,
        is_parent=is_parent,
    )


@dataclass
class World:
    a: Tenant
    b: Tenant
    attackers: dict[str, Attacker]
    targets: dict[str, Target]
    pairs: list[tuple[Attacker, Target]]


def build_world() -> World:
    register_tool()
    a = make_tenant("alpha")
    b = make_tenant("bravo")
    sibling = factories.make_wallet(a.sponsor, "alpha-sibling")
    sibling_client = client_for(factories.make_key(sibling, "sibling").secret)
    targets = {
        "B.sponsor": build_target("B.sponsor", b.sponsor, b.sponsor_client, b.sponsor_client, same_tenant=False),
        "B.agent": build_target("B.agent", b.agent, b.agent_client, b.sponsor_client, same_tenant=False),
        "A.sponsor(parent)": build_target(
            "A.sponsor(parent)", a.sponsor, a.sponsor_client, a.sponsor_client, same_tenant=True, is_parent=True
        ),
        "A.sibling": build_target("A.sibling", sibling, sibling_client, a.sponsor_client, same_tenant=True),
    }
    attackers = {
        "A.sponsor-key": Attacker(
            "A.sponsor-key",
            a.sponsor_client,
            a.sponsor.wallet_id,
            a.sponsor_key_id,
            _issue_permit(a.sponsor_client, a.sponsor.wallet_id),
        ),
        "A.agent-key": Attacker(
            "A.agent-key",
            a.agent_client,
            a.agent.wallet_id,
            a.agent_key_id,
            _issue_permit(a.sponsor_client, a.agent.wallet_id),
        ),
    }
    pairs = [
        (attackers["A.sponsor-key"], targets["B.sponsor"]),
        (attackers["A.sponsor-key"], targets["B.agent"]),
        (attackers["A.agent-key"], targets["B.sponsor"]),
        (attackers["A.agent-key"], targets["B.agent"]),
        (attackers["A.agent-key"], targets["A.sponsor(parent)"]),
        (attackers["A.agent-key"], targets["A.sibling"]),
    ]
    return World(a, b, attackers, targets, pairs)


# --- Snapshots: the target's rows before and after --------------------------------------------


def snapshot(t: Target) -> dict[str, Any]:
    w = t.wallet_id
    ledger = LedgerEntry.objects.filter(wallet_id=w).aggregate(n=Count("entry_id"), s=Sum("amount"))
    snap: dict[str, Any] = {
        "wallet": list(
            Wallet.objects.filter(wallet_id=w).values_list(
                "balance", "status", "total_spent", "name", "budget", "daily_limit", "frozen_reason", "updated_at"
            )
        ),
        "children": sorted(Wallet.objects.filter(parent_id=w).values_list("wallet_id", flat=True)),
        "keys": sorted(APIKey.objects.filter(wallet_id=w).values_list("key_id", "status", "revoked_at", "name")),
        "key_logs": KeyRotationLog.objects.filter(wallet_id=w).count(),
        "permits": sorted(
            Permit.objects.filter(wallet_id=w).values_list(
                "permit_id", "status", "spent_credits", "calls_used", "revoked_at"
            )
        ),
        "permit_requests": sorted(
            PermitRequest.objects.filter(wallet_id=w).values_list("request_id", "status", "permit_id", "decided_at")
        ),
        "quotes": sorted(Quote.objects.filter(wallet_id=w).values_list("quote_id", "status", "consumed_by")),
        "policies": sorted(
            (p.policy_id, p.version, p.enabled, p.name, json.dumps([p.allowed_tools, p.denied_tools]))
            for p in PolicyBundle.objects.filter(wallet_id=w)
        ),
        "receipts": sorted(Receipt.objects.filter(wallet_id=w).values_list("receipt_id", "outcome")),
        "reconciliation": sorted(
            RefundReconciliation.objects.filter(receipt__wallet_id=w).values_list("receipt_id", "status")
        ),
        "ledger": (ledger["n"], ledger["s"]),
        "charge_keys": ChargeIdempotency.objects.filter(wallet_id=w).count(),
        "actions": Action.objects.filter(wallet_id=w).count(),
        "alerts": Alert.objects.filter(wallet_id=w).count(),
        "audit_events_about_wallet": AuditEvent.objects.filter(wallet_id=w).count(),
    }
    if not t.same_tenant:
        # Nothing an outsider does may append to the other tenant's chain.
        snap["tenant_chain"] = AuditEvent.objects.filter(tenant_id=t.tenant_id).count()
    return snap


# --- Probes --------------------------------------------------------------------------------


Check = Callable[[Any], str | None]


@dataclass
class Probe:
    label: str
    method: str
    url: str
    check: Check
    body: dict[str, Any] | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    # Identifiers the response may contain (echoes of what the attacker sent, or documented visibility).
    may_show: set[str] = field(default_factory=set)
    # Only lists (filtered to nothing) and verify endpoints (answering "unknown") may succeed.
    allow_2xx: bool = False


def _json(r: Any) -> Any:
    try:
        return json.loads(r.content or b"null")
    except ValueError:
        return None


def _error_code(r: Any) -> str | None:
    body = _json(r)
    if isinstance(body, dict) and isinstance(body.get("detail"), dict):
        return body["detail"].get("error")
    return None


def denied(status: int, code: str) -> Check:
    def check(r: Any) -> str | None:
        if r.status_code != status or _error_code(r) != code:
            return f"expected {status} {code}, got {r.status_code} {r.content[:300]!r}"
        return None

    return check


WALLET_DENIED = denied(403, "wallet_access_denied")
NOT_FOUND = denied(404, "not_found")
OPERATOR_ONLY = denied(403, "operator_key_required")


def status_in(*statuses: int) -> Check:
    def check(r: Any) -> str | None:
        if r.status_code not in statuses:
            return f"expected one of {statuses}, got {r.status_code} {r.content[:300]!r}"
        return None

    return check


def empty_list(r: Any) -> str | None:
    body = _json(r)
    if r.status_code == 403 and _error_code(r) == "wallet_access_denied":
        return None
    if r.status_code != 200 or not isinstance(body, dict) or body.get("items") != [] or body.get("total") != 0:
        return f"expected an empty list (or 403), got {r.status_code} {r.content[:300]!r}"
    return None


def call_denied(reason_code: str) -> Check:
    def check(r: Any) -> str | None:
        body = _json(r)
        if (
            r.status_code != 403
            or not isinstance(body, dict)
            or body.get("outcome") != "denied"
            or body.get("reason_code") != reason_code
        ):
            return f"expected 403 denied/{reason_code}, got {r.status_code} {r.content[:300]!r}"
        return None

    return check


def permit_unknown(r: Any) -> str | None:
    body = _json(r)
    if (
        r.status_code != 200
        or not isinstance(body, dict)
        or body.get("valid") is not False
        or "unknown_permit" not in body.get("reasons", [])
        or body.get("status") is not None
    ):
        return f"expected valid=false, unknown_permit, no status; got {r.status_code} {r.content[:300]!r}"
    return None


def receipt_unknown(r: Any) -> str | None:
    body = _json(r)
    if r.status_code != 200 or not isinstance(body, dict) or body.get("reason") != "unknown_receipt":
        return f"expected valid=false, unknown_receipt; got {r.status_code} {r.content[:300]!r}"
    return None


def _idem() -> dict[str, str]:
    return {"HTTP_IDEMPOTENCY_KEY": f"authz-{next(_keys)}"}


Builder = Callable[[Attacker, Target], list[Probe]]


def _invoke(a: Attacker, t: Target) -> list[Probe]:
    url = f"/mcp/tools/{TOOL}/invoke"
    return [
        Probe(
            "invoke with the target's permit",
            "post",
            url,
            call_denied("permit_not_found"),
            {"arguments": {}, "permit_id": t.permit_id, "idempotency_key": new_id("k")},
        ),
        Probe(
            "invoke with the target's quote",
            "post",
            url,
            call_denied("quote_unavailable"),
            {"arguments": {}, "permit_id": a.permit_id, "quote_id": t.quote_id, "idempotency_key": new_id("k")},
        ),
    ]


def _verify_chain(a: Attacker, t: Target) -> list[Probe]:
    probes = [Probe("verify the system chain", "post", "/v1/audit/verify-chain", NOT_FOUND, {"chain": "system"})]
    if not t.same_tenant:
        probes.append(
            Probe("verify the target's chain", "post", "/v1/audit/verify-chain", NOT_FOUND, {"chain": t.tenant_id})
        )
    else:
        # The tenant chain holds the parent's and the siblings' events: only the sponsor's key verifies it.
        probes += [
            Probe("verify the tenant chain", "post", "/v1/audit/verify-chain", WALLET_DENIED, {"chain": t.tenant_id}),
            Probe("verify the default chain", "post", "/v1/audit/verify-chain", WALLET_DENIED, {}),
        ]
    return probes


def _audit_events(a: Attacker, t: Target) -> list[Probe]:
    # Reach is the subtree for every listing and filter (docs/architecture.md, the reach rule): a filter naming the
    # parent's, a sibling's or another tenant's objects matches nothing.
    return [
        Probe(f"audit events ?{name}", "get", f"/v1/audit/events?{name}={value}", empty_list, allow_2xx=True)
        for name, value in (
            ("wallet_id", t.wallet_id),
            ("key_id", t.key_id),
            ("policy_decision_id", t.policy_decision_id),
            ("request_id", t.correlation_id),
        )
    ]


def _permit_verify(a: Attacker, t: Target) -> list[Probe]:
    return [
        Probe("verify permit by id", "post", "/v1/permits/verify", permit_unknown, {"permit_id": t.permit_id}),
        Probe(
            "verify permit by document",
            "post",
            "/v1/permits/verify",
            permit_unknown,
            {"permit": t.permit_statement, "signature": t.permit_signature},
            # The caller sent the whole statement; only what it sent may come back.
            may_show={t.permit_id, t.wallet_id},
        ),
    ]


def _receipt_verify(a: Attacker, t: Target) -> list[Probe]:
    return [Probe("verify receipt by id", "post", "/v1/receipts/verify", receipt_unknown, {"receipt_id": t.receipt_id})]


def _simple(method: str, path: str, check: Check, body: Callable[[Attacker, Target], dict[str, Any]] | None = None, *,
            idempotent: bool = False, **path_ids: str) -> Builder:  # fmt: skip
    """One probe: ``path`` formatted with the target's (or attacker's) identifiers named in ``path_ids``."""

    def build(a: Attacker, t: Target) -> list[Probe]:
        values = {name: getattr(a if source.startswith("attacker.") else t, source.split(".")[-1])
                  for name, source in path_ids.items()}  # fmt: skip
        url = path.format(**values)
        return [
            Probe(
                f"{method.upper()} {url}",
                method,
                url,
                check,
                body(a, t) if body else None,
                _idem() if idempotent else {},
            )
        ]

    return build


def _many(*builders: Builder) -> Builder:
    def build(a: Attacker, t: Target) -> list[Probe]:
        return [p for b in builders for p in b(a, t)]

    return build


PERMIT_BODY: dict[str, Any] = {"allowed_tools": [TOOL], "max_credits": "5"}

# (method, path) -> case builder. Every id-bearing operation of the schema must be here or in ALLOW_LIST.
CASES: dict[tuple[str, str], Builder] = {
    ("post", "/mcp/tools/{service_id}/invoke"): _invoke,
    ("post", "/v1/api-keys"): _simple(
        "post", "/v1/api-keys", WALLET_DENIED, lambda a, t: {"wallet_id": t.wallet_id, "name": "stolen"}
    ),
    ("get", "/v1/api-keys/{wallet_id}"): _simple("get", "/v1/api-keys/{w}", WALLET_DENIED, w="target.wallet_id"),
    ("delete", "/v1/api-keys/{wallet_id}/{key_id}"): _many(
        _simple("delete", "/v1/api-keys/{w}/{k}", WALLET_DENIED, w="target.wallet_id", k="target.key_id"),
        # The caller's own wallet in the path, the target's key: no such key in this wallet.
        _simple("delete", "/v1/api-keys/{w}/{k}", NOT_FOUND, w="attacker.wallet_id", k="target.key_id"),
    ),
    ("get", "/v1/api-keys/{wallet_id}/logs"): _simple(
        "get", "/v1/api-keys/{w}/logs", WALLET_DENIED, w="target.wallet_id"
    ),
    ("post", "/v1/api-keys/emergency-revoke"): _simple(
        "post", "/v1/api-keys/emergency-revoke", WALLET_DENIED, lambda a, t: {"wallet_id": t.wallet_id}
    ),
    ("post", "/v1/api-keys/rotate"): _many(
        _simple(
            "post", "/v1/api-keys/rotate", WALLET_DENIED, lambda a, t: {"wallet_id": t.wallet_id, "key_id": t.key_id}
        ),
        _simple("post", "/v1/api-keys/rotate", NOT_FOUND, lambda a, t: {"wallet_id": a.wallet_id, "key_id": t.key_id}),
    ),
    ("get", "/v1/audit/events"): _audit_events,
    ("post", "/v1/audit/verify-chain"): _verify_chain,
    ("post", "/v1/billing/charge"): _many(
        _simple("post", "/v1/billing/charge?wallet_id={w}&units=1", WALLET_DENIED, w="target.wallet_id"),
        _simple(
            "post", "/v1/billing/charge?wallet_id={w}&units=1", WALLET_DENIED, idempotent=True, w="target.wallet_id"
        ),
    ),
    ("get", "/v1/billing/ledger/{wallet_id}"): _simple(
        "get", "/v1/billing/ledger/{w}", WALLET_DENIED, w="target.wallet_id"
    ),
    ("get", "/v1/billing/wallets/{wallet_id}"): _simple(
        "get", "/v1/billing/wallets/{w}", WALLET_DENIED, w="target.wallet_id"
    ),
    ("patch", "/v1/billing/wallets/{wallet_id}"): _simple(
        "patch",
        "/v1/billing/wallets/{w}",
        WALLET_DENIED,
        lambda a, t: {"name": "stolen", "daily_limit": None, "budget": None},
        w="target.wallet_id",
    ),
    ("post", "/v1/billing/wallets/agent"): _simple(
        "post",
        "/v1/billing/wallets/agent",
        WALLET_DENIED,
        lambda a, t: {"parent_wallet_id": t.wallet_id, "name": "squatter", "initial_balance": "1"},
    ),
    ("get", "/v1/evidence/{receipt_id}"): _simple("get", "/v1/evidence/{r}", NOT_FOUND, r="target.receipt_id"),
    ("get", "/v1/me/receipts"): _simple("get", "/v1/me/receipts?permit_id={p}", empty_list, p="target.permit_id"),
    ("get", "/v1/me/audit/events"): _many(
        _simple("get", "/v1/me/audit/events?request_id={c}", empty_list, c="target.correlation_id"),
        _simple("get", "/v1/me/audit/events?policy_decision_id={d}", empty_list, d="target.policy_decision_id"),
    ),
    ("get", "/v1/permit-requests/{request_id}"): _simple(
        "get", "/v1/permit-requests/{r}", NOT_FOUND, r="target.request_id"
    ),
    ("get", "/v1/permit-requests/{request_id}/card"): _simple(
        "get", "/v1/permit-requests/{r}/card", NOT_FOUND, r="target.request_id"
    ),
    ("post", "/v1/permit-requests"): _simple(
        "post",
        "/v1/permit-requests",
        WALLET_DENIED,
        lambda a, t: {"wallet_id": t.wallet_id, **PERMIT_BODY},
        idempotent=True,
    ),
    ("get", "/v1/permits"): _many(
        _simple("get", "/v1/permits?wallet_id={w}", empty_list, w="target.wallet_id"),
        _simple("get", "/v1/permits?subject_key_id={k}", empty_list, k="target.key_id"),
    ),
    ("post", "/v1/permits"): _many(
        _simple(
            "post",
            "/v1/permits",
            WALLET_DENIED,
            lambda a, t: {"wallet_id": t.wallet_id, **PERMIT_BODY},
            idempotent=True,
        ),
        # A permit for the caller's own wallet bound to the target's key: not a key of the subject wallet.
        _simple(
            "post",
            "/v1/permits",
            status_in(422),
            lambda a, t: {"wallet_id": a.wallet_id, "subject_key_id": t.key_id, **PERMIT_BODY},
            idempotent=True,
        ),
    ),
    ("get", "/v1/permits/{permit_id}"): _simple("get", "/v1/permits/{p}", NOT_FOUND, p="target.permit_id"),
    ("get", "/v1/permits/{permit_id}/receipts"): _simple(
        "get", "/v1/permits/{p}/receipts", NOT_FOUND, p="target.permit_id"
    ),
    ("post", "/v1/permits/{permit_id}/revoke"): _simple(
        "post", "/v1/permits/{p}/revoke", NOT_FOUND, p="target.permit_id"
    ),
    ("post", "/v1/permits/verify"): _permit_verify,
    ("get", "/v1/policies"): _simple("get", "/v1/policies?wallet_id={w}", empty_list, w="target.wallet_id"),
    ("post", "/v1/policies"): _simple(
        "post",
        "/v1/policies",
        WALLET_DENIED,
        lambda a, t: {"wallet_id": t.wallet_id, "name": "planted", "human_approval_required": True},
    ),
    ("get", "/v1/policies/{policy_id}"): _simple("get", "/v1/policies/{p}", NOT_FOUND, p="target.policy_id"),
    ("patch", "/v1/policies/{policy_id}"): _simple(
        "patch",
        "/v1/policies/{p}",
        NOT_FOUND,
        lambda a, t: {"enabled": False, "denied_tools": []},
        p="target.policy_id",
    ),
    ("post", "/v1/quotes"): _simple(
        "post", "/v1/quotes", WALLET_DENIED, lambda a, t: {"wallet_id": t.wallet_id, "tool": TOOL}
    ),
    ("get", "/v1/quotes/{quote_id}"): _simple("get", "/v1/quotes/{q}", NOT_FOUND, q="target.quote_id"),
    ("get", "/v1/receipts"): _many(
        _simple("get", "/v1/receipts?wallet_id={w}", empty_list, w="target.wallet_id"),
        _simple("get", "/v1/receipts?permit_id={p}", empty_list, p="target.permit_id"),
    ),
    ("get", "/v1/receipts/{receipt_id}"): _simple("get", "/v1/receipts/{r}", NOT_FOUND, r="target.receipt_id"),
    ("get", "/v1/receipts/{receipt_id}/evidence"): _simple(
        "get", "/v1/receipts/{r}/evidence", NOT_FOUND, r="target.receipt_id"
    ),
    ("get", "/v1/receipts/{receipt_id}/portable"): _simple(
        "get", "/v1/receipts/{r}/portable", NOT_FOUND, r="target.receipt_id"
    ),
    ("get", "/v1/receipts/permit/{permit_id}"): _many(
        _simple("get", "/v1/receipts/permit/{p}", NOT_FOUND, p="target.permit_id"),
        # The caller's own permit, filtered by the target's wallet: nothing.
        _simple(
            "get", "/v1/receipts/permit/{p}?wallet_id={w}", empty_list, p="attacker.permit_id", w="target.wallet_id"
        ),
    ),
    ("post", "/v1/receipts/reconciliation/refunds/{receipt_id}/retry"): _simple(
        # Operator-only whatever the receipt; the target's owed refund stays pending.
        "post",
        "/v1/receipts/reconciliation/refunds/{r}/retry",
        OPERATOR_ONLY,
        r="target.receipt_id",
    ),
    ("post", "/v1/receipts/verify"): _receipt_verify,
    # Upstream servers' credentials are the operator's, whichever tenant they name.
    ("put", "/v1/upstreams/{slug}/credentials"): _simple(
        "put",
        "/v1/upstreams/default/credentials",
        OPERATOR_ONLY,
        lambda a, t: {"tenant_id": t.tenant_id, "kind": "bearer", "token": "stolen"},
    ),
    ("delete", "/v1/upstreams/{slug}/credentials"): _simple(
        "delete", "/v1/upstreams/default/credentials?tenant_id={tenant}", OPERATOR_ONLY, tenant="target.tenant_id"
    ),
}

# Id-bearing operations deliberately without a cross-tenant case.
_PUBLIC_LOG = "a tenant's transparency log is public by design (docs/decisions.md, Evidence: who may read a log)"
ALLOW_LIST: dict[tuple[str, str], str] = {
    ("get", "/v1/signing-keys/{key_id}"): "evidence signing keys are public by design (docs/architecture.md, Evidence)",
    ("get", "/mcp/tools/{service_id}"): "the tool catalog is global, not tenant-owned (tools are not per tenant)",
    ("get", "/tlog/{tenant_id}/checkpoint"): _PUBLIC_LOG,
    ("get", "/tlog/{tenant_id}/consistency"): _PUBLIC_LOG,
    ("get", "/tlog/{tenant_id}/key"): _PUBLIC_LOG,
    ("get", "/tlog/{tenant_id}/proof/{statement_id}"): _PUBLIC_LOG,
    ("get", "/tlog/{tenant_id}/tile/{path}"): _PUBLIC_LOG,
}

# Operations without an identifier that wallet keys must not reach at all.
OPERATOR_ONLY_CASES: dict[tuple[str, str], Callable[[Attacker], Probe]] = {
    ("post", "/v1/billing/wallets/sponsor"): lambda a: Probe(
        "create a sponsor wallet",
        "post",
        "/v1/billing/wallets/sponsor",
        OPERATOR_ONLY,
        {"name": "rogue", "initial_credits": "1000"},
    ),
    ("post", "/v1/upstreams"): lambda a: Probe(
        "register an upstream server", "post", "/v1/upstreams", OPERATOR_ONLY, {"slug": "rogue", "url": "http://x/mcp"}
    ),
}

# Operations outside the OpenAPI body schemas that carry identifiers anyway (MCP _meta, session ids).
MCP_EXTRA = "MCP transports (ids in params._meta and Mcp-Session-Id, not described by a JSON body schema)"


def _rpc(tool: str, permit_id: str, quote_id: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"permit_id": permit_id, "idempotency_key": new_id("k")}
    if quote_id:
        meta["quote_id"] = quote_id
    return {
        "jsonrpc": "2.0",
        "id": next(_keys),
        "method": "tools/call",
        "params": {"name": tool, "arguments": {}, "_meta": meta},
    }


def rpc_denied(reason_code: str) -> Check:
    """The JSON-RPC answer of a refused tools/call: an error or an isError result naming the refusal."""

    def check(r: Any) -> str | None:
        text = r.content.decode(errors="replace")
        if r.status_code >= 500 or reason_code not in text or '"outcome": "success"' in text:
            return f"expected a {reason_code} refusal, got {r.status_code} {text[:300]!r}"
        return None

    return check


def mcp_probes(a: Attacker, t: Target) -> list[Probe]:
    return [
        Probe(
            "/mcp/messages with the target's permit",
            "post",
            "/mcp/messages",
            rpc_denied("permit_not_found"),
            _rpc(TOOL, t.permit_id),
            allow_2xx=True,  # JSON-RPC refusals are error objects in a 200 answer
        ),
        Probe(
            "/mcp/messages with the target's quote",
            "post",
            "/mcp/messages",
            rpc_denied("quote_unavailable"),
            _rpc(TOOL, a.permit_id, t.quote_id),
            allow_2xx=True,
        ),
    ]


# --- Running probes ------------------------------------------------------------------------


def run_probe(a: Attacker, t: Target, probe: Probe) -> str | None:
    payload = json.dumps(probe.body) if probe.body is not None else ""
    r = a.client.generic(
        probe.method.upper(), probe.url, data=payload, content_type="application/json", **probe.headers
    )
    where = f"[{a.label} -> {t.label}] {probe.label} ({probe.method.upper()} {probe.url})"
    if 200 <= r.status_code < 300 and not (
        probe.allow_2xx or probe.check in (empty_list, permit_unknown, receipt_unknown)
    ):
        return f"{where}: answered {r.status_code}: {r.content[:300]!r}"
    problem = probe.check(r)
    if problem:
        return f"{where}: {problem}"
    sent = json.dumps(probe.body or {}) + probe.url
    leaked = {i for i in t.ids() - probe.may_show if i in r.content.decode(errors="replace") and i not in sent}
    if leaked:
        return f"{where}: the response shows the target's identifiers {sorted(leaked)}: {r.content[:300]!r}"
    return None


@pytest.fixture
def world(settings: Any) -> World:
    settings.RATE_LIMIT_REQUESTS = 100_000
    return build_world()


@pytest.fixture
def schema(anon_client: APIClient) -> dict[str, Any]:
    r = anon_client.get("/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


# --- Tests ---------------------------------------------------------------------------------


def test_every_id_bearing_operation_has_a_case(schema):
    found = id_bearing_operations(schema)
    covered = set(CASES) | set(ALLOW_LIST)
    missing = sorted(set(found) - covered)
    stale = sorted(covered - set(found))
    assert not missing, "id-bearing operations without an authorization case:\n" + "\n".join(
        f"  {m.upper()} {p}: {found[(m, p)]}" for m, p in missing
    )
    assert not stale, f"cases for operations that are gone or no longer take an id: {stale}"
    for op in OPERATOR_ONLY_CASES:
        method, path = op
        assert method in schema["paths"].get(path, {}), f"operator-only operation vanished: {op}"


def test_cross_tenant_and_cross_wallet_matrix(world, schema):
    """Every case, for every (attacker, target) pair: refused as docs/architecture.md says, target unchanged."""
    failures: list[str] = []
    count = 0
    for attacker, target in world.pairs:
        # Per pair: the sponsor-key attacker's own refused calls land on its own wallet, a target of another pair.
        before = snapshot(target)
        probes = [p for build in CASES.values() for p in build(attacker, target)]
        probes += [make(attacker) for make in OPERATOR_ONLY_CASES.values()]
        probes += mcp_probes(attacker, target)
        for probe in probes:
            count += 1
            problem = run_probe(attacker, target, probe)
            if problem:
                failures.append(problem)
        after = snapshot(target)
        for key in before:
            if before[key] != after[key]:
                failures.append(
                    f"[{attacker.label} -> {target.label}] target changed: {key}: {before[key]!r} -> {after[key]!r}"
                )
    assert count > 300
    assert not failures, f"{len(failures)} of {count} probes failed:\n" + "\n".join(failures)


def _list_operations(schema: dict[str, Any]) -> list[str]:
    """Every GET without path parameters: lists, /v1/me views, catalogs, documents and pages."""
    paths = []
    for path, item in schema["paths"].items():
        op = item.get("get")
        if op is None or "{" in path:
            continue
        paths.append(path)
    return sorted(paths)


def test_nothing_of_the_target_is_listed(world, schema):
    """Every GET without path parameters (lists, /v1/me views, catalogs, pages) shows none of the target's ids."""
    failures: list[str] = []
    paths = _list_operations(schema)
    assert "/v1/permits" in paths
    assert "/v1/me/authority" in paths
    for attacker, target in world.pairs:
        for path in paths:
            r = attacker.client.get(path)
            if r.status_code >= 500 and str(r.status_code) not in schema["paths"][path]["get"]["responses"]:
                failures.append(f"[{attacker.label}] GET {path}: {r.status_code}")
                continue
            text = r.content.decode(errors="replace")
            allowed: set[str] = set()
            if target.is_parent:
                # The parent's wallet id is the caller's own tenant id, parent_wallet_id and permit issuer.
                allowed.add(target.wallet_id)
                if path == "/v1/me/authority":
                    # The authority summary lists the policies that govern the caller, its parent's included.
                    allowed.add(target.policy_id)
            leaked = sorted(i for i in target.ids() - allowed if i in text)
            if leaked:
                failures.append(f"[{attacker.label} -> {target.label}] GET {path} lists {leaked}")
    assert not failures, "\n".join(failures)


def test_mcp_session_of_another_tenant_is_not_usable(world):
    """A handshake session id belongs to the key that opened it: another tenant's key cannot ride it."""
    b_client = world.b.agent_client
    r = b_client.post(
        "/mcp",
        data=json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "b", "version": "1"},
                },
            }
        ),
        content_type="application/json",
    )
    assert r.status_code == 200, r.content
    sid = r["Mcp-Session-Id"]
    for attacker in world.attackers.values():
        r = attacker.client.post(
            "/mcp",
            data=json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            content_type="application/json",
            HTTP_MCP_SESSION_ID=sid,
            HTTP_MCP_PROTOCOL_VERSION="2025-11-25",
        )
        assert r.status_code in (400, 403, 404), (attacker.label, r.status_code, r.content)
        assert attacker.client.delete("/mcp", HTTP_MCP_SESSION_ID=sid).status_code == 404
    # B's session still works.
    r = b_client.post(
        "/mcp",
        data=json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
        content_type="application/json",
        HTTP_MCP_SESSION_ID=sid,
        HTTP_MCP_PROTOCOL_VERSION="2025-11-25",
    )
    assert r.status_code == 200, r.content


def test_operator_key_reaches_the_targets(world, operator_client):
    """Control: the same probes with an operator key are not refused for reach (the matrix is not vacuous)."""
    t = world.targets["B.agent"]
    assert operator_client.get(f"/v1/billing/wallets/{t.wallet_id}").status_code == 200
    assert operator_client.get(f"/v1/permits/{t.permit_id}").status_code == 200
    assert operator_client.get(f"/v1/receipts/{t.receipt_id}").status_code == 200
    assert operator_client.get(f"/v1/quotes/{t.quote_id}").status_code == 200
    assert operator_client.get(f"/v1/policies/{t.policy_id}").status_code == 200
    assert operator_client.get(f"/v1/permit-requests/{t.request_id}").status_code == 200
    # And the owners reach their own objects.
    assert world.b.agent_client.get(f"/v1/permits/{t.permit_id}").status_code == 200
    assert world.b.sponsor_client.get(f"/v1/receipts/{t.receipt_id}").status_code == 200


def test_permit_request_refuses_a_foreign_subject_key(world):
    attacker = world.attackers["A.agent-key"]
    for target in (world.targets["B.agent"], world.targets["A.sibling"]):
        before = PermitRequest.objects.filter(wallet_id=attacker.wallet_id).count()
        r = attacker.client.post(
            "/v1/permit-requests",
            {"wallet_id": attacker.wallet_id, "subject_key_id": target.key_id, **PERMIT_BODY},
            format="json",
            **_idem(),
        )
        assert r.status_code == 422, (target.label, r.status_code, r.content)
        assert r.json()["detail"][0]["loc"] == ["body", "subject_key_id"]
        assert PermitRequest.objects.filter(wallet_id=attacker.wallet_id).count() == before
