"""Audit reads, each with the caller's scope applied.

Scope (docs/architecture.md, "Tenancy and authority"): operator keys see every chain and event; a wallet
key sees the events about its own wallet and the wallets below it, never its
parent's or a sibling's (the audit app stores plain wallet ids; the wallet tree
comes from billing through ``Caller.wallet_ids_in_reach``). Events about no
wallet are operator-only. ``/v1/me/*`` narrows further to the caller's own wallet.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db.models import Count, JSONField, Q, QuerySet, Value
from django.db.models.fields.json import DataContains

from audit.models import (
    SYSTEM_CHAIN,
    Alert,
    AuditEvent,
    ChainHead,
    ChainVerificationRecord,
    SigningKey,
    SigningKeyState,
    detail_refs,
)
from common.errors import NotFound, WalletAccessDenied, WalletKeyRequired


class Caller(Protocol):
    """What audit reads of the authenticated caller, billing's ``Principal`` (audit sits below billing)."""

    @property
    def is_operator(self) -> bool: ...

    @property
    def tenant_id(self) -> str | None: ...

    @property
    def wallet_id(self) -> str | None: ...

    def wallet_ids_in_reach(self) -> Any: ...


EVENT_FILTERS = ("event", "wallet_id", "key_id", "tool", "endpoint", "policy_decision_id", "request_id", "ok")

# The columns and the detail keys that name the object an event is about, for the ``object_id`` filter.
# The detail lookups are JSON containment on the ids the detail names
# (``audit_detail_refs(detail) @> {"policy_id": ...}``, ``audit.models.detail_refs``), which the GIN index
# ``audit_detail_refs_path_ops`` answers; so is the ``actor`` filter. Only indexed columns take part, so
# every branch of the OR is an index scan: ``key_id`` (the acting key) and ``policy_decision_id`` have
# their own filters, and a key the event is about is in its detail. audit/sql/audit_detail_refs.sql
# lists the same keys and the actor (tests/test_audit_search_index.py).
OBJECT_ID_COLUMNS = ("wallet_id", "request_id", "event_id")
OBJECT_ID_DETAIL_KEYS = (
    "policy_id",
    "permit_id",
    "receipt_id",
    "quote_id",
    "action_id",
    "request_id",
    "key_id",
    "new_key_id",
    "old_key_id",
    "revoked_key_id",
    "subject_key_id",
    "operator_key_id",
    "entry_id",
    "ledger_entry_id",
    "refund_entry_id",
    "transaction_id",
    "parent_wallet_id",
    "note_id",
    "alert_id",
)


def object_id_q(object_id: str) -> Q:
    """Events whose columns or detail name ``object_id`` (see ``OBJECT_ID_DETAIL_KEYS``)."""
    q = Q()
    for column in OBJECT_ID_COLUMNS:
        q |= Q(**{column: object_id})
    for key in OBJECT_ID_DETAIL_KEYS:
        q |= _detail_names(key, object_id)
    return q


def actor_q(actor: str) -> Q:
    """Events recorded with ``detail.actor == actor`` (console changes: ``admin:<username>``)."""
    return _detail_names("actor", actor)


def _detail_names(key: str, value: str) -> Q:
    """Events whose detail has ``value`` at ``key`` (one of the keys ``audit_detail_refs`` keeps), asked of the
    indexed expression, so the search index answers it."""
    return Q(DataContains(detail_refs(), Value({key: value}, output_field=JSONField())))


def audit_events_visible(principal: Caller) -> QuerySet[AuditEvent]:
    """Events the caller may read: all for operators; for wallet keys, those about their subtree."""
    qs = AuditEvent.objects.all()
    if principal.is_operator:
        return qs
    return qs.filter(tenant_id=principal.tenant_id, wallet_id__in=principal.wallet_ids_in_reach())


def _filtered(qs: QuerySet[AuditEvent], params: dict[str, Any]) -> QuerySet[AuditEvent]:
    for name in EVENT_FILTERS:
        if params.get(name) is not None:
            qs = qs.filter(**{name: params[name]})
    if params.get("actor") is not None:
        qs = qs.filter(actor_q(params["actor"]))
    if params.get("object_id") is not None:
        qs = qs.filter(object_id_q(params["object_id"]))
    if params.get("created_after") is not None:
        qs = qs.filter(created_at__gte=params["created_after"])
    if params.get("created_before") is not None:
        qs = qs.filter(created_at__lt=params["created_before"])
    return qs


