"""The tool registry: the catalogue, the upstream's tools synced in, the local dogfood tool, console edits.

Tools change rarely and are read on every call, so each process also keeps here the rows the
governed call has read (``_registered_tool``), by name and version, with their argument validators.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit_record
from billing.models import ServiceCategory
from common import fastsql
from mcpgateway.argschema import ArgumentsSchema, SchemaUnusable, input_schema_problem, schema_compile
from mcpgateway.models import Tool, ToolSource, UpstreamServer
from mcpgateway.upstream.validators import output_schema_problem

logger = logging.getLogger("tollgate.gateway")
SERVICE_ID_MAX_LENGTH: int = Tool._meta.get_field("service_id").max_length  # type: ignore[assignment]

DOGFOOD_TOOL = "partner.notes.write"


def tool_is_callable(tool: Tool) -> bool:
    """Enabled, and (a local tool) its flag on or (an upstream tool) an outputSchema the gateway can check.

    Every answer is judged against the tool's outputSchema; with one that does not compile, a call
    could be charged but never sent, so such a tool (``tools_sync`` stores it disabled, but a row can
    be re-enabled or older than that check) is refused before anything is accepted or charged.
    """
    if not tool.enabled:
        return False
    if tool.source == ToolSource.LOCAL:
        return bool(settings.ENABLE_DOGFOOD_TOOL) and tool.service_id == DOGFOOD_TOOL
    return output_schema_problem(tool.output_schema or None) is None


def tool_schema_problem(tool: Tool) -> str | None:
    """Why the gateway cannot validate arguments against the tool's inputSchema; None when it can.

    The reason ``tools_sync`` stored, or (a row stored before that check) found now, cached per schema.
    """
    return tool.input_schema_problem or input_schema_problem(tool.input_schema or {"type": "object"})


def tool_is_listed(tool: Tool) -> bool:
    """Callable, and its inputSchema usable: what tools/list and the catalogue offer.

    A tool whose inputSchema is unusable is not offered (an agent could not call it); a call that
    names it all the same is refused with ``tool_schema_unusable``, naming the tool.
    """
    return tool_is_callable(tool) and tool_schema_problem(tool) is None


def tools_catalog(*, category: str | None = None) -> list[Tool]:
    """Listed tools, by name; the local dogfood tool only while ``ENABLE_DOGFOOD_TOOL`` is on.

    The tools of a disabled upstream server are not listed (their calls are refused before any
    debit, ``upstreams.upstream_check_open``).
    """
    qs = (
        Tool.objects.filter(enabled=True)
        .filter(Q(server__isnull=True) | Q(server__enabled=True))
        .order_by("service_id")
    )
    if category:
        qs = qs.filter(category=category)
    return [t for t in qs if tool_is_listed(t)]


def tool_get(name: str) -> Tool | None:
    """The callable tool ``name`` (its inputSchema may be unusable: the call path refuses it by name)."""
    tool = Tool.objects.filter(service_id=name).first()
    return tool if tool is not None and tool_is_callable(tool) else None


@dataclass(frozen=True)
class _RegisteredTool:
    """A tool's row as of one version, with its inputSchema compiled, or why it cannot be (then None)."""

    version: str
    tool: Tool
    arguments: ArgumentsSchema | None
    schema_problem: str | None
    server: UpstreamServer | None = None  # the tool's server as of that version (its row moves the version)


# Tools change rarely (a sync, a console edit) and are read on every call: each process keeps the rows
# it has read, by name, with the version they had (``gateway_tool_version``: any change to the row,
# however it is made, gives it a new one). The version is read in the call's lookup, or compared in its
# claim when the call is authorized from the cache, so a changed tool is read again at once.
_registered: dict[str, _RegisteredTool] = {}

_TOOL_AT_VERSION_SQL = (
    f"SELECT {fastsql.columns(Tool, 't')}, {fastsql.columns(UpstreamServer, 's')}, "  # noqa: S608
    "gateway_tool_version(t.service_id) "
    "FROM mcpgateway_tool t LEFT JOIN mcpgateway_upstream_server s ON s.server_id = t.server_id "
    "WHERE t.service_id = %s"
)


