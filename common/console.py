"""Console helpers every app's ``admin.py`` shares (docs/decisions.md, Operator console and Foundation).

Django-only: no app is imported here. The site (``config.admin_site``) wraps every console view in
``refuse_crafted_requests`` and builds its index from the figures each app registers at start-up
(``console_figures_register`` in the app's ``AppConfig.ready``), so the site imports no app.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar, cast
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import csrf_protect_m
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html

from common.errors import ApplicationError, RequestValidationError
from common.jsonbody import storable_text

# Lookups no console filter offers: a typed pattern is a PostgreSQL error ("invalid regular
# expression") or a slow scan, never a filter an operator needs.
REFUSED_LOOKUPS = frozenset({"regex", "iregex"})
View = TypeVar("View", bound=Callable[..., Any])
Row = TypeVar("Row")
Done = TypeVar("Done")


def refuse_crafted_requests(view: View) -> View:
    """Wrap a console view so that what no console page sends is refused before the view runs.

    - a query or form key or value holding NUL or a lone surrogate (``common.jsonbody.storable_text``):
      400. PostgreSQL text cannot hold either; the query raised a 500. (A path holding NUL is
      already a 404, ``config.middleware``.)
    - a regex lookup in the query (``?name__regex=(``): 400, like any lookup the console refuses.
    - "Save as new" (``_saveasnew``) where the page does not offer it (``save_as`` false, as on
      every Tollgate page): 403. Django honours it anyway, turning a change page into the generic
      add form and skipping a custom ``add_view`` and its services.
    """
    owner = getattr(view, "__self__", None)  # the ModelAdmin (or the site) whose view this is

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        for query in (request.GET, request.POST):
            for key, values in query.lists():
                if any(storable_text(text) is None for text in (key, *values)):
                    raise BadRequest("A request value holds NUL or a lone surrogate.")
        for key in request.GET:
            if REFUSED_LOOKUPS.intersection(key.split(LOOKUP_SEP)):
                raise DisallowedModelAdminLookup(f"Filtering by {key} is not allowed.")
        if "_saveasnew" in request.POST and not getattr(owner, "save_as", False):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return cast(View, guarded)


# The index page's figures: each app registers, in its AppConfig.ready, a function of (user, now)
# returning the figures that user may see (docs/decisions.md, Foundation).
Figures = Callable[[Any, datetime], dict[str, Any]]
_figures: list[Figures] = []


def console_figures_register(figures: Figures) -> None:
    """Add an app's figures to the console index (once; ``ready`` may run again in tests)."""
    if figures not in _figures:
        _figures.append(figures)


def console_summary(request: HttpRequest) -> dict[str, Any]:
    """The index page's summary: each figure only for a user allowed to see what it counts."""
    user, now = request.user, timezone.now()
    summary: dict[str, Any] = {}
    for figures in _figures:
        summary.update(figures(user, now))
    return summary


class ReadOnlyAdmin(admin.ModelAdmin):
    """A page that shows rows and changes none: no add, change or delete, whatever the permissions."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ServiceSavedAdmin(admin.ModelAdmin):
    """A change form whose ``save_model`` calls a service.

    Django wraps the add/change view in ``transaction.atomic()``; the services
    own durable transactions, which cannot nest in it. The form is validated and
    rendered the same; the service's transaction is the only one. A service's
    refusal (an ``ApplicationError``) goes to ``service_refused``.
    """

    @csrf_protect_m
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            return self._changeform_view(request, object_id, form_url, extra_context)  # type: ignore[attr-defined]
        except ApplicationError as exc:
            return self.service_refused(request, exc)

    def service_refused(self, request: HttpRequest, exc: ApplicationError) -> HttpResponse:
        """What the page does when the service refuses the save: here nothing of its own (the error stands);
        a page whose service may refuse for reasons the form cannot see shows them instead."""
        raise exc


def confirmation_page(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    action: str,
    title: str,
    warning: str,
    headings: list[str],
    row: Any,
    confirm_label: str,
    form: forms.Form | None = None,
) -> HttpResponse | None:
    """An intermediate confirmation page like Django's delete confirmation, or None once confirmed.

    Destructive console actions (close, revoke, reconciliation results and refunds) list the
    objects and their balances or effects, and act only on the POST that carries ``post=yes``.
    With a ``form`` (a revocation's reason) the page asks for it and confirms only once it is valid;
    the caller reads ``form.cleaned_data``.
    """
    if request.POST.get("post") == "yes" and (form is None or form.is_valid()):
        return None
    objects = list(queryset)
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "warning": warning,
        "headings": headings,
        "rows": [row(obj) for obj in objects],
        "selected": [obj.pk for obj in objects],
        "action": action,
        "confirm_label": confirm_label,
        "form": form,
        "cancel_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"),
        "opts": opts,
    }
    return TemplateResponse(request, "admin/confirm_action.html", context)


def console_page(modeladmin: admin.ModelAdmin, route: str, view: Callable[..., Any], name: str) -> URLPattern:
    """A page of its own on a model's console pages (for ``get_urls``, ahead of Django's), behind the
    site's ``admin_view`` (active staff signed in, crafted requests refused, never cached)."""
    return path(route, modeladmin.admin_site.admin_view(view), name=name)


def console_actor(request: HttpRequest) -> str:
    """The actor every console change is audited with: ``admin:<username>``."""
    return f"admin:{request.user.get_username()}" if request.user.is_authenticated else "admin"


class RevocationReasonForm(forms.Form):
    """Why keys or permits are revoked: required, stored on the revoked rows and in their audit events."""

    reason = forms.CharField(
        max_length=200,
        min_length=3,
        strip=True,
        help_text="Stored with the revocation and in its audit event (3 to 200 characters).",
    )


def revocation_page(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Any], **page: Any
) -> tuple[HttpResponse | None, str]:
    """A revocation's confirmation page (``confirmation_page`` with ``page``), which asks for its reason (the
    form is bound on the confirming POST): ``(page, "")`` until it is confirmed with a valid reason, then
    ``(None, reason)``."""
    form = RevocationReasonForm(request.POST if request.POST.get("post") == "yes" else None)
    response = confirmation_page(modeladmin, request, queryset, form=form, **page)
    return (response, "") if response is not None else (None, form.cleaned_data["reason"])


