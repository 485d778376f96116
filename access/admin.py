"""Operator console: API keys (create, the secret shown once, revoke) and their log, the sign-ins
locked now and the unlock action (``access.unlock_login``). Every change goes through the services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from access import login_throttle, services
from access.models import APIKey, APIKeyStatus, KeyRotationLog, LoginThrottle
from access.wallets import wallet_directory
from common.console import (
    ReadOnlyAdmin,
    ServiceSavedAdmin,
    console_actor,
    console_failure,
    console_log,
    console_page,
    has_perm,
    revocation_page,
)
from common.errors import ApplicationError
from common.listing import short_id_column

# Session key under which a new API key's secret waits for its single reveal.
SECRET_SESSION_PREFIX = "tollgate:new-key-secret:"


@admin.register(LoginThrottle)
class LoginThrottleAdmin(ReadOnlyAdmin):
    """The sign-ins locked now (access.login_throttle): an account from one client, an account from
    every client, or a client for every account, with the lockout level and its end. Read-only; the
    "Unlock" action (``access.unlock_login``) lifts a lock through ``login_throttle_unlock``, audited."""

    list_display = ["scope", "account_label", "client", "level", "locked_until"]
    list_filter = ["scope"]
    search_fields = ["account_label", "client"]
    ordering = ["-locked_until"]
    actions = ["unlock_selected"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[LoginThrottle]:
        return super().get_queryset(request).filter(locked_until__gt=login_throttle.clock())

    def has_unlock_login_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "access.unlock_login")

    @admin.action(description="Unlock selected sign-ins", permissions=["unlock_login"])
    def unlock_selected(self, request: HttpRequest, queryset: QuerySet[LoginThrottle]) -> None:
        unlocked = login_throttle.login_throttle_unlock(
            throttle_ids=list(queryset.values_list("pk", flat=True)), actor=console_actor(request)
        )
        for lock in unlocked:
            console_log(request, lock, "Unlocked the sign-in lockout")
        self.message_user(request, f"Unlocked {len(unlocked)} sign-in lockout(s).", messages.SUCCESS)


class APIKeyCreateForm(forms.ModelForm):
    """Create a key for a wallet; an operator (full-access) key is a separate, confirmed choice.

    Operator keys need ``access.create_operator_key`` and a superuser, the box ticked and
    the confirmation given; otherwise a wallet is required.
    """

    operator_key = forms.BooleanField(
        required=False, label="Operator key", help_text="Full access to every tenant. Superusers only."
    )
    confirm_operator_key = forms.BooleanField(
        required=False, label="I understand that an operator key can move money and revoke keys in every tenant"
    )
    may_create_operator_key = False

    # The wallet is billing's: its choices come through billing's directory (access.wallets).
    wallet: forms.ModelChoiceField[Any] = forms.ModelChoiceField(
        queryset=None,
        required=False,
        help_text="The wallet the key acts for (and, through it, the wallets below it).",
    )

    class Meta:
        model = APIKey
        fields = ["name"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["wallet"].queryset = wallet_directory().choices()  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        wallet, operator = data.get("wallet"), data.get("operator_key")
        if operator:
            if not self.may_create_operator_key:
                raise forms.ValidationError("An operator (full-access) key needs a superuser with that permission.")
            if wallet is not None:
                self.add_error("wallet", "An operator key has no wallet: leave it empty.")
            if not data.get("confirm_operator_key"):
                self.add_error("confirm_operator_key", "Confirm that this key has full access.")
        elif wallet is None:
            self.add_error("wallet", "Choose a wallet (operator keys are a separate choice below).")
        return data


# A key as its revocation and rotation pages list it: revoking a key revokes the active keys it minted too.
KEY_HEADINGS = ["Key", "Wallet", "Name", "Keys it minted"]


def key_row(key: APIKey) -> list[str]:
    minted = APIKey.objects.filter(created_by_key_id=key.key_id, status=APIKeyStatus.ACTIVE).count()
    return [key.key_id, key.wallet_id or "operator (all tenants)", key.name, str(minted)]


@admin.register(APIKey)
class APIKeyAdmin(ServiceSavedAdmin):
    list_display = ["key_short", "wallet_short", "name", "status", "created_at", "revoked_at"]
    key_short = short_id_column("key_id", "key")
    # The wallet's page is billing's console page: linked by its URL name, as access imports nothing of billing.
    wallet_short = short_id_column("wallet_id", "wallet", link_to="billing.wallet")
    list_filter = ["status"]
    search_fields = ["key_id", "name", "wallet_id", "created_by_key_id"]
    ordering = ["-created_at"]
    # The secret hash is deliberately not shown anywhere in the console.
    readonly_fields = [
        "key_id",
        "wallet_id",
        "tenant_id",
        "name",
        "masked",
        "status",
        "created_at",
        "revoked_at",
        "revoke_reason",
        "rotated_from",
        "created_by_key_id",
    ]
    actions = ["rotate_selected", "revoke_selected"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        """A wallet key acts with its wallet's money (it funds the wallets below it and charges them), so
        issuing one moves money: it needs ``billing.fund_wallet`` besides ``access.add_apikey``."""
        return super().has_add_permission(request) and has_perm(request, "billing.fund_wallet")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            if has_perm(request, "access.create_operator_key") and request.user.is_superuser:
                return ["wallet", "name", "operator_key", "confirm_operator_key"]
            return ["wallet", "name"]
        return list(self.readonly_fields)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else list(self.readonly_fields)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = APIKeyCreateForm
        form = super().get_form(request, obj, change, **kwargs)
        if obj is None:
            form.may_create_operator_key = bool(  # type: ignore[attr-defined]
                request.user.is_superuser and has_perm(request, "access.create_operator_key")
            )
        return form

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """A key's page is read-only ("View API key", no Save that reports a change that never
        happened); keys change only through the revoke action and rotation."""
        return False if obj is not None else super().has_change_permission(request, obj)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """No filter on the secret hash: ``?secret_hash__startswith=`` would read it out by probing."""
        return lookup.split(LOOKUP_SEP)[0] != "secret_hash" and super().lookup_allowed(lookup, value, request)

    def service_refused(self, request: HttpRequest, exc: ApplicationError) -> HttpResponse:
        """The service may refuse the key (``API_KEYS_PER_WALLET``, a closed wallet): the form again, with why."""
        self.message_user(request, console_failure(exc), messages.ERROR)
        return HttpResponseRedirect(request.get_full_path())

    def save_model(self, request: HttpRequest, obj: APIKey, form: Any, change: bool) -> None:
        if change:
            return  # keys are immutable from the console; use the revoke action
        wallet = form.cleaned_data.get("wallet")
        name = form.cleaned_data.get("name") or ""
        if wallet is None:
            if not (request.user.is_superuser and has_perm(request, "access.create_operator_key")):
                raise PermissionDenied  # the form refuses it first
            issued = services.operator_key_create(name=name or "operator", actor=console_actor(request))
        else:
            issued = services.api_key_create(wallet=wallet, name=name, actor=console_actor(request))
        # Let the admin's change log and redirect use the real row.
        obj.pk = issued.key.pk
        obj.key_id = issued.key.key_id
        obj._state.adding = False
        request._tollgate_new_secret = issued.secret  # type: ignore[attr-defined]

    def response_add(self, request: HttpRequest, obj: APIKey, post_url_continue: str | None = None) -> HttpResponse:
        """Post/redirect/get: the secret waits in the session for one GET of the reveal page."""
        secret = getattr(request, "_tollgate_new_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        request.session[f"{SECRET_SESSION_PREFIX}{obj.pk}"] = secret
        return HttpResponseRedirect(reverse("admin:access_apikey_secret", args=[obj.pk]))

    def get_urls(self) -> list[Any]:
        reveal = console_page(self, "<str:key_id>/secret/", self.secret_view, "access_apikey_secret")
        return [reveal, *super().get_urls()]

    def secret_view(self, request: HttpRequest, key_id: str) -> HttpResponse:
        """Show a new key's secret once: the first GET takes it out of the session; a reload says so."""
        key = APIKey.objects.filter(pk=key_id).first()
        if key is None or not self.has_add_permission(request):
            raise PermissionDenied
        secret = request.session.pop(f"{SECRET_SESSION_PREFIX}{key_id}", None)
        context = {
            **self.admin_site.each_context(request),
            "title": "API key created" if secret else "API key secret already shown",
            "key": key,
            "secret": secret,
            "opts": self.model._meta,
        }
        response = TemplateResponse(request, "admin/access/apikey_secret.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def has_revoke_key_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "access.revoke_key")

    def has_rotate_key_permission(self, request: HttpRequest) -> bool:
        """Rotating mints a successor (what adding a key needs) and revokes the old key (``revoke_key``)."""
        return self.has_add_permission(request) and has_perm(request, "access.revoke_key")

    @admin.action(description="Rotate the selected key (new secret shown once)…", permissions=["rotate_key"])
    def rotate_selected(self, request: HttpRequest, queryset: QuerySet[APIKey]) -> HttpResponse | None:
        """One wallet key at a time: its successor's secret goes through the same one-time reveal as a new key's."""
        keys = list(queryset.filter(status=APIKeyStatus.ACTIVE, wallet_id__isnull=False)[:2])
        if len(keys) != 1:
            self.message_user(request, "Select exactly one active wallet key to rotate.", messages.ERROR)
            return None
        key = keys[0]
        page, reason = revocation_page(
            self,
            request,
            queryset.filter(pk=key.pk),
            action="rotate_selected",
            title="Rotate this API key?",
            warning="A successor key is created and its secret shown once. The old key, with every key it minted, "
            "stops working at once.",
            headings=KEY_HEADINGS,
            row=key_row,
            confirm_label="Yes, rotate it",
        )
        if page is not None:
            return page
        wallet = key.wallet
        assert wallet is not None
        try:
            issued = services.api_key_rotate(
                wallet=wallet, key_id=key.key_id, revoke_old=True, reason=reason, actor=console_actor(request)
            )
        except ApplicationError as exc:
            self.message_user(request, f"{key.key_id}: {console_failure(exc)}", messages.ERROR)
            return None
        console_log(request, key, f"Rotated to {issued.key.key_id}; the old key was revoked: {reason}")
        self.log_addition(request, issued.key, f"Created by rotating {key.key_id}")
        request.session[f"{SECRET_SESSION_PREFIX}{issued.key.pk}"] = issued.secret
        return HttpResponseRedirect(reverse("admin:access_apikey_secret", args=[issued.key.pk]))

    @admin.action(description="Revoke selected keys…", permissions=["revoke_key"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[APIKey]) -> HttpResponse | None:
        page, reason = revocation_page(
            self,
            request,
            queryset.filter(status=APIKeyStatus.ACTIVE).order_by("key_id"),
            action="revoke_selected",
            title="Revoke these API keys?",
            warning="Revoked keys stop working at once, with every key they minted. This cannot be undone.",
            headings=KEY_HEADINGS,
            row=key_row,
            confirm_label="Yes, revoke them",
        )
        if page is not None:
            return page
        count = 0
        for key in queryset.filter(status=APIKeyStatus.ACTIVE):
            if key.wallet is None:
                if not has_perm(request, "access.create_operator_key"):
                    self.message_user(
                        request, f"{key.key_id}: operator keys need the operator-key permission.", messages.ERROR
                    )
                    continue
                services.operator_key_revoke(key_id=key.key_id, reason=reason, actor=console_actor(request))
            else:
                services.api_key_revoke(
                    wallet=key.wallet, key_id=key.key_id, reason=reason, actor=console_actor(request)
                )
            count += 1
            console_log(request, key, f"Revoked the key: {reason}")
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)
        return None


@admin.register(KeyRotationLog)
class KeyRotationLogAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "wallet_id", "action", "key_id", "new_key_id", "reason"]
    list_filter = ["action"]
