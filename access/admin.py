"""Operator console: the sign-ins locked now, and the unlock action (``access.unlock_login``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from access import login_throttle
from access.models import LoginThrottle
from common.console import console_actor, console_log, has_perm


@admin.register(LoginThrottle)
class LoginThrottleAdmin(admin.ModelAdmin):
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

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

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
