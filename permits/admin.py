"""Operator console for permits, permit requests, quotes, policies and approvers.

Revocation and policy changes go through the same services as the API.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from billing.admin import credits_column, money_display
from billing.models import ServiceCategory, Wallet, WalletStatus
from common.console import (
    ReadOnlyAdmin,
    ServiceSavedAdmin,
    confirmation_page,
    console_actor,
    console_each,
    console_log,
    has_perm,
    revocation_page,
)
from common.listing import short_id_column
from permits import selectors as permit_selectors
from permits import services
from permits.models import (
    Permit,
    PermitApproval,
    PermitRequest,
    PermitStatus,
    PolicyBundle,
    PolicyChangeProposal,
    ProposalStatus,
    Quote,
    TenantApprover,
    TenantNotification,
    WebhookDelivery,
)
from permits.selectors import permit_request_card_context
from permits.services.notifications import approval_sign_in_url, approver_reachability, webhook_url_problem
from permits.services.permit_requests import approval_url
from permits.services.policies import policy_rules_problems


@admin.register(Permit)
class PermitAdmin(ReadOnlyAdmin):
    list_display = ["permit_short", "wallet_short", "status", "allowance", "spent_col", "calls_used", "expires_at"]
    permit_short = short_id_column("permit_id", "permit")
    wallet_short = short_id_column("wallet_id", "wallet", link_to="billing.wallet")
    allowance = credits_column("max_credits", "allowance")
    spent_col = credits_column("spent_credits", "spent")
    list_filter = ["status"]
    search_fields = ["permit_id", "wallet__wallet_id", "tenant_id", "subject_key_id"]
    ordering = ["-created_at"]
    actions = ["revoke_selected"]

    def has_revoke_permit_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "permits.revoke_permit")

    @admin.action(description="Revoke selected permits…", permissions=["revoke_permit"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[Permit]) -> HttpResponse | None:
        page, reason = revocation_page(
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
            services.permit_revoke(permit_id=permit.permit_id, reason=reason, actor=console_actor(request))
            count += 1
            console_log(request, permit, f"Revoked the permit: {reason}")
        self.message_user(request, f"Revoked {count} permit(s).", messages.SUCCESS)
        return None

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # ``issued_via_request_id`` is an unsigned column: the page shows the approval the signed statement
        # names, checked, in its place (docs/decisions.md, Authority, "Approvals are signed").
        return ["approval", *[f.name for f in Permit._meta.fields if f.name != "issued_via_request_id"]]

    @admin.display(description="approval (from the signed statement)")
    def approval(self, obj: Permit) -> str:
        """Who stands behind the permit by its signed record: an approval that holds, one that does not
        (and why), an operator, or a wallet's key."""
        standing = services.permit_approval_standing(obj)
        reference = services.permit_signed_approval(obj)
        if standing == "approved" and reference is not None:
            return (
                f"Approved by {reference['approver']} at {reference['decided_at']} "
                f"(request {reference['request_id']}, approval {reference['approval_id']})"
            )
        if standing == "operator":
            return "Issued by an operator (no approval)"
        if reference is not None:
            return f"NOT approved: the approval it names does not hold ({services.permit_approval_problem(obj)})"
        return "NOT approved: issued by a wallet's key, or its signed statement does not verify"


@admin.register(PermitApproval)
class PermitApprovalAdmin(ReadOnlyAdmin):
    """Decisions on permit requests as signed (docs/decisions.md, Authority, "Approvals are signed")."""

    list_display = ["approval_short", "request_short", "wallet_id", "decision", "approver", "decided_at", "record"]
    approval_short = short_id_column("approval_id", "approval")
    request_short = short_id_column("permit_request_id", "request", link_to="permits.permitrequest")
    list_filter = ["decision"]
    search_fields = ["approval_id", "permit_request__request_id", "tenant_id", "wallet_id", "permit_id", "approver"]
    ordering = ["-decided_at"]

    @admin.display(description="signed record")
    def record(self, obj: PermitApproval) -> str:
        """Whether the row is what was signed: ``ok`` or why not (its signature, a column edited)."""
        return services.approval_statement_problem(obj) or "ok"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["record", *[f.name for f in PermitApproval._meta.fields]]


