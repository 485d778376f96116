"""Authority reads, each scoped to what the caller may see (docs/architecture.md, "Tenancy and authority")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.db.models import F, Q, QuerySet
from django.utils import timezone

from access.selectors import Principal
from billing.models import Wallet
from billing.selectors import scope_to_caller, tool_price, wallet_spend
from common.errors import NotFound
from permits.exceptions import PolicyReadOnly
from permits.models import (
    Permit,
    PermitRequest,
    PermitRequestStatus,
    PermitStatus,
    PolicyBundle,
    Quote,
    TenantApprover,
)

L = TypeVar("L", PermitRequest, Quote)
V = TypeVar("V", Permit, PermitRequest, Quote, PolicyBundle)


def permit_status_filter(qs: QuerySet[Permit], status: str, now: datetime) -> QuerySet[Permit]:
    """Filter by effective status (``expired`` and ``exhausted`` are derived)."""
    exhausted = Q(spent_credits__gte=F("max_credits")) | Q(max_calls__isnull=False, calls_used__gte=F("max_calls"))
    live = Q(status=PermitStatus.ACTIVE)
    if status == PermitStatus.REVOKED:
        return qs.filter(status=PermitStatus.REVOKED)
    if status == PermitStatus.EXPIRED:
        return qs.filter(live, expires_at__lte=now)
    if status == PermitStatus.EXHAUSTED:
        return qs.filter(live, expires_at__gt=now).filter(exhausted)
    return qs.filter(live, expires_at__gt=now).exclude(exhausted)


def permits_visible(principal: Principal) -> QuerySet[Permit]:
    return scope_to_caller(Permit.objects.select_related("wallet"), principal)


def permit_list(principal: Principal, filters: dict[str, Any], *, wallet: Wallet | None = None) -> QuerySet[Permit]:
    qs = permits_visible(principal)
    if wallet is not None:
        qs = qs.filter(wallet=wallet)
    if filters.get("wallet_id"):
        qs = qs.filter(wallet_id=filters["wallet_id"])
    if filters.get("subject_key_id"):
        qs = qs.filter(subject_key_id=filters["subject_key_id"])
    if filters.get("status"):
        qs = permit_status_filter(qs, filters["status"], timezone.now())
    for name, lookup in (
        ("created_after", "created_at__gte"),
        ("created_before", "created_at__lt"),
        ("expires_after", "expires_at__gte"),
        ("expires_before", "expires_at__lt"),
    ):
        if filters.get(name) is not None:
            qs = qs.filter(**{lookup: filters[name]})
    return qs.order_by("-created_at", "permit_id")


def _one_visible(visible: QuerySet[V], what: str, **key: Any) -> V:
    """The row of ``visible`` (the caller's scope) with ``key``, or 404 naming ``what`` and the key: a row
    outside the caller's reach is answered as one that does not exist."""
    found = visible.filter(**key).first()
    if found is None:
        raise NotFound(f"No such {what}.", **key)
    return found


def permit_for_caller(principal: Principal, permit_id: str) -> Permit:
    return _one_visible(permits_visible(principal), "permit", permit_id=permit_id)


def permit_requests_visible(principal: Principal) -> QuerySet[PermitRequest]:
    return scope_to_caller(PermitRequest.objects.select_related("wallet", "permit", "approval"), principal)


def permit_request_for_caller(principal: Principal, request_id: str) -> PermitRequest:
    return _one_visible(permit_requests_visible(principal), "permit request", request_id=request_id)


def lapsing_status_filter(qs: QuerySet[L], status: str, now: datetime) -> QuerySet[L]:
    """The rows of ``qs`` whose effective status (``permits.models.Lapsing``) is ``status``: an open row
    past its expiry counts as expired, not open."""
    model = qs.model
    if status == model.OPEN_STATUS:
        return qs.filter(status=model.OPEN_STATUS, expires_at__gt=now)
    if status == model.EXPIRED_STATUS:
        return qs.filter(Q(status=model.EXPIRED_STATUS) | Q(status=model.OPEN_STATUS, expires_at__lte=now))
    return qs.filter(status=status)


def quotes_visible(principal: Principal) -> QuerySet[Quote]:
    return scope_to_caller(Quote.objects.all(), principal)


def quote_for_caller(principal: Principal, quote_id: str) -> Quote:
    return _one_visible(quotes_visible(principal), "quote", quote_id=quote_id)


def policies_visible(principal: Principal) -> QuerySet[PolicyBundle]:
    return scope_to_caller(PolicyBundle.objects.all(), principal)


def policy_for_caller(principal: Principal, policy_id: str) -> PolicyBundle:
    return _one_visible(policies_visible(principal), "policy bundle", policy_id=policy_id)


def policy_for_change(principal: Principal, policy_id: str) -> PolicyBundle:
    """The policy ``policy_id`` if the caller may change it; the one rule for policy writes.

    Authority flows down only (docs/architecture.md, "Tenancy and authority"). The operator changes any policy.
    A wallet key changes a policy only when both its owner wallet and the level its rules
    were last set at (``authority_wallet_id``: the creator's wallet, or that of the last
    key that changed it) are the key's own wallet or below it: a policy set or changed
    from above (by the sponsor, an ancestor agent or the operator) binds the key's wallet
    and is read-only to it (403 ``policy_read_only``), so an agent cannot lift a rule put
    on itself. A policy outside the caller's reach is 404, as for reads.
    """
    policy = policy_for_caller(principal, policy_id)
    if not principal.is_operator:
        assert principal.wallet_id is not None
        check_policy_level(policy, principal.wallet_id)
    return policy


def check_policy_level(policy: PolicyBundle, wallet_id: str) -> None:
    """Raise 403 ``policy_read_only`` unless the level ``policy``'s rules were last set at
    (``authority_wallet_id``) is ``wallet_id`` or below it (``policy_for_change``). Read again by
    ``policy_update`` on the locked row, so a change from above that commits first stands."""
    authority = policy.authority_wallet_id
    authority_path = (
        Wallet.objects.filter(wallet_id=authority).values_list("path", flat=True).first() if authority else None
    )
    if authority_path is None or wallet_id not in authority_path.split("/"):
        raise PolicyReadOnly(policy_id=policy.policy_id)


def policies_applying_to(wallet: Wallet) -> QuerySet[PolicyBundle]:
    """Policies attached to the wallet or any ancestor: the ones its calls are checked against."""
    return PolicyBundle.objects.filter(wallet_id__in=wallet.ancestry).order_by("created_at")


def policies_shown_to_wallet(wallet: Wallet) -> QuerySet[PolicyBundle]:
    """The policies ``/v1/me/authority`` lists for a key of ``wallet``: those on the wallet itself,
    enabled or not (the key reads them through ``policy_for_caller`` too), and the enabled ones on
    its ancestors, which bind it. A disabled policy above binds nothing and stays out of the key's
    reach, as ``policy_for_caller`` keeps it (404)."""
    return PolicyBundle.objects.filter(
        Q(wallet_id=wallet.wallet_id) | Q(wallet_id__in=wallet.ancestry, enabled=True)
    ).order_by("created_at")


def approver_tenants(user: Any) -> list[str]:
    if not user.is_authenticated:
        return []
    return list(TenantApprover.objects.filter(user_id=user.pk).values_list("tenant_id", flat=True))


def approval_queue(user: Any) -> QuerySet[PermitRequest]:
    """Requests of the tenants this user approves, pending first, newest first."""
    return (
        PermitRequest.objects.filter(tenant_id__in=approver_tenants(user))
        .select_related("wallet", "permit")
        .order_by("-created_at")
    )


# --- The permit request card ----------------------------------------------------------------


def _no_descriptions(names: list[str]) -> dict[str, str]:
    return {}


def _no_tools() -> list[str]:
    return []


# Set by the gateway app (mcpgateway.apps), which owns the tool registry; permits cannot import it.
describe_tools: Callable[[list[str]], dict[str, str]] = _no_descriptions
# The enabled tools' names (the console's policy form offers these and refuses any other name).
known_tools: Callable[[], list[str]] = _no_tools
# The upstream servers' slugs (the console's policy form offers these for ``allowed_servers``).
known_servers: Callable[[], list[str]] = _no_tools


def duration_words(seconds: float) -> str:
    """A duration for people: "2 hours", "1 day 6 hours", "45 minutes", "less than a minute"."""
    seconds = max(0, int(seconds))
    parts = []
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}{'s' if count != 1 else ''}")
        if len(parts) == 2:
            break
    return " ".join(parts) if parts else "less than a minute"


