"""Operator console: wallets, money and prices (API keys: ``access.admin``). Every change goes through the services.

Wallet actions (each audited by its service): provision credits to sponsors
(from mint), fund wallets from their parent, freeze, unfreeze, close. Amounts
and reasons are asked for on an intermediate page. Ledger entries are read-only.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from access import services as key_services
from access.models import APIKey, APIKeyStatus
from audit.models import AuditEvent
from billing import services
from billing.exceptions import money_display
from billing.models import (
    ChargeIdempotency,
    LedgerEntry,
    ServicePrice,
    Wallet,
    WalletStatus,
)
from billing.services import wallets
from common.console import (
    ReadOnlyAdmin,
    ServiceSavedAdmin,
    changelist_link,
    confirmation_page,
    console_actor,
    console_failure,
    console_log,
    console_page,
    has_perm,
    revocation_page,
)
from common.errors import ApplicationError, RequestValidationError
from common.formatting import credits_phrase
from common.listing import short_id_column


class AmountForm(forms.Form):
    amount = forms.DecimalField(max_digits=20, decimal_places=8, min_value=Decimal("0.00000001"))
    description = forms.CharField(max_length=200, required=False)


class WalletCreateForm(forms.Form):
    """Create a sponsor wallet (a tenant) or an agent wallet under a sponsor, as the API does."""

    KINDS = [("sponsor", "Sponsor wallet (a new tenant)"), ("agent", "Agent wallet under a parent wallet")]

    kind = forms.ChoiceField(choices=KINDS, widget=forms.RadioSelect, initial="sponsor")
    parent = forms.ModelChoiceField(
        queryset=Wallet.objects.none(),
        required=False,
        help_text="For an agent wallet: the sponsor (or agent) it is funded from.",
    )
    name = forms.CharField(max_length=200, required=False)
    amount = forms.DecimalField(
        max_digits=20,
        decimal_places=8,
        min_value=Decimal(0),
        initial=Decimal(0),
        label="Initial credits",
        help_text="Sponsor: provisioned from mint. Agent: moved from the parent's balance.",
    )
    budget = forms.DecimalField(max_digits=20, decimal_places=8, min_value=Decimal(0), required=False)
    daily_limit = forms.DecimalField(max_digits=20, decimal_places=8, min_value=Decimal(0), required=False)
    refill_threshold = forms.DecimalField(max_digits=20, decimal_places=8, min_value=Decimal(0), required=False)
    refill_amount = forms.DecimalField(max_digits=20, decimal_places=8, min_value=Decimal("0.00000001"), required=False)
    expires_at = forms.DateTimeField(required=False, help_text="YYYY-MM-DD HH:MM (UTC); empty: never.")

    def __init__(self, *args: Any, request: HttpRequest, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request = request
        parents = Wallet.objects.exclude(status=WalletStatus.CLOSED).exclude(wallet_type="child")
        self.fields["parent"].queryset = parents.order_by("path")  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind, parent, amount = data.get("kind"), data.get("parent"), data.get("amount") or Decimal(0)
        if kind == "sponsor":
            if parent is not None:
                self.add_error("parent", "A sponsor wallet has no parent.")
            for name in ("budget", "refill_threshold", "refill_amount"):
                if data.get(name) is not None:
                    self.add_error(name, "Set this on agent wallets.")
            if amount > 0 and not has_perm(self.request, "billing.provision_credits"):
                self.add_error("amount", "Provisioning credits needs the 'provision credits' permission.")
        elif kind == "agent":
            if parent is None:
                self.add_error("parent", "Choose the parent wallet.")
            if amount > 0 and not has_perm(self.request, "billing.fund_wallet"):
                self.add_error("amount", "Funding a wallet needs the 'fund wallet' permission.")
            if (data.get("refill_threshold") is None) != (data.get("refill_amount") is None):
                self.add_error("refill_amount", "Set both refill threshold and refill amount, or neither.")
            elif data.get("refill_amount") is not None and not has_perm(self.request, "billing.fund_wallet"):
                # An auto-refill moves the parent's credits into the wallet on every charge that needs it.
                self.add_error(
                    "refill_amount", "An auto-refill funds the wallet: it needs the 'fund wallet' permission."
                )
        return data


class WalletSettingsForm(forms.Form):
    """A wallet's settings, as ``wallet_settings_change`` takes them (empty: no limit, no auto-refill)."""

    name = forms.CharField(max_length=200, required=False)
    budget = forms.DecimalField(
        max_digits=20, decimal_places=8, min_value=Decimal(0), required=False, help_text="Lifetime spend cap."
    )
    daily_limit = forms.DecimalField(max_digits=20, decimal_places=8, min_value=Decimal(0), required=False)
    refill_threshold = forms.DecimalField(max_digits=20, decimal_places=8, min_value=Decimal(0), required=False)
    refill_amount = forms.DecimalField(max_digits=20, decimal_places=8, min_value=Decimal("0.00000001"), required=False)

    def __init__(self, data: Any = None, *, wallet: Wallet, request: HttpRequest) -> None:
        super().__init__(data, initial={name: getattr(wallet, name) for name in services.WALLET_SETTINGS})
        self.wallet, self.request = wallet, request
        if wallet.wallet_type == "sponsor":
            for name in ("budget", "refill_threshold", "refill_amount"):
                del self.fields[name]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "refill_amount" in self.fields:
            if (data.get("refill_threshold") is None) != (data.get("refill_amount") is None):
                self.add_error("refill_amount", "Set both refill threshold and refill amount, or neither.")
            elif (
                data.get("refill_amount") is not None
                and (data["refill_amount"], data["refill_threshold"])
                != (self.wallet.refill_amount, self.wallet.refill_threshold)
                and not has_perm(self.request, "billing.fund_wallet")
            ):
                # An auto-refill moves the parent's credits into the wallet on every charge that needs it.
                self.add_error(
                    "refill_amount", "An auto-refill funds the wallet: it needs the 'fund wallet' permission."
                )
        return data


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=200, required=False, initial="frozen by operator")


