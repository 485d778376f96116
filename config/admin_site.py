"""The operator console's AdminSite: Django's, with failed logins throttled (billing.login_throttle) and
crafted requests refused before any console view runs (``refuse_crafted_requests``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib import admin
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from billing.login_throttle import throttle_failed_logins
from config.jsonbody import storable_text

# Lookups no console filter offers: a typed pattern is a PostgreSQL error ("invalid regular
# expression") or a slow scan, never a filter an operator needs.
REFUSED_LOOKUPS = frozenset({"regex", "iregex"})
View = TypeVar("View", bound=Callable[..., Any])


class TollgateAdminSite(admin.AdminSite):
    site_header = "Tollgate operator console"
    site_title = "Tollgate console"
    # The app list is on the index page and every page has breadcrumbs; the nav sidebar took 300 of
    # 1366 px from every list (docs/decisions.md, Operator console).
    enable_nav_sidebar = False

    def admin_view(self, view: View, cacheable: bool = False) -> View:
        """Every console page (each ModelAdmin's views and the site's own) refuses crafted requests,
        after Django's login check."""
        return super().admin_view(refuse_crafted_requests(view), cacheable)

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        return super().index(request, {**(extra_context or {}), "summary": console_summary(request)})

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = throttle_failed_logins(super().login)(request, extra_context)
        assert isinstance(response, HttpResponse)
        return response


def refuse_crafted_requests(view: View) -> View:
    """Wrap a console view so that what no console page sends is refused before the view runs.

    - a query or form key or value holding NUL or a lone surrogate (``config.jsonbody.storable_text``):
      400. PostgreSQL text cannot hold either; the query raised a 500. (A path holding NUL is
      already a 404, ``config.middleware``.)
    - a regex lookup in the query (``?name__regex=(``): 400, like any lookup the console refuses.
    - "Save as new" (``_saveasnew``) where the page does not offer it (``save_as`` false, as on
      every Tollgate page): 403. Django honours it anyway, turning a change page into the generic
      add form and skipping a custom ``add_view`` and its services.
    """
    owner = getattr(view, "__self__", None)  # the ModelAdmin (or the site) whose view this is

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        for query in (request.GET, request.POST):
            for key, values in query.lists():
                if any(storable_text(text) is None for text in (key, *values)):
                    raise BadRequest("A request value holds NUL or a lone surrogate.")
        for key in request.GET:
            if REFUSED_LOOKUPS.intersection(key.split(LOOKUP_SEP)):
                raise DisallowedModelAdminLookup(f"Filtering by {key} is not allowed.")
        if "_saveasnew" in request.POST and not getattr(owner, "save_as", False):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return cast(View, guarded)


def console_summary(request: HttpRequest) -> dict[str, Any]:
    """The index page's summary: each figure only for a user allowed to see what it counts."""
    from datetime import timedelta

    from django.db.models import Count, Sum
    from django.utils import timezone

    user, now = request.user, timezone.now()
    summary: dict[str, Any] = {}
    if user.has_perm("billing.view_wallet"):
        from billing.models import Wallet

        totals = Wallet.objects.values("tenant_id").annotate(total=Sum("balance")).order_by("-total")[:10]
        names = dict(Wallet.objects.filter(wallet_id__in=[t["tenant_id"] for t in totals]).values_list("pk", "name"))
        summary["tenants"] = [(t["tenant_id"], names.get(t["tenant_id"], ""), t["total"]) for t in totals]
    if user.has_perm("permits.view_permitrequest"):
        from billing.models import Wallet
        from permits.models import PermitRequest

        pending = PermitRequest.objects.filter(status="pending", expires_at__gt=now)
        summary["pending_requests"] = pending.count()
        by_tenant = list(pending.values("tenant_id").annotate(waiting=Count("pk")).order_by("-waiting")[:20])
        names = dict(Wallet.objects.filter(wallet_id__in=[t["tenant_id"] for t in by_tenant]).values_list("pk", "name"))
        summary["pending_by_tenant"] = [
            (t["tenant_id"], names.get(t["tenant_id"], ""), t["waiting"]) for t in by_tenant
        ]
    if user.has_perm("permits.view_tenantapprover"):
        # Tenants with approvers, or with requests waiting, whose approvers would never hear of a request.
        from permits.models import PermitRequest, TenantApprover
        from permits.services import approver_reachability

        tenants = set(TenantApprover.objects.values_list("tenant_id", flat=True))
        tenants |= set(
            PermitRequest.objects.filter(status="pending", expires_at__gt=now).values_list("tenant_id", flat=True)
        )
        unreachable = []
        for tenant_id in sorted(tenants)[:50]:
            reach = approver_reachability(tenant_id)
            if not reach.reachable:
                unreachable.append((tenant_id, "; ".join(reach.problems)))
        summary["unreachable_approvers"] = unreachable
    if user.has_perm("receipts.view_refundreconciliation"):
        from receipts.models import RefundReconciliation

        summary["open_reconciliation"] = RefundReconciliation.objects.filter(status="pending").count()
    if user.has_perm("mcpgateway.view_action"):
        from mcpgateway.models import Action

        summary["uncertain_actions"] = Action.objects.filter(state="delivery_uncertain", receipt__isnull=False).count()
    if user.has_perm("audit.view_alert"):
        from audit.models import Alert

        summary["alerts_24h"] = Alert.objects.filter(created_at__gte=now - timedelta(hours=24)).count()
    if user.has_perm("audit.view_auditevent"):
        from audit.models import ChainVerificationRecord

        summary["last_verification"] = ChainVerificationRecord.objects.order_by("-verified_at").first() or "never"
    return summary
