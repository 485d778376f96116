"""Operator console for permits, permit requests, quotes, policies and approvers.

Revocation and policy changes go through the same services as the API.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone

from billing.admin import money_display
from common.console import ReadOnlyAdmin, ServiceSavedAdmin, confirmation_page, console_actor, has_perm
from common.errors import ApplicationError
from permits import services
from permits.models import (
    Permit,
    PermitRequest,
    PermitStatus,
    PolicyBundle,
    PolicyChangeProposal,
    ProposalStatus,
    Quote,
    TenantApprover,
)
from permits.services.policies import policy_rules_problems


@admin.register(Permit)
class PermitAdmin(ReadOnlyAdmin):
    list_display = ["permit_id", "wallet", "status", "max_credits", "spent_credits", "calls_used", "expires_at"]
    list_filter = ["status"]
    search_fields = ["permit_id", "wallet__wallet_id", "tenant_id", "subject_key_id"]
    ordering = ["-created_at"]
    actions = ["revoke_selected"]

    def has_revoke_permit_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "permits.revoke_permit")

    @admin.action(description="Revoke selected permits…", permissions=["revoke_permit"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[Permit]) -> HttpResponse | None:
        page = confirmation_page(
            self,
            request,
            queryset.exclude(status=PermitStatus.REVOKED).order_by("permit_id"),
            action="revoke_selected",
            title="Revoke these permits?",
            warning="Calls under a revoked permit are denied from now on. This cannot be undone.",
            headings=["Permit", "Wallet", "Tools", "Spent / allowance", "Expires"],
            row=lambda p: [
                p.permit_id,
                p.wallet_id,
                ", ".join(p.allowed_tools),
                f"{money_display(p.spent_credits)} / {money_display(p.max_credits)}",
                p.expires_at,
            ],
            confirm_label="Yes, revoke them",
        )
        if page is not None:
            return page
        count = 0
        for permit in queryset.exclude(status=PermitStatus.REVOKED):
            services.permit_revoke(permit_id=permit.permit_id, reason="operator_console", actor=console_actor(request))
            count += 1
        self.message_user(request, f"Revoked {count} permit(s).", messages.SUCCESS)
        return None

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Permit._meta.fields]


@admin.register(PermitRequest)
class PermitRequestAdmin(ReadOnlyAdmin):
    list_display = ["request_id", "wallet", "status", "max_credits", "created_at", "decided_by", "permit"]
    list_filter = ["status"]
    search_fields = ["request_id", "wallet__wallet_id", "tenant_id"]
    ordering = ["-created_at"]


@admin.register(Quote)
class QuoteAdmin(ReadOnlyAdmin):
    list_display = ["quote_id", "wallet", "tool", "quoted_credits", "status", "expires_at"]
    list_filter = ["status"]
    search_fields = ["quote_id", "tool", "wallet__wallet_id"]
    ordering = ["-created_at"]


class PolicyBundleForm(forms.ModelForm):
    """The rules are held to ``policy_rules_problems``, as in the API: the form's JSON fields would
    otherwise take any JSON (``5``, ``[1]``, ``"foo"``), and authorization reads these rules at every
    governed call of the subtree. An empty ``denied_tools`` (or ``null``) means none."""

    class Meta:
        model = PolicyBundle
        fields = ["wallet", *services.POLICY_FIELDS]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "denied_tools" in data and data["denied_tools"] is None:
            data["denied_tools"] = []
        rules = {name: data[name] for name in services.POLICY_FIELDS if name in data}
        for problem in policy_rules_problems(rules):
            name, *at = problem["loc"]
            message = f"Item {at[0] + 1}: {problem['msg']}" if at else problem["msg"]
            self.add_error(name if name in self.fields else None, message)
        return data


@admin.register(PolicyBundle)
class PolicyBundleAdmin(ServiceSavedAdmin):
    form = PolicyBundleForm
    list_display = ["policy_id", "wallet", "name", "enabled", "human_approval_required", "version", "updated_at"]
    list_filter = ["enabled", "human_approval_required"]
    search_fields = ["policy_id", "name", "wallet__wallet_id"]
    readonly_fields = [
        "policy_id",
        "tenant_id",
        "version",
        "created_at",
        "updated_at",
        "created_by_key_id",
        "created_by_wallet_id",
        "authority_wallet_id",
    ]
    fields = [
        "policy_id",
        "wallet",
        "name",
        "enabled",
        "allowed_tools",
        "denied_tools",
        "max_credits_per_call",
        "max_daily_credits",
        "allowed_categories",
        "human_approval_required",
        "version",
        "created_at",
        "updated_at",
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*self.readonly_fields, "wallet"] if obj is not None else list(self.readonly_fields)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: PolicyBundle, form: Any, change: bool) -> None:
        rules = {name: form.cleaned_data.get(name) for name in services.POLICY_FIELDS if name in form.cleaned_data}
        if rules.get("denied_tools") is None:
            rules["denied_tools"] = []
        if change:
            result = services.policy_change(
                policy_id=obj.policy_id, actor=console_actor(request), user=request.user, **rules
            )
            updated = result.policy
            obj._relaxation_proposal = result.proposal  # type: ignore[attr-defined]
        else:
            updated = services.policy_create(wallet=form.cleaned_data["wallet"], actor=console_actor(request), **rules)
        obj.pk = updated.pk
        obj.policy_id = updated.policy_id
        obj._state.adding = False
        if updated.permits_revoked:
            messages.warning(
                request,
                f"The policy requires human approval: {len(updated.permits_revoked)} permit(s) issued without "
                "it below its wallet were revoked.",
            )

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if getattr(obj, "_relaxation_proposal", None) is not None:
            return None  # nothing changed: the proposal's own audit event records the step
        return super().log_change(request, obj, message)

    def response_change(self, request: HttpRequest, obj: PolicyBundle) -> HttpResponse:
        """A change relaxing human approval was recorded as a proposal, not saved: say so (Django's
        "changed successfully" would not be true) and show the policy as it still is."""
        proposal: PolicyChangeProposal | None = getattr(obj, "_relaxation_proposal", None)
        if proposal is None:
            return super().response_change(request, obj)
        self.message_user(
            request,
            f"Nothing changed yet: this change relaxes human approval ({', '.join(proposal.relaxes)}), so it was "
            f"recorded as proposal {proposal.proposal_id}. It takes effect when another user with the 'confirm "
            f"policy relaxation' permission confirms it under Policy change proposals, before "
            f"{proposal.expires_at:%Y-%m-%d %H:%M} UTC.",
            messages.WARNING,
        )
        return HttpResponseRedirect(reverse("admin:permits_policybundle_change", args=[obj.policy_id]))


def _change_words(proposal: PolicyChangeProposal) -> str:
    return "; ".join(
        f"{name}: {proposal.before.get(name)!r} → {value!r}" for name, value in sorted(proposal.changes.items())
    )


@admin.register(PolicyChangeProposal)
class PolicyChangeProposalAdmin(ReadOnlyAdmin):
    """Proposals relaxing human approval. A second person confirms or rejects them (actions that need
    ``permits.confirm_policy_relaxation``); the services refuse the proposer, an expired proposal and
    one whose policy changed since (docs/decisions.md, "Operator console")."""

    list_display = [
        "proposal_id",
        "policy",
        "change_col",
        "proposed_by",
        "status_col",
        "created_at",
        "expires_at",
        "decided_by",
    ]
    list_filter = ["status"]
    search_fields = ["proposal_id", "policy__policy_id", "policy__wallet__wallet_id", "tenant_id"]
    ordering = ["-created_at"]
    actions = ["confirm_selected", "reject_selected"]

    @admin.display(description="Change")
    def change_col(self, obj: PolicyChangeProposal) -> str:
        return _change_words(obj)

    @admin.display(description="Status")
    def status_col(self, obj: PolicyChangeProposal) -> str:
        return obj.effective_status(timezone.now())

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in PolicyChangeProposal._meta.fields]

    def has_confirm_policy_relaxation_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "permits.confirm_policy_relaxation")

    def _decide(
        self, request: HttpRequest, queryset: QuerySet[PolicyChangeProposal], *, confirm: bool
    ) -> HttpResponse | None:
        pending = queryset.filter(status=ProposalStatus.PENDING, expires_at__gt=timezone.now()).order_by("created_at")
        page = confirmation_page(
            self,
            request,
            pending.select_related("policy"),
            action="confirm_selected" if confirm else "reject_selected",
            title="Confirm these relaxations of human approval?" if confirm else "Reject these proposals?",
            warning=(
                "Each policy will stop requiring human approval for the wallets it covers: their keys can then "
                "issue permits without a person approving them."
                if confirm
                else "The policies stay as they are."
            ),
            headings=["Proposal", "Policy", "Wallet", "Change", "Proposed by", "Expires"],
            row=lambda p: [
                p.proposal_id,
                p.policy_id,
                p.policy.wallet_id,
                _change_words(p),
                p.proposed_by,
                p.expires_at,
            ],
            confirm_label="Yes, confirm them" if confirm else "Yes, reject them",
        )
        if page is not None:
            return page
        done = 0
        for proposal in queryset.order_by("created_at"):
            try:
                if confirm:
                    services.policy_proposal_confirm(
                        proposal_id=proposal.proposal_id, user=request.user, actor=console_actor(request)
                    )
                else:
                    services.policy_proposal_reject(
                        proposal_id=proposal.proposal_id, user=request.user, actor=console_actor(request)
                    )
            except ApplicationError as err:
                self.message_user(request, f"{proposal.proposal_id}: {err.detail_message}", messages.ERROR)
            else:
                done += 1
        verb = "Confirmed" if confirm else "Rejected"
        self.message_user(request, f"{verb} {done} proposal(s).", messages.SUCCESS if done else messages.WARNING)
        return None

    @admin.action(description="Confirm selected relaxations…", permissions=["confirm_policy_relaxation"])
    def confirm_selected(self, request: HttpRequest, queryset: QuerySet[PolicyChangeProposal]) -> HttpResponse | None:
        return self._decide(request, queryset, confirm=True)

    @admin.action(description="Reject selected proposals…", permissions=["confirm_policy_relaxation"])
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[PolicyChangeProposal]) -> HttpResponse | None:
        return self._decide(request, queryset, confirm=False)


class TenantApproverForm(forms.ModelForm):
    """Adding an approver. A console user never names themselves (superusers excepted): whoever holds
    ``add_tenantapprover`` would otherwise make themselves an approver of any tenant and approve its
    permit requests alone; approving stays a second person's decision."""

    adding_user_pk: Any = None
    may_add_self = False

    class Meta:
        model = TenantApprover
        fields = ["user", "tenant"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        user = data.get("user")
        if user is not None and user.pk == self.adding_user_pk and not self.may_add_self:
            self.add_error("user", "You cannot make yourself an approver: another approver admin or a superuser can.")
        return data


@admin.register(TenantApprover)
class TenantApproverAdmin(ServiceSavedAdmin):
    """Who approves a tenant's permit requests; adding and removing go through audited services."""

    list_display = ["user", "tenant", "created_at"]
    search_fields = ["user__username", "tenant__wallet_id"]
    form = TenantApproverForm

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False if obj is not None else super().has_change_permission(request, obj)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        form.adding_user_pk = request.user.pk  # type: ignore[attr-defined]
        form.may_add_self = bool(request.user.is_superuser)  # type: ignore[attr-defined]
        return form

    def save_model(self, request: HttpRequest, obj: TenantApprover, form: Any, change: bool) -> None:
        approver = services.tenant_approver_add(
            user=form.cleaned_data["user"], tenant=form.cleaned_data["tenant"], actor=console_actor(request)
        )
        obj.pk = approver.pk
        obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: TenantApprover) -> None:
        services.tenant_approver_remove(approver=obj, actor=console_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[TenantApprover]) -> None:
        for approver in queryset:
            services.tenant_approver_remove(approver=approver, actor=console_actor(request))