# The wallet actions that ask for something on a page first: its form, its title and its button.
ACTION_FORMS: dict[str, tuple[type[forms.Form], str, str]] = {
    "provision_credits": (AmountForm, "Provision credits to sponsor wallets", "Provision"),
    "fund_from_parent": (AmountForm, "Fund wallets from their parent", "Fund"),
    "freeze_wallets": (ReasonForm, "Freeze wallets", "Freeze"),
}


def credits_cell(value: Decimal | None) -> str:
    """A right-aligned credits cell for list pages (1,250.5)."""
    return format_html('<span class="credits" style="display:block;text-align:right">{}</span>', money_display(value))


def credits_column(field: str, description: str) -> Any:
    """A list column showing ``obj.<field>`` as a ``credits_cell``, sortable by the field."""

    @admin.display(description=description, ordering=field)
    def column(modeladmin: admin.ModelAdmin, obj: Any) -> str:
        return credits_cell(getattr(obj, field))

    return column


def _open_calls_display(wallet: Wallet) -> str:
    """What would refuse closing ``wallet`` (``wallets.open_calls``), for the confirmation page."""
    owed = [f"{name.replace('_', ' ')}: {count}" for name, count in wallets.open_calls(wallet).items() if count]
    return ", ".join(owed) or "none"