def permit_request_card_context(preq: PermitRequest, *, approval_url: str) -> dict[str, Any]:
    """What the approval card shows a non-technical approver: each tool with its description and price,
    the wallet's balance and daily spend beside the allowance, durations in words, the request's own
    expiry apart from the permit's lifetime, and the decision once taken (then no "decide" link)."""
    now = timezone.now()
    descriptions = describe_tools(list(preq.allowed_tools))
    tools = [
        {
            "name": name,
            "description": descriptions.get(name, ""),
            "price": tool_price(name) if "*" not in name else None,
        }
        for name in preq.allowed_tools
    ]
    wallet = preq.wallet
    status = preq.effective_status(now)
    tenant = Wallet.objects.filter(wallet_id=preq.tenant_id).only("wallet_id", "name").first()
    # The enabled policies of the wallet's line that require a person's approval, nearest first: the
    # reason the agent had to ask, and the caps that still bind the permit once approved.
    ancestry = list(wallet.ancestry)
    policies = sorted(
        PolicyBundle.objects.filter(wallet_id__in=ancestry, enabled=True, human_approval_required=True),
        key=lambda p: -ancestry.index(p.wallet_id) if p.wallet_id in ancestry else 0,
    )
    return {
        "preq": preq,
        "status": status,
        "pending": status == PermitRequestStatus.PENDING,
        "approval_url": approval_url,
        "now": now,
        "tools": tools,
        "balance": wallet.balance,
        "daily_spent": wallet_spend(wallet, now=now).today,
        "permit_lifetime": duration_words(preq.permit_ttl_seconds),
        "request_expires_in": duration_words((preq.expires_at - now).total_seconds()),
        "tenant_id": preq.tenant_id,
        "tenant_name": tenant.name if tenant is not None else "",
        "wallet_state": wallet.effective_status,
        "approval_policies": policies,
    }