def audit_event_list(principal: Caller, params: dict[str, Any]) -> QuerySet[AuditEvent]:
    """The caller's visible events matching ``params``, newest first."""
    return _filtered(audit_events_visible(principal), params).order_by("-created_at", "-seq", "event_id")


def my_audit_event_list(principal: Caller, params: dict[str, Any]) -> QuerySet[AuditEvent]:
    """Events about the caller's own wallet (wallet keys only), newest first."""
    if principal.is_operator:
        raise WalletKeyRequired()
    qs = AuditEvent.objects.filter(tenant_id=principal.tenant_id, wallet_id=principal.wallet_id)
    return _filtered(qs, {**params, "wallet_id": None}).order_by("-created_at", "-seq", "event_id")


def audit_summary(
    principal: Caller, *, created_after: datetime | None, created_before: datetime | None
) -> dict[str, Any]:
    """Counts of visible events by event name and outcome over ``[created_after, created_before)``."""
    qs = _filtered(audit_events_visible(principal), {"created_after": created_after, "created_before": created_before})
    rows = (
        qs.order_by()
        .values("event")
        .annotate(total=Count("event_id"), ok=Count("event_id", filter=Q(ok=True)))
        .order_by("event")
    )
    by_event = [
        {"event": row["event"], "total": row["total"], "ok": row["ok"], "failed": row["total"] - row["ok"]}
        for row in rows
    ]
    total = sum(item["total"] for item in by_event)
    ok = sum(item["ok"] for item in by_event)
    return {
        "created_after": created_after,
        "created_before": created_before,
        "total": total,
        "ok": ok,
        "failed": total - ok,
        "by_event": by_event,
    }


def chain_for_caller(principal: Caller, chain: str | None) -> str:
    """The chain the caller asks to verify, if it may: 404 for a chain it cannot see or that does not exist.

    Default: the caller's tenant chain (``system`` for operator keys). The tenant chain
    holds every wallet's events, so among wallet keys only the tenant's root (sponsor)
    key, whose reach is the whole tenant, may verify it; keys lower in the tree get 403
    ``wallet_access_denied`` (their evidence bundles still report the chain check).
    """
    if not principal.is_operator:
        own = principal.tenant_id or SYSTEM_CHAIN
        if chain not in (None, own):
            raise NotFound("No such audit chain.", chain=chain)
        if principal.wallet_id != principal.tenant_id:
            raise WalletAccessDenied(
                "Verifying the tenant's audit chain needs the sponsor wallet's key or an operator key: "
                "the chain holds the events of wallets outside this key's reach.",
                wallet_id=principal.wallet_id,
            )
        return own
    if chain is None or chain == SYSTEM_CHAIN:
        return SYSTEM_CHAIN
    if not (ChainHead.objects.filter(chain=chain).exists() or AuditEvent.objects.filter(chain=chain).exists()):
        raise NotFound("No such audit chain.", chain=chain)
    return chain


def my_alerts(principal: Caller) -> QuerySet[Alert]:
    """Alerts of the caller's own wallet (wallet keys only), newest first."""
    if principal.is_operator:
        raise WalletKeyRequired()
    return Alert.objects.filter(tenant_id=principal.tenant_id, wallet_id=principal.wallet_id).order_by(
        "-created_at", "alert_id"
    )


def signing_key_get(key_id: str) -> SigningKey:
    key = SigningKey.objects.filter(key_id=key_id).first()
    if key is None:
        raise NotFound("No such signing key.", key_id=key_id)
    return key


def signing_keys_published() -> list[SigningKey]:
    """Every published key: the active one first, then retired keys, newest first."""
    keys = SigningKey.objects.all()
    return sorted(keys, key=lambda k: (k.state != SigningKeyState.ACTIVE, -k.created_at.timestamp(), k.key_id))


def console_figures(user: Any, now: datetime) -> dict[str, Any]:
    """The console index's audit figures: alerts of the last day (``view_alert``) and the last chain
    verification (``view_auditevent``)."""
    figures: dict[str, Any] = {}
    if user.has_perm("audit.view_alert"):
        figures["alerts_24h"] = Alert.objects.filter(created_at__gte=now - timedelta(hours=24)).count()
    if user.has_perm("audit.view_auditevent"):
        figures["last_verification"] = ChainVerificationRecord.objects.order_by("-verified_at").first() or "never"
    return figures