def _registered_tool(name: str, version: str) -> _RegisteredTool | None:
    """The tool ``name`` at ``version`` (as the lookup saw it), from the process's cache or read now."""
    cached = _registered.get(name)
    if cached is not None and cached.version == version:
        return cached
    row = fastsql.fetch_row(_TOOL_AT_VERSION_SQL, [name])
    if row is None:  # removed since the lookup
        _registered.pop(name, None)
        return None
    width = fastsql.width(Tool)
    tool = fastsql.instance(Tool, row[:width])
    server_row = row[width:-1]
    server = fastsql.instance(UpstreamServer, server_row) if server_row[0] is not None else None
    arguments: ArgumentsSchema | None = None
    problem: str | None = tool.input_schema_problem or None
    if problem is None:  # a row stored before tools_sync checked the schema is checked here
        try:
            arguments = schema_compile(tool.input_schema or {"type": "object"})
        except SchemaUnusable as exc:
            problem = str(exc)
    registered = _RegisteredTool(version=row[-1], tool=tool, arguments=arguments, schema_problem=problem, server=server)
    _registered[name] = registered
    return registered


@dataclass(frozen=True)
class SyncReport:
    """What ``tools_sync`` did: exposed tool names created, updated, disabled (vanished upstream), refused.

    ``changed``: the updated tools whose listing changed (description, schemas, annotations, or
    enabled again). ``invalid``: tools registered (among created or updated) but disabled because
    their outputSchema is not a valid JSON Schema, with the reason. ``unusable``: tools registered
    whose inputSchema the gateway cannot validate arguments against, with the reason; their calls
    are refused. ``refused``: names another server's tool (or the local tool) already has, with
    the reason; nothing was stored for them.
    """

    created: list[str]
    updated: list[str]
    disabled: list[str]
    invalid: dict[str, str] = field(default_factory=dict)
    unusable: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)


_LISTED = ("title", "description", "input_schema", "output_schema", "annotations", "enabled")


