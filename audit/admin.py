"""Operator console: audit events, chain heads, alerts and signing keys, all read-only.

Audit events are immutable and signing keys change only through
``manage.py rotate_signing_key``; no page can add, change or delete them.
Signing keys show public metadata only (the private keys are not in the database).
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from audit.chain_verification import audit_chain_verify
from audit.models import Alert, AuditEvent, ChainHead, ChainVerificationRecord, SigningKey
from audit.selectors import actor_q, object_id_q
from audit.services import audit_record
from common.console import ReadOnlyAdmin, console_actor, console_log, has_perm
from common.listing import short_id_column


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["event_short", "created_at", "event", "ok", "wallet_short", "chain_short", "seq"]
    event_short = short_id_column("event_id", "event id")
    wallet_short = short_id_column("wallet_id", "wallet", link_to="billing.wallet")
    chain_short = short_id_column("chain", "chain")
    list_filter = ["ok", "event"]
    search_fields = ["event_id", "chain", "wallet_id", "key_id", "request_id", "tool"]
    search_help_text = (
        "An event name (wallet.frozen), an actor (admin:operator), or any object id (a wallet, key, policy, "
        "permit, receipt, quote, action...)."
    )
    ordering = ["-created_at", "-seq"]
    readonly_fields = [f.name for f in AuditEvent._meta.fields]
    show_full_result_count = False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[AuditEvent], search_term: str
    ) -> tuple[QuerySet[AuditEvent], bool]:
        """Besides the id columns, a term matches the event name, the actor (``detail.actor``) and the ids
        an event's detail names (``audit.selectors.object_id_q``): each exactly, as the API's filters."""
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if term:
            results |= queryset.filter(Q(event=term) | actor_q(term) | object_id_q(term))
        return results, may_have_duplicates


@admin.register(ChainHead)
class ChainHeadAdmin(ReadOnlyAdmin):
    """Chain heads, and the "Verify" action: verify-chain from the first event (``audit_chain_verify``, as
    ``POST /v1/audit/verify-chain``), the verdict recorded as the chain's latest verification (the index
    page shows it) and the signed checkpoint shown to keep."""

    list_display = ["chain", "seq", "head_hash", "updated_at", "last_verified"]
    search_fields = ["chain"]
    readonly_fields = [f.name for f in ChainHead._meta.fields]
    actions = ["verify_selected"]

    @admin.display(description="last verified")
    def last_verified(self, obj: ChainHead) -> str:
        record = ChainVerificationRecord.objects.filter(chain=obj.chain).first()
        return "never" if record is None else str(record)

    def has_verify_chain_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "audit.verify_chain")

    @admin.action(description="Verify the selected chains (and sign a checkpoint)", permissions=["verify_chain"])
    def verify_selected(self, request: HttpRequest, queryset: QuerySet[ChainHead]) -> HttpResponse:
        actor = console_actor(request)
        results = []
        for head in queryset.order_by("chain"):
            result = audit_chain_verify(chain=head.chain, record=True)
            verdict = (
                f"valid: events 1 to {result.to_seq}"
                if result.valid
                else f"BROKEN at seq {result.first_broken_seq} ({result.reason})"
            )
            audit_record(
                event="audit.chain_verified",
                ok=result.valid,
                detail={
                    "chain": head.chain,
                    "to_seq": result.to_seq,
                    "valid": result.valid,
                    "reason": result.reason,
                    "actor": actor,
                },
            )
            console_log(request, head, f"Verified the chain: {verdict}")
            level = messages.SUCCESS if result.valid else messages.ERROR
            self.message_user(request, f"Chain {head.chain}: {verdict}.", level)
            results.append(
                {
                    "result": result,
                    "verdict": verdict,
                    "checkpoint": json.dumps(result.checkpoint, indent=2, sort_keys=True) if result.checkpoint else "",
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Audit chain verification",
            "results": results,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/audit/chain_verified.html", context)


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ["alert_id", "wallet_id", "kind", "severity", "created_at"]
    list_filter = ["severity", "kind"]
    search_fields = ["alert_id", "wallet_id", "tenant_id"]
    readonly_fields = [f.name for f in Alert._meta.fields]


@admin.register(SigningKey)
class SigningKeyAdmin(ReadOnlyAdmin):
    list_display = ["key_id", "state", "algorithm", "created_at", "activated_at", "retired_at"]
    list_filter = ["state"]
    readonly_fields = [f.name for f in SigningKey._meta.fields]
