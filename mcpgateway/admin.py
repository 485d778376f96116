"""Operator console: the tool registry and governed actions (with external reconciliation results)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from billing import services as billing_services
from billing.admin import credits_column, money_display
from billing.models import ToolPrice, ToolPriceChange
from billing.selectors import tool_price
from common.console import ReadOnlyAdmin, ServiceSavedAdmin, confirmation_page, console_actor, console_each
from common.errors import ApplicationError
from common.formatting import EMPTY, timestamp_text
from common.listing import short_id_column
from mcpgateway import services
from mcpgateway.models import (
    Action,
    ActionState,
    Tool,
    UpstreamProbeSource,
    UpstreamServer,
    UpstreamServerState,
    UpstreamTransport,
)
from mcpgateway.services.upstreams import (
    UPSTREAM_EDITABLE,
    UpstreamServerInvalid,
    upstream_credential_set,
    upstream_credential_validate,
    upstream_error_class,
    upstream_server_check,
    upstream_server_create,
    upstream_server_sync,
    upstream_server_update,
    upstream_server_validate,
)
from mcpgateway.upstream.client import UpstreamError
from receipts.admin import ReconciliationAdmin
from receipts.services import reconciliation_record_executed, refund_reconciliation_mark_not_executed


class ToolPriceForm(forms.ModelForm):
    """A price for a tool the gateway knows: chosen from the synced tools, never typed."""

    tool = forms.ChoiceField(choices=(), help_text="One of the tools synced from the upstream (manage.py sync_tools).")

    class Meta:
        model = ToolPrice
        fields = ["tool", "credits"]
        help_texts = {
            "credits": "Credits per call (0 for a free tool). Remove the price to stop the tool being called."
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance and self.instance.pk:
            # Changing a price: the tool is the row's (shown read-only), not a choice. The declared field
            # would otherwise stay in the form without a value (the change page's KeyError: 'tool').
            self.fields.pop("tool", None)
            return
        priced = set(ToolPrice.objects.values_list("tool", flat=True))
        tools = Tool.objects.exclude(service_id__in=priced).order_by("service_id")
        self.fields["tool"].choices = [("", "---------")] + [  # type: ignore[attr-defined]
            (t.service_id, f"{t.service_id} ({t.category})") for t in tools
        ]


def price_history_table(tool: str, limit: int = 20) -> str:
    """The latest price changes of ``tool`` (``ToolPriceChange``: when, who, old, new), newest first."""
    changes = ToolPriceChange.objects.filter(tool=tool).order_by("-changed_at", "-id")[:limit]
    if not changes:
        return "No change recorded."

    def shown(value: Any, removed: bool = False) -> str:
        return "removed" if removed else ("not set" if value is None else money_display(value))

    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                f"{c.changed_at:%Y-%m-%d %H:%M:%S} UTC",
                c.actor or c.actor_key_id or "—",
                shown(c.old_credits),
                shown(c.new_credits, c.removed),
            )
            for c in changes
        ),
    )
    return format_html(
        '<table class="price-history"><thead><tr><th>When</th><th>Who</th><th>Old</th><th>New</th></tr></thead>'
        "<tbody>{}</tbody></table>",
        rows,
    )


@admin.register(ToolPrice)
class ToolPriceAdmin(ServiceSavedAdmin):
    """Tool prices (``billing.ToolPrice``, published in the pricing table); registered here, where the synced
    tools are known. Setting and removing go through ``tool_price_set`` / ``tool_price_remove`` (audited)."""

    list_display = ["tool", "credits", "updated_at", "change_link"]
    search_fields = ["tool"]
    ordering = ["tool"]
    form = ToolPriceForm

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["tool", "history"] if obj is not None else []

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["tool", "credits", "history"] if obj is not None else ["tool", "credits"]

    @admin.display(description="")
    def change_link(self, obj: ToolPrice) -> str:
        url = reverse("admin:billing_toolprice_change", args=[quote(obj.pk)])
        return format_html('<a href="{}" class="change-price">Change price</a>', url)

    @admin.display(description="price history")
    def history(self, obj: ToolPrice) -> str:
        return price_history_table(obj.tool)

    def save_model(self, request: HttpRequest, obj: ToolPrice, form: Any, change: bool) -> None:
        tool = obj.tool if change else form.cleaned_data["tool"]
        row = billing_services.tool_price_set(
            tool=tool, credits=form.cleaned_data["credits"], actor=console_actor(request)
        )
        obj.pk = row.pk

    def delete_model(self, request: HttpRequest, obj: ToolPrice) -> None:
        billing_services.tool_price_remove(tool=obj.tool, actor=console_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ToolPrice]) -> None:
        for row in queryset:
            billing_services.tool_price_remove(tool=row.tool, actor=console_actor(request))


@admin.register(ToolPriceChange)
class ToolPriceChangeAdmin(ReadOnlyAdmin):
    """Every price change of every tool (``tool_price_set`` / ``tool_price_remove``), read-only."""

    list_display = ["changed_at", "tool", "old_credits", "new_credits", "removed", "actor"]
    list_filter = ["removed"]
    search_fields = ["tool", "actor", "actor_key_id"]
    ordering = ["-changed_at", "-id"]
    date_hierarchy = "changed_at"


# The fields of a tool's page, in order.
TOOL_FIELDS = (
    "service_id",
    "server",
    "remote_name",
    "title",
    "description",
    "category",
    "enabled",
    "source",
    "input_schema",
    "input_schema_problem",
    "output_schema",
    "annotations",
    "synced_at",
    "price_controls",
)


@admin.register(Tool)
class ToolAdmin(ServiceSavedAdmin):
    list_display = ["service_id", "server", "category", "source", "enabled", "price", "schema_usable", "synced_at"]
    list_filter = ["server", "source", "enabled", "category"]
    search_fields = ["service_id", "description"]
    fields = list(TOOL_FIELDS)
    # A tool comes from its server's tools/list: only its category and whether it is offered are the operator's.
    readonly_fields = [name for name in TOOL_FIELDS if name not in ("category", "enabled")]

    @admin.display(description="credits per call")
    def price(self, obj: Tool) -> str:
        value = tool_price(obj.service_id)
        return "not set (not callable)" if value is None else f"{value:f}"

    @admin.display(description="price")
    def price_controls(self, obj: Tool) -> str:
        """The tool's price with the link that changes it (or sets it), and its recent history."""
        if ToolPrice.objects.filter(tool=obj.service_id).exists():
            url = reverse("admin:billing_toolprice_change", args=[quote(obj.service_id)])
            label = "Change price"
        else:
            url = reverse("admin:billing_toolprice_add") + "?" + urlencode({"tool": obj.service_id})
            label = "Set a price"
        return format_html(
            '{} <a href="{}" class="change-price" id="tool-price-link">{}</a><div>{}</div>',
            self.price(obj),
            url,
            label,
            price_history_table(obj.service_id, limit=5),
        )

    @admin.display(description="inputSchema usable", boolean=True)
    def schema_usable(self, obj: Tool) -> bool:
        return not obj.input_schema_problem

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tools come from sync_tools

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Tool, form: Any, change: bool) -> None:
        services.tool_update(
            service_id=obj.service_id,
            category=form.cleaned_data["category"],
            enabled=form.cleaned_data["enabled"],
            actor=f"admin:{request.user.get_username()}",
        )


