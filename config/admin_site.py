"""The operator console's AdminSite: Django's, with failed logins throttled (billing.ratelimit)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from billing.ratelimit import throttle_failed_logins


class TollgateAdminSite(admin.AdminSite):
    site_header = "Tollgate operator console"
    site_title = "Tollgate console"

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        return super().index(request, {**(extra_context or {}), "summary": console_summary(request)})

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = throttle_failed_logins(super().login)(request, extra_context)
        assert isinstance(response, HttpResponse)
        return response


def console_summary(request: HttpRequest) -> dict[str, Any]:
    """The index page's summary: each figure only for a user allowed to see what it counts."""
    from datetime import timedelta

    from django.db.models import Sum
    from django.utils import timezone

    user, now = request.user, timezone.now()
    summary: dict[str, Any] = {}
    if user.has_perm("billing.view_wallet"):
        from billing.models import Wallet

        totals = Wallet.objects.values("tenant_id").annotate(total=Sum("balance")).order_by("-total")[:10]
        names = dict(Wallet.objects.filter(wallet_id__in=[t["tenant_id"] for t in totals]).values_list("pk", "name"))
        summary["tenants"] = [(t["tenant_id"], names.get(t["tenant_id"], ""), t["total"]) for t in totals]
    if user.has_perm("permits.view_permitrequest"):
        from permits.models import PermitRequest

        summary["pending_requests"] = PermitRequest.objects.filter(status="pending", expires_at__gt=now).count()
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