@admin.register(PermitRequest)
class PermitRequestAdmin(ReadOnlyAdmin):
    list_display = ["request_short", "wallet_short", "status", "allowance", "created_at", "decided_by", "permit_short"]
    request_short = short_id_column("request_id", "request")
    wallet_short = short_id_column("wallet_id", "wallet", link_to="billing.wallet")
    permit_short = short_id_column("permit_id", "permit", link_to="permits.permit")
    allowance = credits_column("max_credits", "allowance")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["card", *[f.name for f in PermitRequest._meta.fields]]

    @admin.display(description="approval card")
    def card(self, obj: PermitRequest) -> str:
        """Links to the card the approvers see (the console's copy, for this session) and to the
        approval page where an approver of the tenant decides."""
        card_url = reverse("admin:permits_permitrequest_card", args=[quote(obj.pk)])
        return format_html(
            '<a href="{}" id="permit-request-card-link">Open the approval card</a> · approvers decide at '
            '<a href="{}">{}</a>',
            card_url,
            approval_url(obj.request_id),
            approval_url(obj.request_id),
        )

    def get_urls(self) -> list[Any]:
        card = path(
            "<str:request_id>/card/",
            self.admin_site.admin_view(self.card_view),
            name="permits_permitrequest_card",
        )
        return [card, *super().get_urls()]

    def card_view(self, request: HttpRequest, request_id: str) -> HttpResponse:
        """The request's card as its approvers get it, read-only, for console users who may view requests."""
        preq = PermitRequest.objects.select_related("wallet", "decided_by").filter(pk=unquote(request_id)).first()
        if preq is None or not self.has_view_permission(request, preq):
            raise PermissionDenied
        context = {
            **permit_request_card_context(preq, approval_url=approval_url(preq.request_id)),
            "show_decide_link": True,
        }
        return TemplateResponse(request, "permits/card_page.html", context)

    list_filter = ["status"]
    search_fields = ["request_id", "wallet__wallet_id", "tenant_id"]
    ordering = ["-created_at"]


@admin.register(Quote)
class QuoteAdmin(ReadOnlyAdmin):
    list_display = ["quote_short", "wallet_short", "tool", "quoted_col", "status", "expires_at"]
    quote_short = short_id_column("quote_id", "quote")
    wallet_short = short_id_column("wallet_id", "wallet", link_to="billing.wallet")
    quoted_col = credits_column("quoted_credits", "quoted credits")
    list_filter = ["status"]
    search_fields = ["quote_id", "tool", "wallet__wallet_id"]
    ordering = ["-created_at"]


ANY, ONLY = "any", "only"


def _any_or_only(label: str, *, any_label: str, only_label: str) -> forms.ChoiceField:
    """A rule's "any" (stored as null) or "only" the selection of the field below it."""
    return forms.ChoiceField(
        label=label, choices=[(ANY, any_label), (ONLY, only_label)], widget=forms.RadioSelect, initial=ANY
    )


def _credits_limit(label: str, help_text: str) -> forms.DecimalField:
    """An optional limit in credits, held to the ledger's precision (numeric(20, 8)); empty: no limit."""
    return forms.DecimalField(
        required=False, max_digits=20, decimal_places=8, min_value=Decimal(0), label=label, help_text=help_text
    )


def _selection(
    label: str, help_text: str = "", *, listbox: bool = False, choices: Any = ()
) -> forms.MultipleChoiceField:
    """A rule's selection, shown under its "any" or "only": optional (selecting none is a rule of its own),
    as a list box (the tools, which are many) or as checkboxes."""
    widget = forms.SelectMultiple(attrs={"size": 8}) if listbox else forms.CheckboxSelectMultiple
    return forms.MultipleChoiceField(required=False, label=label, help_text=help_text, widget=widget, choices=choices)


def _tool_choices(current: list[str] | None, *, patterns: bool) -> list[tuple[str, str]]:
    """The synced tools (``selectors.known_tools``), their namespace patterns (``prefix.*``) when
    ``patterns``, and what the policy already names that is neither (kept selectable, so editing
    never drops a rule silently; marked, so it is removed on purpose)."""
    tools = sorted(permit_selectors.known_tools())  # the hook, read at call time (mcpgateway.apps sets it)
    choices = [(name, name) for name in tools]
    if patterns:
        prefixes = sorted({name.rsplit(".", 1)[0] for name in tools if "." in name})
        choices += [(f"{prefix}.*", f"{prefix}.* (every {prefix} tool)") for prefix in prefixes]
    offered = {value for value, _ in choices}
    choices += [(name, f"{name} (not a synced tool)") for name in current or [] if name not in offered]
    return choices