@admin.register(Action)
class ActionAdmin(ReconciliationAdmin):
    list_display = [
        "action_short",
        "created_at",
        "wallet_short",
        "tool",
        "state",
        "outcome",
        "price_col",
        "receipt_short",
    ]
    action_short = short_id_column("action_id", "action")
    wallet_short = short_id_column("wallet_id", "wallet", link_to="billing.wallet")
    receipt_short = short_id_column("receipt_id", "receipt", link_to="receipts.receipt")
    price_col = credits_column("price", "price")
    list_filter = ["state", "outcome", "transport"]
    search_fields = ["action_id", "idempotency_key", "wallet__wallet_id", "tool"]
    ordering = ["-created_at"]
    date_hierarchy = "created_at"
    actions = ["reconciled_executed", "reconciled_not_executed"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Action._meta.fields]

    def _uncertain(self, queryset: QuerySet[Action]) -> QuerySet[Action]:
        return queryset.filter(state=ActionState.DELIVERY_UNCERTAIN, receipt__isnull=False)

    def _reconcile(self, request: HttpRequest, queryset: QuerySet[Action], *, executed: bool) -> HttpResponse | None:
        """Record the external reconciliation result of the selected delivery_uncertain actions: a
        confirmation page first, then the receipts service per action (the charge stands, or a refund
        is owed)."""
        record: Callable[..., object]
        if executed:
            record = reconciliation_record_executed
            effect = "The charge stands: the receipts are reconciled as executed."
            logged = "Recorded as executed (external reconciliation): the charge stands"
            summary = "{} delivery_uncertain action(s) recorded as executed."
        else:
            record = refund_reconciliation_mark_not_executed
            effect = "Each charge becomes owed back to its wallet (post the refunds under Refund reconciliations)."
            logged = "Marked not executed (external reconciliation): a refund is owed"
            summary = "{} action(s) marked not executed: retry their refunds under Refund reconciliations."
        page = confirmation_page(
            self,
            request,
            self._uncertain(queryset).order_by("action_id"),
            action="reconciled_executed" if executed else "reconciled_not_executed",
            title=f"Record that these calls WERE {'' if executed else 'NOT '}executed?",
            warning=f"{effect} Record this only after confirming with the upstream.",
            headings=["Action", "Wallet", "Tool", "Charged", "Receipt"],
            row=lambda a: [a.action_id, a.wallet_id, a.tool, money_display(a.price), a.receipt_id],
            confirm_label="Yes, record it",
        )
        if page is not None:
            return page

        def act(action: Action) -> None:
            assert action.receipt_id is not None
            record(receipt_id=action.receipt_id, actor=console_actor(request))

        done = console_each(
            self, request, self._uncertain(queryset), name=lambda a: a.action_id, act=act, log=lambda a, _: logged
        )
        self.message_user(request, summary.format(len(done)), messages.SUCCESS)
        return None

    @admin.action(
        description="External reconciliation: the call WAS executed (keep the charge)…", permissions=["reconcile"]
    )
    def reconciled_executed(self, request: HttpRequest, queryset: QuerySet[Action]) -> HttpResponse | None:
        return self._reconcile(request, queryset, executed=True)

    @admin.action(
        description="External reconciliation: the call was NOT executed (refund owed)…", permissions=["reconcile"]
    )
    def reconciled_not_executed(self, request: HttpRequest, queryset: QuerySet[Action]) -> HttpResponse | None:
        return self._reconcile(request, queryset, executed=False)


