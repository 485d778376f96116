"""Operator console: receipts (read-only) and refund reconciliation (retry through the service)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from rest_framework.renderers import JSONRenderer

from billing.admin import credits_column, money_display
from common.console import (
    ReadOnlyAdmin,
    changelist_link,
    confirmation_page,
    console_actor,
    console_each,
    console_page,
    has_perm,
)
from common.listing import short_id_column
from receipts import selectors, services
from receipts.models import Outcome, Receipt, RefundReconciliation
from receipts.serializers import EvidenceBundleResponse


class ReconciliationAdmin(ReadOnlyAdmin):
    """A read-only page whose one change is an external reconciliation action, under ``receipts.reconcile``.

    Receipts are signed and immutable, actions are the gateway's record, and an owed refund changes only
    through its retry action: none of them is added, changed or deleted on its page.
    """

    def has_reconcile_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "receipts.reconcile")


@admin.register(Receipt)
class ReceiptAdmin(ReconciliationAdmin):
    list_display = ["receipt_short", "created_at", "wallet_short", "tool", "outcome", "credits_col"]
    receipt_short = short_id_column("receipt_id", "receipt")
    wallet_short = short_id_column("wallet_id", "wallet", link_to="billing.wallet")
    list_filter = ["outcome"]
    search_fields = ["receipt_id", "action_id", "wallet__wallet_id", "api_key_id", "tool"]
    ordering = ["-created_at"]
    date_hierarchy = "created_at"
    credits_col = credits_column("credits_charged", "credits")

    @admin.display(description="downloads")
    def downloads(self, obj: Receipt) -> str:
        """The portable receipt (verifiable offline) and the evidence bundle, as the API serves them."""
        portable = reverse("admin:receipts_receipt_portable", args=[quote(obj.pk)])
        evidence = reverse("admin:receipts_receipt_evidence", args=[quote(obj.pk)])
        return format_html(
            '<a href="{}" id="download-portable" download>Portable receipt (JSON)</a> · '
            '<a href="{}" id="download-evidence" download>Evidence bundle (JSON)</a>',
            portable,
            evidence,
        )

    def get_urls(self) -> list[Any]:
        downloads = [
            console_page(self, "<str:receipt_id>/portable.json", self.portable_view, "receipts_receipt_portable"),
            console_page(self, "<str:receipt_id>/evidence.json", self.evidence_view, "receipts_receipt_evidence"),
        ]
        return [*downloads, *super().get_urls()]

    def _receipt(self, request: HttpRequest, receipt_id: str) -> Receipt:
        receipt = Receipt.objects.select_related("permit", "ledger_entry").filter(pk=unquote(receipt_id)).first()
        if receipt is None or not self.has_view_permission(request, receipt):
            raise PermissionDenied
        return receipt

    def _download(self, data: Any, filename: str) -> HttpResponse:
        response = HttpResponse(JSONRenderer().render(data), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response

    def portable_view(self, request: HttpRequest, receipt_id: str) -> HttpResponse:
        receipt = self._receipt(request, receipt_id)
        return self._download(selectors.portable_receipt(receipt), f"{receipt.receipt_id}.portable.json")

    def evidence_view(self, request: HttpRequest, receipt_id: str) -> HttpResponse:
        receipt = self._receipt(request, receipt_id)
        bundle = EvidenceBundleResponse(selectors.evidence_bundle(receipt)).data
        return self._download(bundle, f"{receipt.receipt_id}.evidence.json")

    @admin.display(description="related")
    def related(self, obj: Receipt) -> str:
        links = [
            changelist_link("mcpgateway.action", "action", action_id=obj.action_id),
            changelist_link("audit.auditevent", "audit event", event_id=obj.audit_event_id or ""),
        ]
        if obj.ledger_entry_id:
            links.append(changelist_link("billing.ledgerentry", "ledger entry", entry_id=obj.ledger_entry_id))
        return format_html_join(" · ", "{}", ((link,) for link in links))

    actions = ["mark_not_executed"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["downloads", "related", *[f.name for f in Receipt._meta.fields]]

    @admin.action(
        description="External reconciliation: the call was NOT executed (refund owed)…", permissions=["reconcile"]
    )
    def mark_not_executed(self, request: HttpRequest, queryset: QuerySet[Receipt]) -> HttpResponse | None:
        page = confirmation_page(
            self,
            request,
            queryset.filter(outcome=Outcome.DELIVERY_UNCERTAIN).order_by("receipt_id"),
            action="mark_not_executed",
            title="Record that these calls were NOT executed?",
            warning="Each receipt's charge becomes owed back to its wallet (a pending refund item; post it with a "
            "retry). Record this only after confirming with the upstream that the call did not run.",
            headings=["Receipt", "Wallet", "Tool", "Credits to refund"],
            row=lambda r: [r.receipt_id, r.wallet_id, r.tool, money_display(r.credits_charged)],
            confirm_label="Yes, they were not executed",
        )
        if page is not None:
            return page
        done = console_each(
            self,
            request,
            queryset.filter(outcome=Outcome.DELIVERY_UNCERTAIN),
            name=lambda r: r.receipt_id,
            act=lambda r: services.refund_reconciliation_mark_not_executed(
                receipt_id=r.receipt_id, actor=console_actor(request)
            ),
            log=lambda r, _: "Marked not executed (external reconciliation): a refund is owed",
        )
        self.message_user(
            request,
            f"{len(done)} receipt(s) marked not executed; retry their refunds under reconciliation.",
            messages.INFO,
        )
        return None


@admin.register(RefundReconciliation)
class RefundReconciliationAdmin(ReconciliationAdmin):
    list_display = ["receipt_short", "amount_col", "status", "origin", "attempts", "last_error", "created_at"]
    receipt_short = short_id_column("receipt_id", "receipt")
    amount_col = credits_column("amount", "amount")
    list_filter = ["status", "origin"]
    search_fields = ["receipt__receipt_id", "receipt__wallet__wallet_id"]
    ordering = ["-created_at"]
    actions = ["retry_selected"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in RefundReconciliation._meta.fields]

    @admin.action(description="Retry: post the owed refund (at most once)…", permissions=["reconcile"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[RefundReconciliation]) -> HttpResponse | None:
        page = confirmation_page(
            self,
            request,
            queryset.filter(status="pending").select_related("receipt").order_by("receipt_id"),
            action="retry_selected",
            title="Post these owed refunds?",
            warning="Each refund moves credits from revenue back to the wallet, at most once per receipt.",
            headings=["Receipt", "Wallet", "Amount", "Attempts", "Last error"],
            row=lambda i: [i.receipt_id, i.receipt.wallet_id, money_display(i.amount), i.attempts, i.last_error or "—"],
            confirm_label="Yes, post them",
        )
        if page is not None:
            return page
        statuses = console_each(
            self,
            request,
            queryset,
            name=lambda i: i.receipt_id,
            act=lambda i: (
                services.refund_reconciliation_retry(receipt_id=i.receipt_id, actor=console_actor(request)).status
            ),
            log=lambda i, status: f"Retried the owed refund: {status}",
        )
        resolved = statuses.count("resolved")
        self.message_user(request, f"{resolved} of {queryset.count()} item(s) resolved.", messages.INFO)
        return None