@admin.register(Wallet)
class WalletAdmin(admin.ModelAdmin):
    list_display = [
        "wallet_short",
        "wallet_type",
        "name",
        "status",
        "balance_col",
        "spent_col",
        "parent_short",
        "created_at",
    ]
    wallet_short = short_id_column("wallet_id", "wallet")
    parent_short = short_id_column("parent_id", "parent", link_to="billing.wallet")
    list_filter = ["wallet_type", "status"]
    search_fields = ["wallet_id", "name", "tenant_id"]
    ordering = ["-created_at"]
    date_hierarchy = "created_at"
    readonly_fields = ["related", *[f.name for f in Wallet._meta.fields]]
    object_history_template = "admin/billing/wallet/object_history.html"

    balance_col = credits_column("balance", "balance")
    spent_col = credits_column("total_spent", "spent")

    @admin.display(description="related")
    def related(self, obj: Wallet) -> str:
        links = [
            changelist_link("billing.ledgerentry", "ledger", account=obj.wallet_id),
            changelist_link("access.apikey", "API keys", wallet_id__exact=obj.wallet_id),
            changelist_link("billing.wallet", "child wallets", parent__wallet_id__exact=obj.wallet_id),
            changelist_link("permits.permit", "permits", wallet__wallet_id__exact=obj.wallet_id),
            changelist_link("receipts.receipt", "receipts", wallet__wallet_id__exact=obj.wallet_id),
            changelist_link("audit.auditevent", "audit events", wallet_id=obj.wallet_id),
        ]
        return format_html_join(" · ", "{}", ((link,) for link in links))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The read-only wallet page, with a "Change settings" button beside History for those who may."""
        extra = dict(extra_context or {})
        if self.has_change_wallet_settings_permission(request):
            extra["settings_url"] = reverse("admin:billing_wallet_settings", args=[quote(unquote(object_id))])
        return super().change_view(request, object_id, form_url, extra)

    actions = [
        "change_settings",
        "provision_credits",
        "fund_from_parent",
        "freeze_wallets",
        "unfreeze_wallets",
        "emergency_revoke_keys",
        "close_wallets",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "billing.add_wallet")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Create a wallet through the same services as the API (same ledger entries and audit events)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = WalletCreateForm(request.POST if request.method == "POST" else None, request=request)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                if data["kind"] == "sponsor":
                    wallet = services.wallet_create_sponsor(
                        name=data["name"],
                        initial_credits=data["amount"],
                        daily_limit=data["daily_limit"],
                        expires_at=data["expires_at"],
                        actor=console_actor(request),
                    )
                else:
                    wallet = services.wallet_create_agent(
                        parent=data["parent"],
                        name=data["name"],
                        initial_balance=data["amount"],
                        budget=data["budget"],
                        daily_limit=data["daily_limit"],
                        refill_threshold=data["refill_threshold"],
                        refill_amount=data["refill_amount"],
                        expires_at=data["expires_at"],
                        actor=console_actor(request),
                    )
            except (ApplicationError, RequestValidationError) as exc:
                form.add_error(None, console_failure(exc))
            else:
                self.log_addition(request, wallet, [{"added": {}}])
                self.message_user(
                    request,
                    f"Created {wallet.wallet_type} wallet {wallet.wallet_id} ({wallet.name}).",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(reverse("admin:billing_wallet_change", args=[quote(wallet.pk)]))
        context = {
            **self.admin_site.each_context(request),
            "title": "Create a wallet",
            "form": form,
            "opts": self.model._meta,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/billing/wallet_create.html", context)

    def _form_data(
        self, request: HttpRequest, queryset: QuerySet[Wallet], action: str
    ) -> HttpResponse | dict[str, Any]:
        """The action's form (``ACTION_FORMS``), once applied and valid, as its cleaned data; until then the
        page asking for it."""
        form_class, title, submit_label = ACTION_FORMS[action]
        form = form_class(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            return form.cleaned_data
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "form": form,
            # A closed wallet is never a target (docs/decisions.md, Operator console): it is left out here.
            "wallets": list(queryset.exclude(status=WalletStatus.CLOSED)),
            "closed": list(queryset.filter(status=WalletStatus.CLOSED).values_list("wallet_id", flat=True)),
            "action": action,
            "submit_label": submit_label,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/billing/wallet_action.html", context)

    def _apply(self, request: HttpRequest, queryset: QuerySet[Wallet], verb: str, call: Any, *, log: str) -> None:
        done, failed = 0, []
        for wallet in queryset.order_by("path"):
            if wallet.status == WalletStatus.CLOSED:  # closed for good: nothing moves into or out of it
                failed.append(f"{wallet.wallet_id}: the wallet is closed.")
                continue
            try:
                call(wallet)
                done += 1
                console_log(request, wallet, log)
            except (ApplicationError, RequestValidationError) as exc:
                failed.append(f"{wallet.wallet_id}: {console_failure(exc)}")
        if done:
            self.message_user(request, f"{verb} {done} wallet{pluralize(done)}.", messages.SUCCESS)
        for line in failed:
            self.message_user(request, line, messages.ERROR)

    def has_change_wallet_settings_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "billing.change_wallet_settings")

    def get_urls(self) -> list[Any]:
        settings_page = console_page(self, "<path:object_id>/settings/", self.settings_view, "billing_wallet_settings")
        return [settings_page, *super().get_urls()]

    def settings_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Change a wallet's settings through ``wallet_settings_change`` (audited, in the wallet's History)."""
        if not self.has_change_wallet_settings_permission(request):
            raise PermissionDenied
        wallet = self.get_object(request, unquote(object_id))
        if wallet is None:
            raise PermissionDenied
        form = WalletSettingsForm(request.POST if request.method == "POST" else None, wallet=wallet, request=request)
        if request.method == "POST" and form.is_valid():
            try:
                result = services.wallet_settings_change(
                    wallet=wallet, changes=dict(form.cleaned_data), actor=console_actor(request)
                )
            except (ApplicationError, RequestValidationError) as exc:
                form.add_error(None, console_failure(exc))
            else:
                if result.changes:
                    summary = "; ".join(
                        f"{name.replace('_', ' ')}: {change['before'] if change['before'] is not None else 'none'}"
                        f" -> {change['after'] if change['after'] is not None else 'none'}"
                        for name, change in result.changes.items()
                    )
                    console_log(request, result.wallet, f"Changed settings: {summary}")
                    self.message_user(request, f"Changed {summary}.", messages.SUCCESS)
                else:
                    self.message_user(request, "Nothing changed.", messages.INFO)
                for notice in result.notices:
                    self.message_user(request, notice, messages.WARNING)
                return HttpResponseRedirect(reverse("admin:billing_wallet_change", args=[quote(wallet.pk)]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Change the settings of {wallet}",
            "form": form,
            "wallet": wallet,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/billing/wallet_settings.html", context)

    @admin.action(
        description="Change settings (name, budget, limits, auto-refill)…", permissions=["change_wallet_settings"]
    )
    def change_settings(self, request: HttpRequest, queryset: QuerySet[Wallet]) -> HttpResponse | None:
        wallets = list(queryset[:2])
        if len(wallets) != 1:
            self.message_user(request, "Select one wallet to change its settings.", messages.ERROR)
            return None
        return HttpResponseRedirect(reverse("admin:billing_wallet_settings", args=[quote(wallets[0].pk)]))

    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None) -> Any:
        """Django's History (console actions) and every settings change, from the console or the API (its
        ``wallet.settings_changed`` audit events, with before and after)."""
        events = AuditEvent.objects.filter(wallet_id=unquote(object_id), event="wallet.settings_changed").order_by(
            "-created_at", "-seq"
        )[:100]
        rows = [
            {
                "created_at": event.created_at,
                "who": event.detail.get("actor") or event.key_id or "—",
                "changes": event.detail.get("changes", {}),
                "notices": event.detail.get("notices", []),
            }
            for event in events
        ]
        return super().history_view(request, object_id, {**(extra_context or {}), "settings_changes": rows})

    def has_provision_credits_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "billing.provision_credits")

    def has_fund_wallet_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "billing.fund_wallet")

    def has_freeze_wallet_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "billing.freeze_wallet")

    def has_close_wallet_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "billing.close_wallet")

    def has_revoke_key_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "access.revoke_key")

    @admin.action(description="Provision credits (mint -> sponsor)", permissions=["provision_credits"])
    def provision_credits(self, request: HttpRequest, queryset: QuerySet[Wallet]) -> HttpResponse | None:
        data = self._form_data(request, queryset, "provision_credits")
        if isinstance(data, HttpResponse):
            return data
        amount, description = data["amount"], data["description"]
        self._apply(
            request,
            queryset,
            f"Provisioned {credits_phrase(amount)} to",
            lambda w: services.wallet_provision(
                wallet=w, amount=amount, description=description, actor=console_actor(request)
            ),
            log=f"Provisioned {money_display(amount)} credits from mint" + (f" ({description})" if description else ""),
        )
        return None

    @admin.action(description="Fund from parent", permissions=["fund_wallet"])
    def fund_from_parent(self, request: HttpRequest, queryset: QuerySet[Wallet]) -> HttpResponse | None:
        data = self._form_data(request, queryset, "fund_from_parent")
        if isinstance(data, HttpResponse):
            return data
        amount, description = data["amount"], data["description"]

        def fund(wallet: Wallet) -> None:
            if wallet.parent is None:
                raise RequestValidationError.single(["wallet"], "A sponsor has no parent; provision it.", "no_parent")
            services.wallet_fund(
                source=wallet.parent,
                target=wallet,
                amount=amount,
                description=description,
                actor=console_actor(request),
            )

        self._apply(
            request,
            queryset,
            f"Funded {credits_phrase(amount)} into",
            fund,
            log=f"Funded {credits_phrase(amount)} from the parent" + (f" ({description})" if description else ""),
        )
        return None

    @admin.action(description="Freeze", permissions=["freeze_wallet"])
    def freeze_wallets(self, request: HttpRequest, queryset: QuerySet[Wallet]) -> HttpResponse | None:
        data = self._form_data(request, queryset, "freeze_wallets")
        if isinstance(data, HttpResponse):
            return data
        reason = data["reason"]
        self._apply(
            request,
            queryset,
            "Froze",
            lambda w: services.wallet_freeze(wallet=w, reason=reason, actor=console_actor(request)),
            log=f"Froze the wallet: {reason or 'frozen by operator'}",
        )
        return None

    @admin.action(description="Unfreeze", permissions=["freeze_wallet"])
    def unfreeze_wallets(self, request: HttpRequest, queryset: QuerySet[Wallet]) -> None:
        self._apply(
            request,
            queryset.filter(status=WalletStatus.FROZEN),
            "Unfroze",
            lambda w: services.wallet_unfreeze(wallet=w, actor=console_actor(request)),
            log="Unfroze the wallet",
        )

    @admin.action(description="Close wallets for good…", permissions=["close_wallet"])
    def close_wallets(self, request: HttpRequest, queryset: QuerySet[Wallet]) -> HttpResponse | None:
        page = confirmation_page(
            self,
            request,
            queryset.order_by("path"),
            action="close_wallets",
            title="Close these wallets?",
            warning="Closing cannot be undone. Each wallet's balance returns to its parent (a sponsor's to mint), "
            "and the wallet can never spend or be funded again.",
            headings=["Wallet", "Type", "Name", "Balance", "Returns to", "Refunds that may still come back"],
            row=lambda w: [
                w.wallet_id,
                w.wallet_type,
                w.name,
                money_display(w.balance),
                w.parent_id or "mint",
                _open_calls_display(w),
            ],
            confirm_label="Yes, close them",
        )
        if page is not None:
            return page
        # Deepest first, so a selected parent closes after its selected children.
        wallets = sorted(queryset, key=lambda w: -len(w.ancestry))
        done, failed = 0, []
        for wallet in wallets:
            try:
                closed = services.wallet_close(wallet=wallet, actor=console_actor(request))
                done += 1
                console_log(
                    request, closed, "Closed the wallet; its balance returned to " + (wallet.parent_id or "mint")
                )
            except ApplicationError as exc:
                failed.append(f"{wallet.wallet_id}: {console_failure(exc)}")
        if done:
            self.message_user(request, f"Closed {done} wallet(s).", messages.SUCCESS)
        for line in failed:
            self.message_user(request, line, messages.ERROR)
        return None

    @admin.action(description="Emergency: revoke every API key of the wallets and below…", permissions=["revoke_key"])
    def emergency_revoke_keys(self, request: HttpRequest, queryset: QuerySet[Wallet]) -> HttpResponse | None:
        def row(wallet: Wallet) -> list[str]:
            subtree = Wallet.objects.filter(path__startswith=wallet.path, tenant_id=wallet.tenant_id)
            keys = APIKey.objects.filter(
                wallet_id__in=subtree.values("wallet_id"), tenant_id=wallet.tenant_id, status=APIKeyStatus.ACTIVE
            ).count()
            return [wallet.wallet_id, wallet.wallet_type, wallet.name, str(keys)]

        page, reason = revocation_page(
            self,
            request,
            queryset.order_by("path"),
            action="emergency_revoke_keys",
            title="Revoke every API key of these wallets and of the wallets below them?",
            warning="Every active key of each wallet, of its descendants and every key they minted stops working "
            "at once. This cannot be undone.",
            headings=["Wallet", "Type", "Name", "Active keys in the subtree"],
            row=row,
            confirm_label="Yes, revoke them all",
        )
        if page is not None:
            return page
        revoked = 0
        for wallet in queryset.order_by("path"):
            keys = key_services.api_key_emergency_revoke(wallet=wallet, reason=reason, actor=console_actor(request))
            revoked += len(keys)
            console_log(request, wallet, f"Emergency revocation of {len(keys)} key(s) in the subtree: {reason}")
        self.message_user(request, f"Revoked {revoked} key(s).", messages.WARNING)
        return None