def console_log(request: HttpRequest, obj: Any, message: str) -> None:
    """Record a console action on ``obj`` as a Django ``LogEntry`` ("Changed" with ``message``), which the
    object's History and the index's Recent actions show. Every custom action calls it after its service
    committed, beside the service's audit event (the audit chain stays the evidence; this is the
    console's own trail)."""
    if not request.user.is_authenticated:
        return
    LogEntry.objects.log_actions(
        user_id=request.user.pk, queryset=[obj], action_flag=CHANGE, change_message=message[:2000], single_object=True
    )


def console_each(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    rows: Iterable[Row],
    *,
    name: Callable[[Row], str],
    act: Callable[[Row], Done],
    log: Callable[[Row, Done], str],
) -> list[Done]:
    """A console action's loop: ``act`` (the row's service call) on each row in turn. A refusal (an
    ``ApplicationError``) is said on the page, ``<name(row)>: <message>``, and the row skipped; a row done
    is recorded with ``console_log`` (``log(row, what act returned)``). Returns what ``act`` returned for
    each row done, in order; the caller says how many were done."""
    done: list[Done] = []
    for row in rows:
        try:
            result = act(row)
        except ApplicationError as err:
            modeladmin.message_user(request, f"{name(row)}: {err.detail_message}", messages.ERROR)
            continue
        done.append(result)
        console_log(request, row, log(row, result))
    return done


def console_failure(exc: Exception) -> str:
    """An error as a console message: ``<code>: <message>``, or a validation failure's messages."""
    if isinstance(exc, ApplicationError):
        return f"{exc.code}: {exc.detail_message}"
    if isinstance(exc, RequestValidationError):
        return "; ".join(str(e.get("msg")) for e in exc.errors)
    return str(exc)


def has_perm(request: HttpRequest, permission: str) -> bool:
    """Django's model permission check (``app_label.codename``); never ``is_staff`` alone."""
    return bool(request.user.is_active and request.user.has_perm(permission))


def changelist_link(model: str, label: str, **query: str) -> str:
    """A link to ``app.model``'s list page filtered by ``query`` (for "related objects" fields)."""
    app_label, model_name = model.split(".")
    url = reverse(f"admin:{app_label}_{model_name}_changelist") + "?" + urlencode(query)
    return format_html('<a href="{}">{}</a>', url, label)