class UpstreamServerForm(forms.ModelForm):
    """A server's settings, and credentials to set (write-only: nothing stored is ever shown back)."""

    tenant_ids_text = forms.CharField(
        label="Tenants",
        required=False,
        help_text="Tenant ids that may use this server, one per line; empty: every tenant.",
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    transport = forms.ChoiceField(
        choices=UpstreamTransport.choices,
        required=False,
        initial=UpstreamTransport.STREAMABLE_HTTP,
        help_text="Streamable HTTP, or the legacy HTTP+SSE transport (MCP 2024-11-05: the URL is its SSE endpoint).",
    )
    credential_kind = forms.ChoiceField(
        label="Set credentials",
        required=False,
        choices=[
            ("", "(leave unchanged)"),
            ("bearer", "Bearer token"),
            ("headers", "Custom headers"),
            ("oauth_client_credentials", "OAuth 2.0 client credentials"),
        ],
    )
    credential_tenant = forms.CharField(
        label="For tenant", required=False, help_text="Empty: the server's own; a tenant id: that tenant's own."
    )
    credential_token = forms.CharField(label="Bearer token", required=False, widget=forms.PasswordInput)
    credential_headers = forms.CharField(
        label="Headers",
        required=False,
        help_text="One 'Name: value' per line.",
        widget=forms.Textarea(attrs={"rows": 3, "autocomplete": "off"}),
    )
    credential_token_url = forms.CharField(label="OAuth token URL", required=False, max_length=2000)
    credential_client_id = forms.CharField(label="OAuth client id", required=False, max_length=500)
    credential_client_secret = forms.CharField(
        label="OAuth client secret", required=False, max_length=500, widget=forms.PasswordInput, strip=False
    )
    credential_scope = forms.CharField(label="OAuth scope", required=False, max_length=2000)
    credential_resource = forms.CharField(
        label="OAuth resource", required=False, max_length=2000, help_text="RFC 8707 resource indicator (optional)."
    )

    class Meta:
        model = UpstreamServer
        # The settings the service changes; tenant_ids through tenant_ids_text, one tenant a line.
        fields = ["slug", *(name for name in UPSTREAM_EDITABLE if name != "tenant_ids")]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance and self.instance.pk and self.instance.tenant_ids is not None:
            self.initial["tenant_ids_text"] = "\n".join(self.instance.tenant_ids)

    def clean_transport(self) -> str:
        return self.cleaned_data.get("transport") or UpstreamTransport.STREAMABLE_HTTP

    def clean_tenant_ids_text(self) -> list[str] | None:
        lines = [line.strip() for line in self.cleaned_data["tenant_ids_text"].splitlines() if line.strip()]
        return lines or None

    def clean(self) -> dict[str, Any]:
        """The services' own checks, as form errors (nothing is saved with a problem)."""
        cleaned = super().clean() or {}
        try:
            upstream_server_validate({name: cleaned.get(name) for name in ("url", "connect_timeout", "read_timeout")})
            credential = self.credential()
            if credential is not None:
                upstream_credential_validate(kind=credential[0], secret=credential[1])
        except UpstreamServerInvalid as err:
            for field, msg in err.problems:
                self.add_error(None, f"{field}: {msg}")
        return cleaned

    def credential(self) -> tuple[str, dict[str, Any]] | None:
        kind = self.cleaned_data.get("credential_kind")
        if not kind:
            return None
        if kind == "bearer":
            return kind, {"token": self.cleaned_data.get("credential_token", "")}
        if kind == "oauth_client_credentials":
            names = ("token_url", "client_id", "client_secret", "scope", "resource")
            return kind, {name: self.cleaned_data.get(f"credential_{name}", "") for name in names}
        headers: dict[str, str] = {}
        for line in self.cleaned_data.get("credential_headers", "").splitlines():
            name, _, value = line.partition(":")
            if name.strip():
                headers[name.strip()] = value.strip()
        return kind, {"headers": headers}


@admin.register(UpstreamServer)
class UpstreamServerAdmin(ServiceSavedAdmin):
    """Upstream MCP servers: settings, write-only credentials, "Sync tools" and "Test connection" (audited)."""

    form = UpstreamServerForm
    list_display = [
        "slug",
        "name",
        "server_state",  # before the URL: on screen at 1366 px, filters shown
        "url",
        "enabled",
        "required",
        "tool_prefix",
        "tenants",
        "credentials",
        "tools",
        "last_synced_at",
    ]
    list_select_related = ["state"]  # the last probe kept (UpstreamServerState): the list probes nothing
    list_filter = ["enabled", "required"]
    search_fields = ["slug", "name", "url"]
    readonly_fields = ["server_id", "credentials", "last_synced_at", "server_state"]
    actions = ["sync_tools", "test_connection"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [
            *UpstreamServerForm.Meta.fields,
            "tenant_ids_text",
            "last_synced_at",
            "server_state",
            "credentials",
            "credential_kind",
            "credential_tenant",
            "credential_token",
            "credential_headers",
            "credential_token_url",
            "credential_client_id",
            "credential_client_secret",
            "credential_scope",
            "credential_resource",
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*self.readonly_fields, *(["slug"] if obj is not None else [])]

    @admin.display(description="tenants")
    def tenants(self, obj: UpstreamServer) -> str:
        return "all" if obj.tenant_ids is None else ", ".join(obj.tenant_ids)

    @admin.display(description="credentials set")
    def credentials(self, obj: UpstreamServer) -> str:
        """Whose credentials are set, their kind and when; never the secret (write-only)."""
        rows = sorted(
            obj.credentials.values_list("tenant_id", "kind", "set_at"), key=lambda row: (row[0] is not None, row[0])
        )
        shown = [f"{tenant or '(server)'}: {kind}, set on {timestamp_text(set_at)}" for tenant, kind, set_at in rows]
        return "; ".join(shown) or "none"

    @admin.display(description="state")
    def server_state(self, obj: UpstreamServer) -> str:
        """The last probe kept (readiness, "Test connection", a sync), never a probe made for the page."""
        if not obj.enabled:
            return "disabled"
        try:
            last = obj.state
        except UpstreamServerState.DoesNotExist:
            return "never checked"
        if last.reachable:
            seen = f"reachable, protocol {last.protocol_version or EMPTY}"
        else:
            seen = f"unreachable ({last.error_class})"
        return format_html(
            '<span class="server-state">{}</span><br><span class="server-state">checked {} ({})</span>',
            seen,
            timestamp_text(last.checked_at),
            last.checked_by,
        )

    @admin.display(description="tools")
    def tools(self, obj: UpstreamServer) -> int:
        return obj.tools.filter(enabled=True).count()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # disable a server instead: its tools, actions and receipts name it

    def save_model(self, request: HttpRequest, obj: UpstreamServer, form: Any, change: bool) -> None:
        actor = console_actor(request)
        values = {name: form.cleaned_data[name] for name in UpstreamServerForm.Meta.fields if name != "slug"}
        values["tenant_ids"] = form.cleaned_data["tenant_ids_text"]
        try:
            if change:
                server = upstream_server_update(server_id=obj.server_id, actor=actor, **values)
            else:
                url, name = values.pop("url"), values.pop("name")
                server = upstream_server_create(
                    slug=form.cleaned_data["slug"], name=name, url=url, actor=actor, **values
                )
            obj.pk = server.pk
            credential = form.credential()
            if credential is not None:
                upstream_credential_set(
                    server_id=server.server_id,
                    tenant_id=form.cleaned_data.get("credential_tenant") or None,
                    kind=credential[0],
                    secret=credential[1],
                    actor=actor,
                )
        except ApplicationError as err:
            self.message_user(request, err.detail_message, messages.ERROR)
        except UpstreamServerInvalid as err:
            self.message_user(request, f"Not saved: {err}", messages.ERROR)

    @admin.action(description="Sync tools (added, changed, disabled, refused)", permissions=["change"])
    def sync_tools(self, request: HttpRequest, queryset: QuerySet[UpstreamServer]) -> None:
        for server in queryset.order_by("slug"):
            try:
                report = upstream_server_sync(server=server, actor=console_actor(request))
            except UpstreamError as exc:
                self.message_user(
                    request, f"{server.slug}: tools/list failed ({upstream_error_class(exc)})", messages.ERROR
                )
                continue
            self.message_user(
                request,
                f"{server.slug}: added {', '.join(report.created) or 'none'}; "
                f"changed {', '.join(report.changed) or 'none'}; disabled {', '.join(report.disabled) or 'none'}",
                messages.SUCCESS,
            )
            for reason in report.refused.values():
                self.message_user(request, f"{server.slug}: refused: {reason}", messages.WARNING)

    @admin.action(description="Test connection", permissions=["view"])
    def test_connection(self, request: HttpRequest, queryset: QuerySet[UpstreamServer]) -> None:
        for server in queryset.order_by("slug"):
            probe = upstream_server_check(server=server, checked_by=UpstreamProbeSource.CONSOLE)
            if probe["reachable"]:
                self.message_user(
                    request, f"{server.slug}: reachable, protocol {probe['protocol_version']}", messages.SUCCESS
                )
            else:
                self.message_user(request, f"{server.slug}: not reachable ({probe['error']})", messages.ERROR)