class SuperuserChangesOnly(admin.ModelAdmin):
    """Only superusers add, change and delete; the view permission still shows the pages read-only.

    For users and groups: whoever changes a user can make themselves a superuser or reset an
    approver's password (and approve as them), and whoever changes a group can put any permission
    in a group they belong to. Django's ``change_user`` and ``change_group`` grant exactly that, so
    they grant nothing here. The password page checks ``has_change_permission`` too.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return _is_superuser(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _is_superuser(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _is_superuser(request)


def _is_superuser(request: HttpRequest) -> bool:
    return bool(request.user.is_active and request.user.is_superuser)


# Django's stock user and group pages are replaced (django.contrib.auth.admin, imported above,
# has registered them by now). A user who is a tenant's approver cannot be deleted
# (TenantApprover.user is PROTECT): the delete page lists the approver rows to remove first, on
# the approver page, which audits ``approver.removed``.
admin.site.unregister(get_user_model())
admin.site.unregister(Group)


@admin.register(get_user_model())
class ConsoleUserAdmin(SuperuserChangesOnly, UserAdmin):
    """Console accounts and approvers: Django's user pages, changed by superusers only."""


@admin.register(Group)
class ConsoleGroupAdmin(SuperuserChangesOnly, GroupAdmin):
    """Console roles (the groups of ``mcpgateway.0002_console_groups``), changed by superusers only."""


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "account_short", "kind", "amount_col", "balance_after_col", "description"]
    account_short = short_id_column("account", "account")
    list_filter = ["kind", "service_category"]
    search_fields = ["entry_id", "transaction_id", "account", "tenant_id", "correlation_id"]
    ordering = ["-created_at", "-entry_id"]
    date_hierarchy = "created_at"
    amount_col = credits_column("amount", "amount")
    balance_after_col = credits_column("balance_after", "balance after")


@admin.register(ChargeIdempotency)
class ChargeIdempotencyAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "wallet", "key", "status", "response_status", "entry"]
    search_fields = ["wallet__wallet_id", "key"]


class ServicePriceForm(forms.ModelForm):
    class Meta:
        model = ServicePrice
        fields = ["category", "credits_per_unit"]


@admin.register(ServicePrice)
class ServicePriceAdmin(ServiceSavedAdmin):
    """Category prices; saving goes through ``category_price_set`` (audited)."""

    list_display = ["category", "credits_per_unit", "updated_at"]
    form = ServicePriceForm

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["category"] if obj is not None else []

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ServicePrice, form: Any, change: bool) -> None:
        services.category_price_set(
            category=obj.category, credits_per_unit=form.cleaned_data["credits_per_unit"], actor=console_actor(request)
        )