@transaction.atomic(durable=True)
def tools_sync(
    *, remote_tools: list[dict[str, Any]], server: UpstreamServer | None = None, actor: str = "sync_tools"
) -> SyncReport:
    """Register an upstream's tools (name, description, schemas, annotations); disable its vanished ones.

    ``server``: the tools are that server's, exposed as ``<tool_prefix>.<name>`` (the name alone
    without a prefix) and called by their upstream name; None registers them without a server
    (the ``UPSTREAM_MCP_URL`` upstream's, called there), as before servers were records. A name
    that another server's tool, or the local tool, already has is refused (``refused``) and
    nothing of it is stored: a tool is never renamed or moved between servers by a sync. The
    server ``default`` takes over the tools registered without a server (they were its own).
    A tool of this server that the upstream no longer lists is disabled, never deleted.

    Prices are untouched: a new tool has no price until an operator sets one. Schemas are stored as
    the upstream lists them. A tool whose outputSchema is not a valid JSON Schema is stored
    disabled, and named in the report, the audit event and the log: the gateway could not judge its
    answers, so it is not callable (``tool_is_callable``) until the upstream fixes it and a sync
    registers it again. A tool whose inputSchema the gateway cannot use (``mcpgateway.argschema``:
    a dangling or remote ``$ref``, an unknown ``$schema``, a pattern RE2 cannot run...) is stored
    with the reason (``input_schema_problem``), named in the report, the audit event and the log, and
    every call of it is refused (``ToolSchemaUnusable``) until a sync stores a usable schema.
    """
    now = timezone.now()
    seen: set[str] = set()
    created: list[str] = []
    updated: list[str] = []
    changed: list[str] = []
    invalid: dict[str, str] = {}
    unusable: dict[str, str] = {}
    refused: dict[str, str] = {}
    adopts_legacy = server is not None and server.slug == "default"
    for spec in remote_tools:
        remote = spec.get("name")
        if not isinstance(remote, str) or not remote:
            continue
        name = server.exposed_name(remote) if server is not None else remote
        if name == DOGFOOD_TOOL:
            if server is not None:
                refused[name] = f"{name} is the gateway's local tool"
            continue
        if len(name) > SERVICE_ID_MAX_LENGTH:
            logger.warning("tool %.80s...: not registered, its name is longer than %d", name, SERVICE_ID_MAX_LENGTH)
            continue
        existing = Tool.objects.select_for_update(no_key=True).filter(service_id=name).first()
        owner = existing.server_id if existing is not None else None
        ours = server.server_id if server is not None else None
        if existing is not None and owner != ours and not (adopts_legacy and owner is None):
            other = UpstreamServer.objects.filter(server_id=owner).values_list("slug", flat=True).first()
            refused[name] = f"{name} is already a tool of server {other or '(none)'}; not registered"
            logger.warning("tool %s from %s refused: %s", remote, server.slug if server else "-", refused[name])
            continue
        seen.add(name)
        annotations = spec.get("annotations") or {}
        problem = output_schema_problem(spec.get("outputSchema") or None)
        if problem is not None:
            invalid[name] = problem
            logger.warning(
                "tool %s registered disabled: its outputSchema is not a valid JSON Schema (%s)", name, problem
            )
        input_schema = spec.get("inputSchema") or {"type": "object"}
        input_problem = input_schema_problem(input_schema)
        if input_problem is not None:
            unusable[name] = input_problem
            logger.warning("tool %s: its calls are refused, its inputSchema is unusable (%s)", name, input_problem)
        values = {
            "title": str(spec.get("title") or annotations.get("title") or "")[:200],
            "description": str(spec.get("description") or ""),
            "input_schema": input_schema,
            "input_schema_problem": input_problem or "",
            "output_schema": spec.get("outputSchema"),
            "annotations": annotations,
            "source": ToolSource.UPSTREAM,
            "enabled": problem is None,
            "synced_at": now,
            "server": server,
            "remote_name": remote if server is not None else "",
        }
        if existing is not None and any(getattr(existing, key) != values[key] for key in _LISTED):
            changed.append(name)
        # The upstream may suggest a category for a new tool; after that the category is the operator's
        # (tool_update): policies allow and deny by category, so an upstream must not move its tools
        # between them. A suggestion outside ServiceCategory is ignored; without one a new tool takes
        # its server's default category.
        meta = spec.get("_meta")
        hint = meta.get("io.tollgate/category") if isinstance(meta, dict) else None
        create_values = dict(values)
        if hint in ServiceCategory.values:
            create_values["category"] = hint
        else:
            if hint is not None:
                logger.warning("tool %s: ignoring io.tollgate/category %.40r (not a service category)", name, hint)
            if server is not None:
                create_values["category"] = server.default_category
        _, was_created = Tool.objects.update_or_create(service_id=name, defaults=values, create_defaults=create_values)
        (created if was_created else updated).append(name)
    mine = Tool.objects.filter(source=ToolSource.UPSTREAM, enabled=True, server=server)
    disabled = list(mine.exclude(service_id__in=seen).values_list("service_id", flat=True))
    Tool.objects.filter(service_id__in=disabled).update(enabled=False)
    if server is not None:
        UpstreamServer.objects.filter(server_id=server.server_id).update(last_synced_at=now)
    audit_record(
        event="tools.synced",
        ok=True,
        detail={
            "server_id": server.server_id if server is not None else None,
            "created": created,
            "updated": updated,
            "changed": changed,
            "disabled": disabled,
            "invalid": invalid,
            "unusable": unusable,
            "refused": refused,
            "actor": actor,
        },
    )
    return SyncReport(created, updated, disabled, invalid, unusable, refused, changed)


def dogfood_tool_register() -> Tool:
    """Register the local-only ``partner.notes.write`` tool (callable only while the flag is on)."""
    tool, _ = Tool.objects.update_or_create(
        service_id=DOGFOOD_TOOL,
        defaults={
            "title": "Partner notes (local dogfood tool)",
            "description": "Write a note into the gateway's own partner notebook. Local-only; not covered by "
            "dispatch-uncertainty semantics.",
            "input_schema": {
                "type": "object",
                "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 2000}},
                "required": ["text"],
                "additionalProperties": False,
            },
            "output_schema": {
                "type": "object",
                "properties": {"note_id": {"type": "string"}, "text": {"type": "string"}},
                "required": ["note_id", "text"],
            },
            "source": ToolSource.LOCAL,
            "category": "tooling",
            "enabled": True,
        },
    )
    return tool


@transaction.atomic(durable=True)
def tool_update(*, service_id: str, category: str, enabled: bool, actor: str = "") -> Tool:
    """Change a tool's category or availability (prices are set in billing); audited."""
    tool = Tool.objects.select_for_update(no_key=True).get(service_id=service_id)
    before = {"category": tool.category, "enabled": tool.enabled}
    tool.category = category
    tool.enabled = enabled
    tool.save(update_fields=["category", "enabled", "updated_at"])
    audit_record(
        event="tool.updated",
        ok=True,
        tool=service_id,
        detail={"before": before, "after": {"category": category, "enabled": enabled}, "actor": actor},
    )
    return tool
