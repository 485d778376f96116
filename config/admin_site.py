"""The operator console's AdminSite: Django's, with failed logins throttled (billing.ratelimit)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest, HttpResponse

from billing.ratelimit import throttle_failed_logins


class TollgateAdminSite(admin.AdminSite):
    site_header = "Tollgate operator console"
    site_title = "Tollgate console"

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = throttle_failed_logins(super().login)(request, extra_context)
        assert isinstance(response, HttpResponse)
        return response


class TollgateAdminConfig(AdminConfig):
    default_site = "config.admin_site.TollgateAdminSite"
