"""Operator console: wallets and API keys. Every change goes through the services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from billing import services
from billing.models import APIKey, APIKeyStatus, KeyRotationLog, Wallet


@admin.register(Wallet)
class WalletAdmin(admin.ModelAdmin):
    list_display = ["wallet_id", "wallet_type", "name", "status", "balance", "tenant_id", "created_at"]
    list_filter = ["wallet_type", "status"]
    search_fields = ["wallet_id", "name", "tenant_id"]
    readonly_fields = [f.name for f in Wallet._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class APIKeyCreateForm(forms.ModelForm):
    """Create a key: choose a wallet, or none for an operator key."""

    class Meta:
        model = APIKey
        fields = ["wallet", "name"]
        help_texts = {"wallet": "Leave empty to create an operator key (full access)."}


@admin.register(APIKey)
class APIKeyAdmin(admin.ModelAdmin):
    list_display = ["key_id", "wallet", "name", "status", "created_at", "revoked_at"]
    list_filter = ["status"]
    search_fields = ["key_id", "name", "wallet__wallet_id"]
    # The secret hash is deliberately not shown anywhere in the console.
    readonly_fields = [
        "key_id",
        "wallet",
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
    actions = ["revoke_selected"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["wallet", "name"]
        return list(self.readonly_fields)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else list(self.readonly_fields)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = APIKeyCreateForm
        return super().get_form(request, obj, change, **kwargs)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: APIKey, form: Any, change: bool) -> None:
        if change:
            return  # keys are immutable from the console; use the revoke action
        wallet = form.cleaned_data.get("wallet")
        name = form.cleaned_data.get("name") or ""
        if wallet is None:
            issued = services.operator_key_create(name=name or "operator")
        else:
            issued = services.api_key_create(wallet=wallet, name=name)
        # Let the admin's change log and redirect use the real row.
        obj.pk = issued.key.pk
        obj.key_id = issued.key.key_id
        obj._state.adding = False
        request._tollgate_new_secret = issued.secret  # type: ignore[attr-defined]

    def response_add(self, request: HttpRequest, obj: APIKey, post_url_continue: str | None = None) -> HttpResponse:
        secret = getattr(request, "_tollgate_new_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": "API key created",
            "key": APIKey.objects.get(pk=obj.pk),
            "secret": secret,
            "opts": self.model._meta,
        }
        response = TemplateResponse(request, "admin/billing/apikey_secret.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected keys")
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[APIKey]) -> None:
        count = 0
        for key in queryset.filter(status=APIKeyStatus.ACTIVE):
            if key.wallet is None:
                from django.db import transaction
                from django.utils import timezone

                with transaction.atomic():
                    APIKey.objects.filter(pk=key.pk, status=APIKeyStatus.ACTIVE).update(
                        status=APIKeyStatus.REVOKED, revoked_at=timezone.now(), revoke_reason="operator_console"
                    )
            else:
                services.api_key_revoke(wallet=key.wallet, key_id=key.key_id, reason="operator_console")
            count += 1
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)


@admin.register(KeyRotationLog)
class KeyRotationLogAdmin(admin.ModelAdmin):
    list_display = ["created_at", "wallet", "action", "key_id", "new_key_id", "reason"]
    list_filter = ["action"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
