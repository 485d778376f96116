"""Operator console: receipts (read-only) and refund reconciliation (retry through the service)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html_join

from billing.admin import credits_cell, money_display
from common.console import changelist_link, confirmation_page, console_actor, has_perm
from common.errors import ApplicationError
from receipts import services
from receipts.models import Outcome, Receipt, RefundReconciliation


@admin.register(Receipt)
class ReceiptAdmin(admin.ModelAdmin):
    list_display = ["receipt_id", "created_at", "wallet", "tool", "outcome", "credits_col"]
    list_filter = ["outcome"]
    search_fields = ["receipt_id", "action_id", "wallet__wallet_id", "api_key_id", "tool"]
    ordering = ["-created_at"]
    date_hierarchy = "created_at"

    @admin.display(description="credits", ordering="credits_charged")
    def credits_col(self, obj: Receipt) -> str:
        return credits_cell(obj.credits_charged)

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
        return ["related", *[f.name for f in Receipt._meta.fields]]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # receipts are signed and immutable; the reconciliation action has its own permission

    def has_reconcile_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "receipts.reconcile")

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
        done = 0
        for receipt in queryset.filter(outcome=Outcome.DELIVERY_UNCERTAIN):
            try:
                services.refund_reconciliation_mark_not_executed(
                    receipt_id=receipt.receipt_id, actor=console_actor(request)
                )
            except ApplicationError as err:
                self.message_user(request, f"{receipt.receipt_id}: {err.detail_message}", messages.ERROR)
                continue
            done += 1
        self.message_user(
            request, f"{done} receipt(s) marked not executed; retry their refunds under reconciliation.", messages.INFO
        )
        return None


@admin.register(RefundReconciliation)
class RefundReconciliationAdmin(admin.ModelAdmin):
    list_display = ["receipt", "amount", "status", "origin", "attempts", "last_error", "created_at", "resolved_at"]
    list_filter = ["status", "origin"]
    search_fields = ["receipt__receipt_id", "receipt__wallet__wallet_id"]
    ordering = ["-created_at"]
    actions = ["retry_selected"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in RefundReconciliation._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # changed only by the retry action, which has its own permission

    def has_reconcile_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "receipts.reconcile")

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
        resolved = 0
        for item in queryset:
            try:
                status = services.refund_reconciliation_retry(
                    receipt_id=item.receipt_id, actor=console_actor(request)
                ).status
            except ApplicationError as err:
                self.message_user(request, f"{item.receipt_id}: {err.detail_message}", messages.ERROR)
                continue
            if status == "resolved":
                resolved += 1
        self.message_user(request, f"{resolved} of {queryset.count()} item(s) resolved.", messages.INFO)
        return None