def _server_choices(current: list[str] | None) -> list[tuple[str, str]]:
    """The upstream servers (``selectors.known_servers``) and what the policy already names that is not
    one (kept selectable and marked, as for tools)."""
    slugs = permit_selectors.known_servers()  # the hook, read at call time (mcpgateway.apps sets it)
    return [(slug, slug) for slug in slugs] + [
        (slug, f"{slug} (not an upstream server)") for slug in current or [] if slug not in slugs
    ]


class PolicyBundleForm(forms.ModelForm):
    """A policy's rules as people set them (docs/decisions.md, Operator console): tools from the synced
    tools (a name that is not one, such as ``notes.apend``, is refused), categories as checkboxes,
    limits as numbers; "any" is a choice of its own, apart from an empty selection (no tool at all).
    The rules are then held to ``policy_rules_problems``, as in the API; a closed wallet is not offered."""

    tools_mode = _any_or_only(
        "Tools allowed",
        any_label="Any tool (the denied tools below excepted)",
        only_label="Only the tools selected below",
    )
    allowed_tools = _selection(
        "Allowed tools",
        "Used with “Only the tools selected below”; selecting none allows no tool. Ctrl-click for several.",
        listbox=True,
    )
    denied_tools = _selection(
        "Denied tools",
        "Refused even where allowed. A pattern such as notes.* covers every tool of that namespace.",
        listbox=True,
    )
    categories_mode = _any_or_only(
        "Service categories allowed", any_label="Any category", only_label="Only the categories ticked below"
    )
    allowed_categories = _selection("Allowed categories", choices=ServiceCategory.choices)
    servers_mode = _any_or_only(
        "Upstream servers allowed", any_label="Any server", only_label="Only the servers selected below"
    )
    allowed_servers = _selection(
        "Allowed servers",
        "Used with “Only the servers selected below”: a tool of any other server, or of none "
        "(a local tool), is refused. Selecting none allows no server.",
    )
    max_credits_per_call = _credits_limit(
        "Most credits per call", "A call priced above this is refused. Empty: no limit per call."
    )
    max_daily_credits = _credits_limit(
        "Most credits per day",
        "What the wallets under this policy may spend together in a UTC day. Empty: no daily limit.",
    )

    class Meta:
        model = PolicyBundle
        fields = ["wallet", "name", "enabled", "human_approval_required"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        policy = self.instance if self.instance.pk else None
        allowed = policy.allowed_tools if policy is not None else None
        denied = policy.denied_tools if policy is not None else []
        self.fields["allowed_tools"].choices = _tool_choices(allowed, patterns=True)  # type: ignore[attr-defined]
        self.fields["denied_tools"].choices = _tool_choices(denied, patterns=True)  # type: ignore[attr-defined]
        servers = policy.allowed_servers if policy is not None else None
        self.fields["allowed_servers"].choices = _server_choices(servers)  # type: ignore[attr-defined]
        if policy is not None:
            self.initial.update(
                tools_mode=ONLY if allowed is not None else ANY,
                allowed_tools=list(allowed or []),
                denied_tools=list(denied or []),
                categories_mode=ONLY if policy.allowed_categories is not None else ANY,
                allowed_categories=list(policy.allowed_categories or []),
                servers_mode=ONLY if servers is not None else ANY,
                allowed_servers=list(servers or []),
                max_credits_per_call=policy.max_credits_per_call,
                max_daily_credits=policy.max_daily_credits,
            )
        if "wallet" in self.fields:  # a closed wallet can never spend again: not offered
            self.fields["wallet"].queryset = Wallet.objects.exclude(status=WalletStatus.CLOSED)  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        data["allowed_tools"] = list(data.get("allowed_tools") or []) if data.get("tools_mode") == ONLY else None
        data["denied_tools"] = list(data.get("denied_tools") or [])
        only_categories = data.get("categories_mode") == ONLY
        data["allowed_categories"] = list(data.get("allowed_categories") or []) if only_categories else None
        only_servers = data.get("servers_mode") == ONLY
        data["allowed_servers"] = list(data.get("allowed_servers") or []) if only_servers else None
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
        "tools_mode",
        "allowed_tools",
        "denied_tools",
        "categories_mode",
        "allowed_categories",
        "servers_mode",
        "allowed_servers",
        "max_credits_per_call",
        "max_daily_credits",
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
                policy_id=obj.policy_id, actor=console_actor(request), user=request.user, endpoint=request.path, **rules
            )
            updated = result.policy
            obj._relaxation_proposal = result.proposal  # type: ignore[attr-defined]
        else:
            updated = services.policy_create(
                wallet=form.cleaned_data["wallet"], actor=console_actor(request), endpoint=request.path, **rules
            )
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
        return HttpResponseRedirect(reverse("admin:permits_policybundle_change", args=[quote(obj.policy_id)]))


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
        decide = services.policy_proposal_confirm if confirm else services.policy_proposal_reject
        verb = "Confirmed" if confirm else "Rejected"
        done = console_each(
            self,
            request,
            queryset.order_by("created_at"),
            name=lambda p: p.proposal_id,
            act=lambda p: decide(proposal_id=p.proposal_id, user=request.user, actor=console_actor(request)),
            log=lambda p, _: f"{verb} the proposal to change policy {p.policy_id}",
        )
        self.message_user(request, f"{verb} {len(done)} proposal(s).", messages.SUCCESS if done else messages.WARNING)
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

    list_display = ["user", "email", "tenant", "signs_in_at", "notified", "created_at"]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "tenant__wallet_id"]
    form = TenantApproverForm

    @admin.display(description="email", ordering="user__email")
    def email(self, obj: TenantApprover) -> str:
        return obj.user.email or format_html("<strong>{}</strong>", "none: never emailed")

    @admin.display(description="signs in at")
    def signs_in_at(self, obj: TenantApprover) -> str:
        url = approval_sign_in_url()
        return format_html('<a href="{}">{}</a>', url, url)

    @admin.display(description="how the tenant's approvers hear of requests")
    def notified(self, obj: TenantApprover) -> str:
        return _reachability_cell(obj.tenant_id)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Warn, above the list, about each tenant whose approvers would never hear of a request."""
        if request.method == "GET":
            for tenant_id in sorted(set(TenantApprover.objects.values_list("tenant_id", flat=True))):
                reach = approver_reachability(tenant_id)
                if not reach.reachable:
                    messages.warning(
                        request, f"Approvers of {tenant_id} cannot be reached: {'; '.join(reach.problems)}."
                    )
        return super().changelist_view(request, extra_context)

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
        user = form.cleaned_data["user"]
        messages.info(
            request,
            f"Approver {user.get_username()} signs in at {approval_sign_in_url()} to decide permit requests "
            "(send them this address and their password).",
        )
        reach = approver_reachability(approver.tenant_id)
        if not user.email or not reach.reachable:
            problems = [p for p in reach.problems if p != "no webhook" or not reach.reachable]
            messages.warning(
                request,
                f"Approver {user.get_username()} will not be told of new requests by email"
                + ("" if user.email else " (no email address)")
                + (f"; the tenant's approvers cannot be reached: {'; '.join(problems)}" if not reach.reachable else "")
                + ". Set the tenant's notification under Tenant notifications.",
            )

    def delete_model(self, request: HttpRequest, obj: TenantApprover) -> None:
        services.tenant_approver_remove(approver=obj, actor=console_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[TenantApprover]) -> None:
        for approver in queryset:
            services.tenant_approver_remove(approver=approver, actor=console_actor(request))


def _reachability_cell(tenant_id: str) -> str:
    reach = approver_reachability(tenant_id)
    if reach.reachable:
        return format_html('<span class="reachable">reachable</span>{}', _problems_suffix(reach.problems))
    return format_html('<strong class="unreachable">cannot be reached</strong>: {}', "; ".join(reach.problems))


def _problems_suffix(problems: list[str]) -> str:
    notes = [p for p in problems if p != "no webhook"]
    return f" (but: {'; '.join(notes)})" if notes else ""


class TenantNotificationForm(forms.ModelForm):
    """The tenant's channels. The webhook secret is write-only: the field is always empty, an empty
    field keeps the stored secret, and nothing shows it again."""

    webhook_url = forms.URLField(
        required=False,
        max_length=500,
        assume_scheme="https",
        label="Webhook address",
        help_text="http(s) only; redirects are not followed. Slack and Teams incoming webhooks read the body's "
        "text. Empty: no webhook.",
    )
    new_webhook_secret = forms.CharField(
        required=False,
        max_length=200,
        label="Webhook signing secret",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Signs each delivery (HMAC-SHA256 over the timestamp and the body). Stored, never shown "
        "again: leave empty to keep the current one.",
    )

    class Meta:
        model = TenantNotification
        fields = ["tenant", "email_enabled", "webhook_url"]
        labels = {"email_enabled": "Email each approver"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "tenant" in self.fields:
            self.fields["tenant"].queryset = Wallet.objects.filter(wallet_type="sponsor").exclude(  # type: ignore[attr-defined]
                status=WalletStatus.CLOSED
            )

    def clean_webhook_url(self) -> str:
        url = self.cleaned_data.get("webhook_url") or ""
        problem = webhook_url_problem(url) if url else None
        if problem:
            raise forms.ValidationError(problem)
        return url

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        has_secret = bool(self.instance.pk and self.instance.webhook_secret)
        if data.get("webhook_url") and not data.get("new_webhook_secret") and not has_secret:
            self.add_error("new_webhook_secret", "A webhook needs a signing secret.")
        return data


@admin.register(TenantNotification)
class TenantNotificationAdmin(ServiceSavedAdmin):
    """How each tenant's approvers hear of permit requests; saving goes through
    ``tenant_notification_set`` (audited, the secret never)."""

    form = TenantNotificationForm
    list_display = ["tenant", "email_enabled", "webhook_host", "secret_state", "reachability"]
    readonly_fields = ["secret_state", "reachability", "sign_in_address"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = ["tenant", "email_enabled", "webhook_url", "new_webhook_secret", "secret_state"]
        return [*fields, "reachability", "sign_in_address"] if obj is not None else fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["tenant", *self.readonly_fields] if obj is not None else ["secret_state"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="webhook")
    def webhook_host(self, obj: TenantNotification) -> str:
        from urllib.parse import urlsplit

        return urlsplit(obj.webhook_url).hostname or "—" if obj.webhook_url else "—"

    @admin.display(description="signing secret")
    def secret_state(self, obj: TenantNotification | None) -> str:
        if obj is None or not obj.pk or not obj.webhook_secret:
            return "not set"
        when = obj.webhook_secret_set_at.strftime("%Y-%m-%d %H:%M:%S UTC") if obj.webhook_secret_set_at else ""
        return f"set {when} (never shown again)"

    @admin.display(description="approvers")
    def reachability(self, obj: TenantNotification) -> str:
        return _reachability_cell(obj.tenant_id)

    @admin.display(description="approvers sign in at")
    def sign_in_address(self, obj: TenantNotification) -> str:
        return approval_sign_in_url()

    def save_model(self, request: HttpRequest, obj: TenantNotification, form: Any, change: bool) -> None:
        tenant = obj.tenant if change else form.cleaned_data["tenant"]
        saved = services.tenant_notification_set(
            tenant=tenant,
            email_enabled=form.cleaned_data["email_enabled"],
            webhook_url=form.cleaned_data.get("webhook_url") or "",
            webhook_secret=form.cleaned_data.get("new_webhook_secret") or None,
            actor=console_actor(request),
        )
        obj.pk = saved.pk
        obj._state.adding = False
        reach = approver_reachability(tenant.wallet_id)
        if not reach.reachable:
            messages.warning(
                request, f"The approvers of {tenant.wallet_id} cannot be reached: {'; '.join(reach.problems)}."
            )


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """Each webhook notification, its attempts and outcome (read-only)."""

    list_display = [
        "delivery_short",
        "created_at",
        "tenant_id",
        "request_short",
        "status",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "last_error",
    ]
    list_filter = ["status"]
    search_fields = ["delivery_id", "tenant_id", "permit_request__request_id"]
    ordering = ["-created_at"]
    delivery_short = short_id_column("delivery_id", "delivery")
    request_short = short_id_column("permit_request_id", "request", link_to="permits.permitrequest")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in WebhookDelivery._meta.fields]