def console_figures(user: Any, now: datetime) -> dict[str, Any]:
    """The console index's permits figures: requests waiting for a person, in all and per tenant
    (``view_permitrequest``), and the tenants whose approvers would never hear of a request
    (``view_tenantapprover``; ``notifications.approver_reachability``)."""
    from django.db.models import Count

    from permits.services.notifications import approver_reachability

    figures: dict[str, Any] = {}
    pending = PermitRequest.objects.filter(status="pending", expires_at__gt=now)
    if user.has_perm("permits.view_permitrequest"):
        figures["pending_requests"] = pending.count()
        by_tenant = list(pending.values("tenant_id").annotate(waiting=Count("pk")).order_by("-waiting")[:20])
        names = dict(Wallet.objects.filter(wallet_id__in=[t["tenant_id"] for t in by_tenant]).values_list("pk", "name"))
        figures["pending_by_tenant"] = [
            (t["tenant_id"], names.get(t["tenant_id"], ""), t["waiting"]) for t in by_tenant
        ]
    if user.has_perm("permits.view_tenantapprover"):
        tenants = set(TenantApprover.objects.values_list("tenant_id", flat=True))
        tenants |= set(pending.values_list("tenant_id", flat=True))
        unreachable = []
        for tenant_id in sorted(tenants)[:50]:
            reach = approver_reachability(tenant_id)
            if not reach.reachable:
                unreachable.append((tenant_id, "; ".join(reach.problems)))
        figures["unreachable_approvers"] = unreachable
    return figures
