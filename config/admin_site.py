"""The operator console's AdminSite: Django's, with failed logins throttled (access.login_throttle) and
crafted requests refused before any console view runs (``refuse_crafted_requests``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.module_loading import import_string

from common.console import View, console_summary, refuse_crafted_requests


class TollgateAdminSite(admin.AdminSite):
    site_header = "Tollgate operator console"
    site_title = "Tollgate console"
    # The app list is on the index page and every page has breadcrumbs; the nav sidebar took 300 of
    # 1366 px from every list (docs/decisions.md, Operator console).
    enable_nav_sidebar = False

    def admin_view(self, view: View, cacheable: bool = False) -> View:
        """Every console page (each ModelAdmin's views and the site's own) refuses crafted requests,
        after Django's login check."""
        return super().admin_view(refuse_crafted_requests(view), cacheable)

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        return super().index(request, {**(extra_context or {}), "summary": console_summary(request)})

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # The throttle is the access layer's (settings.CONSOLE_LOGIN_THROTTLE): config imports no app.
        throttle = import_string(settings.CONSOLE_LOGIN_THROTTLE)
        response = throttle(super().login)(request, extra_context)
        assert isinstance(response, HttpResponse)
        return response
