"""Discovery documents built from the live URLconf: the agent manifest, llms.txt and the capability catalog.

Nothing here keeps a list of paths. :func:`routes` walks ``django.urls.get_resolver()``
and yields every routed path (``<str:x>`` becomes ``{x}``); :func:`endpoints`
enriches each with the OpenAPI operation data (methods, summary, security,
deprecation) where the path is in the generated schema, and with what the view
itself declares otherwise. A path appears in a document only if it is routed
now, so a flag that unmounts a surface also removes it from every document.

Views that drf-spectacular cannot see (plain Django views) describe themselves
with :func:`advertise`; the postprocessing hook :func:`openapi_documents_hook`
adds them to ``/openapi.json``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from django.conf import settings
from django.urls import NoReverseMatch, URLPattern, URLResolver, get_resolver, reverse
from django.urls.resolvers import RegexPattern, RoutePattern

from receipts.models import Outcome

logger = logging.getLogger(__name__)

NAME: Final = "Tollgate"
HTTP_METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE")

# Surface groups (spec, What the service does, point 11).
CORE_TRUST: Final = (
    "audit",
    "billing",
    "permits",
    "receipts",
    "evidence",
    "mcp",
    "api_keys",
    "signing_keys",
    "discover",
    "policies",
)
DORMANT_TRUST: Final = ("auth_jwt", "kyc", "planner", "billing_expansion")
PROOF_SURFACES: Final = (
    "agentic-web",
    "browser",
    "content",
    "oracle",
    "sandbox",
    "media",
    "iot",
    "red-team",
    "telemetry",
)
LOCAL_TOOLS: Final = frozenset({"partner.notes.write"})

DESCRIPTION: Final = (
    "Transaction-integrity boundary for consequential autonomous actions on the configured upstream "
    "tool-protocol (MCP) path. One logical action binds scoped authority and configured consumption to "
    "at most one gateway dispatch and at most one debit, and leaves linked evidence (signed receipt, "
    "hash-chained audit event, ledger entry) for authoritative external reconciliation."
)
CLAIM_BOUNDARY: Final = (
    "The service is a durable gateway state machine. It is not one distributed ACID transaction and not "
    "proof of the downstream effect. A remote side effect happens exactly once only when the upstream "
    "honors the forwarded idempotency key."
)
CANONICAL_LOOP: Final = (
    "logical action identity",
    "authorize",
    "reserve allowance",
    "debit",
    "claim dispatch",
    "confirmed outcome OR delivery_uncertain",
    "linked receipt and audit",
    "authoritative external reconciliation required",
)
IDEMPOTENCY_RULE: Final = (
    "An accepted idempotency key binds one immutable invocation. Reusing the key with different tool input "
    "fails closed with an idempotency conflict (422, type idempotency_key_reused); each new invocation needs "
    "a new key. A replay of the same key and input returns the stored response and does not debit twice."
)
DELIVERY_UNCERTAIN: Final = (
    "delivery_uncertain means the request may have reached the upstream but no complete answer came back "
    "(read timeout, reset, 5xx from an intermediary). The charge is kept, the gateway never redispatches "
    "automatically, and the outcome must be settled by external reconciliation with the upstream."
)
PROVISIONING: Final = (
    "There is no public signup, no unauthenticated key mint, no public pricing tier, no free-credit grant and "
    "no self-serve top-up. An operator provisions the sponsor wallet, the wallet-scoped API key, the credits "
    "and the permit."
)

# The positioning block (spec, Versioning, point 4).
POSITIONING: Final[dict[str, Any]] = {
    "schema_version": "1.0",
    "effective_date": "2026-08-28",
    "category": "transaction_integrity_gateway",
    "statement": DESCRIPTION,
    "claim_boundary": CLAIM_BOUNDARY,
    "is_not": [
        "a distributed ACID transaction",
        "proof of the downstream effect",
        "payment rails (credits are a closed-loop metering unit)",
        "a public signup or self-serve credit service",
    ],
    "legacy_aliases": ["governed_mcp_trust_plane"],
    "supersedes": ["product_wedge", "product_loop"],
}

# Purpose of each bootstrap step, by URL name (the order is the spec's, point 12).
BOOTSTRAP: Final = (
    ("agent-manifest", "What the service is, its version, surfaces, auth and limits (authoritative for the version)."),
    ("llms-txt", "Readable description: the canonical loop, idempotency, delivery_uncertain, limits."),
    ("mcp-tools-manifest", "Authoritative list of callable tools (mirrors tools/list)."),
    ("openapi", "Machine-readable description of every /v1 operation (OpenAPI 3.1.0)."),
)
# Documents listed under the manifest's ``docs`` member, by URL name.
DOCUMENTS: Final = (
    ("agent_manifest", "agent-manifest"),
    ("llms_txt", "llms-txt"),
    ("llm_txt", "llm-txt"),
    ("openapi", "openapi"),
    ("swagger_ui", "docs"),
    ("redoc", "redoc"),
    ("discover", "discover"),
    ("tool_catalog", "mcp-tools-manifest"),
    ("wedge", "wedge-md"),
    ("security_limitations", "security-limitations-md"),
    ("jwks", "jwks"),
    ("health", "health"),
    ("health_dependencies", "health-dependencies"),
    ("dashboard", "dashboard"),
    ("proof_surfaces", "proof-index"),
)

# First /v1 path segment -> capability group.
_V1_GROUPS: Final = {
    "permit-requests": "permits",
    "quotes": "permits",
    "api-keys": "api_keys",
    "signing-keys": "signing_keys",
    "launch": "readiness",
}
GROUP_DESCRIPTIONS: Final = {
    "audit": "Hash-chained audit events, summaries and chain verification with signed checkpoints.",
    "billing": "Sponsor and agent wallets, the double-entry ledger, prices and metered charges.",
    "permits": "Scoped permits, permit requests approved by a human, and signed price quotes.",
    "policies": "Policy bundles attached to wallets.",
    "receipts": "Signed receipts, evidence bundles, portable export and refund reconciliation.",
    "evidence": "The buyer-facing evidence bundle of one receipt.",
    "api_keys": "Wallet-scoped API keys: create, list (masked), rotate, revoke, emergency revoke, logs.",
    "signing_keys": "Public metadata and JWKS of the evidence signing keys (active and retired).",
    "transparency_log": "Each tenant's transparency log, public and read-only: signed checkpoints with witness "
    "cosignatures, inclusion and consistency proofs, tlog-tiles, the log key (C2SP formats).",
    "me": "Self-inspection scoped to the caller's own wallet (wallet-scoped keys only).",
    "discover": "This expanded capability catalog.",
    "readiness": "Launch readiness check (GO / NO-GO).",
    "mcp": "MCP tool gateway: tool catalogs and transports; every tool call runs permit -> meter -> dispatch "
    "-> receipt.",
    "discovery": "Discovery and readable documents for agents.",
    "health": "Liveness and dependency truth.",
    "human": "Pages for people: status dashboard, interactive API docs, permit approvals.",
    "proof_surfaces": "Demo surfaces (simulations only; mounted only when ENABLE_PROOF_SURFACES is true).",
}
# Operations only an operator (bootstrap administrator) key may call, by OpenAPI operation id.
OPERATOR_ONLY_OPERATIONS: Final = frozenset({"billing_wallets_create_sponsor"})
# Never listed as endpoints for agents: the operator console, static assets and the human
# approval pages (linked once under human_observability).
HIDDEN_PREFIXES: Final = ("/admin/", "/static/", "/approvals/")

_PARAM = re.compile(r"<(?:[^>:]+:)?([^>]+)>")
_REGEX_NAMED = re.compile(r"\(\?P<([^>]+)>[^)]*\)")
_REGEX_META = re.compile(r"[\\\[\](){}*+?|.]")

V = TypeVar("V", bound=Callable[..., Any])


# -- describing plain views ----------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentSpec:
    """How a plain Django view appears in ``/openapi.json`` (drf-spectacular sees only DRF views)."""

    operation_id: str
    summary: str
    media_type: str
    description: str = ""
    tags: tuple[str, ...] = ("discovery",)
    method: str = "GET"
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    rate_limited: bool = True
    auth: str = "none"
    deprecated: bool = False
    request_schema: dict[str, Any] | None = None
    jsonrpc: bool = False

    def operation(self) -> dict[str, Any]:
        responses: dict[str, Any] = {
            "200": {"description": self.summary, "content": {self.media_type: {"schema": self.schema}}}
        }
        if self.auth == "api_key":
            responses["401"] = _error_response("Missing, malformed, unknown or revoked API key.")
        if self.rate_limited:
            responses["429"] = _rate_limited_response()
        if self.jsonrpc:
            responses["202"] = {"description": "A notification (a message without id) was accepted; no body."}
            responses["400"] = {
                "description": "Malformed JSON-RPC, or (handshake era) a missing or mismatched session header.",
                "content": {"application/json": {"schema": _JSONRPC_RESPONSE}},
            }
            responses["403"] = _error_response("Origin not in ALLOWED_ORIGINS.")
            responses["404"] = {
                "description": "An unknown or ended MCP session, or (2026-07-28) an unknown method.",
                "content": {"application/json": {"schema": _JSONRPC_RESPONSE}},
            }
            responses["422"] = {
                "description": "JSON this service cannot carry (common/jsonbody.py): a number outside"
                " ±(2**53 - 1) or not finite, or nesting past 64 levels; a JSON-RPC invalid-request"
                " error whose data.error names it (number_out_of_range, json_too_deep).",
                "content": {"application/json": {"schema": _JSONRPC_RESPONSE}},
            }
        op: dict[str, Any] = {
            "operationId": self.operation_id,
            "summary": self.summary,
            "tags": list(self.tags),
            "security": [{"APIKeyHeader": []}, {"BearerAuth": []}] if self.auth == "api_key" else [],
            "responses": responses,
        }
        if self.description:
            op["description"] = self.description
        if self.deprecated:
            op["deprecated"] = True
        if self.request_schema is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": self.request_schema}},
            }
        return op


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }


def _rate_limited_response() -> dict[str, Any]:
    return {
        "description": "Rate limit exceeded.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RateLimitedResponse"}}},
    }


def advertise(
    *,
    auth: str = "none",
    methods: Iterable[str] = ("GET",),
    document: DocumentSpec | None = None,
) -> Callable[[V], V]:
    """Declare what a plain view offers: its methods, its auth (``none``, ``api_key``, ``optional``,
    ``session``) and, optionally, its OpenAPI description. Apply it outermost."""

    def wrap(view: V) -> V:
        view.tollgate_auth = auth  # type: ignore[attr-defined]
        view.tollgate_methods = tuple(m.upper() for m in methods)  # type: ignore[attr-defined]
        if document is not None:
            view.openapi_document = document  # type: ignore[attr-defined]
        return view

    return wrap


# The members a JSON-RPC 2.0 request and its response both carry.
_JSONRPC_ENVELOPE: Final[dict[str, Any]] = {
    "jsonrpc": {"type": "string", "enum": ["2.0"]},
    "id": {"type": ["string", "number", "null"]},
}
_JSONRPC_MESSAGE: Final[dict[str, Any]] = {
    "type": "object",
    "description": "A JSON-RPC 2.0 message (MCP).",
    "properties": {
        **_JSONRPC_ENVELOPE,
        "method": {"type": "string"},
        "params": {"type": "object"},
    },
    "required": ["jsonrpc", "method"],
}
_JSONRPC_RESPONSE: Final[dict[str, Any]] = {
    "type": "object",
    "description": "A JSON-RPC 2.0 response.",
    "properties": {
        **_JSONRPC_ENVELOPE,
        "result": {"type": "object"},
        "error": {"type": "object"},
    },
}


def _mcp_transport(
    *, operation_id: str, summary: str, description: str = "", auth: str = "none", deprecated: bool = False
) -> DocumentSpec:
    """An MCP transport: JSON-RPC messages POSTed as JSON, in the ``mcp`` tag."""
    return DocumentSpec(
        operation_id=operation_id,
        jsonrpc=True,
        summary=summary,
        description=description,
        media_type="application/json",
        tags=("mcp",),
        method="POST",
        auth=auth,
        deprecated=deprecated,
        schema=_JSONRPC_RESPONSE,
        request_schema=_JSONRPC_MESSAGE,
    )


# Plain views this module does not own, described for the schema by URL name. A view that
# drf-spectacular already describes keeps its own description (the hook only fills gaps).
FOREIGN_DOCUMENTS: Final = {
    "mcp": _mcp_transport(
        operation_id="mcp_streamable_http",
        summary="MCP Streamable HTTP transport (JSON responses); exists only when enabled",
        description="ping, tools/list and tools/call; a tool call carries a permit id and an idempotency key and "
        "runs permit -> meter -> dispatch -> receipt. Origin is validated against ALLOWED_ORIGINS.",
        auth="api_key",
    ),
    "mcp-public": _mcp_transport(
        operation_id="mcp_public",
        summary="Read-only, stateless MCP endpoint for public material (no key; Origin validated)",
    ),
    "mcp-messages": _mcp_transport(
        operation_id="mcp_messages",
        summary="Legacy JSON-RPC endpoint (tools/list, tools/call); no MCP initialization lifecycle",
        description="Deprecated: new integrations use POST /mcp when it is enabled.",
        auth="api_key",
        deprecated=True,
    ),
    "health": DocumentSpec(
        operation_id="health",
        summary="Liveness: the process answers (no authentication, not rate limited)",
        description="Dependency truth is GET /health/dependencies; a 200 here does not mean every dependency is ready.",
        media_type="application/json",
        tags=("health",),
        rate_limited=False,
        schema={
            "type": "object",
            "properties": {
                "status": {"type": "string", "enum": ["ok"]},
                "service": {"type": "string"},
                "version": {"type": "string"},
            },
            "required": ["status", "service", "version"],
        },
    ),
    "openapi": DocumentSpec(
        operation_id="openapi_document",
        summary="This OpenAPI 3.1.0 description",
        media_type="application/json",
        schema={"type": "object"},
    ),
    "docs": DocumentSpec(
        operation_id="docs_swagger_ui",
        summary="Interactive API documentation (Swagger UI, local assets)",
        media_type="text/html",
        tags=("human",),
    ),
    "redoc": DocumentSpec(
        operation_id="docs_redoc",
        summary="API reference (ReDoc, local assets)",
        media_type="text/html",
        tags=("human",),
    ),
}


# -- walking the URLconf -------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One routed path, OpenAPI style (``/v1/receipts/{receipt_id}``)."""

    path: str
    name: str | None
    callback: Callable[..., Any]

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(re.findall(r"{([^}]+)}", self.path))


def _pattern_text(pattern: Any) -> str | None:
    """The path fragment of a URL pattern, or None when it is not a plain path (a real regex)."""
    if isinstance(pattern, RoutePattern):
        return _PARAM.sub(lambda m: "{" + m.group(1) + "}", str(pattern))
    if isinstance(pattern, RegexPattern):
        text = str(pattern).removeprefix("^").removesuffix("$").removesuffix(r"\Z")
        text = _REGEX_NAMED.sub(lambda m: "{" + m.group(1) + "}", text)
        if _REGEX_META.search(text.replace("{", "").replace("}", "")):
            return None
        return text
    return None


def routes() -> list[Route]:
    """Every routed path of the live URLconf, first match first, each path once."""
    seen: set[str] = set()
    out: list[Route] = []

    def walk(patterns: Iterable[Any], prefix: str) -> None:
        for entry in patterns:
            text = _pattern_text(entry.pattern)
            if text is None:
                continue
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + text)
            elif isinstance(entry, URLPattern):
                path = "/" + prefix + text
                if path not in seen:
                    seen.add(path)
                    out.append(Route(path=path, name=entry.name, callback=entry.callback))

    walk(get_resolver().url_patterns, "")
    return out


def path_for(url_name: str) -> str | None:
    """The routed path of a parameterless URL name, or None when it is not mounted."""
    try:
        return reverse(url_name)
    except NoReverseMatch:
        return None


def _view_methods(callback: Callable[..., Any]) -> tuple[str, ...]:
    declared = getattr(callback, "tollgate_methods", None)
    if declared:
        return tuple(declared)
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view_class is not None:
        allowed = {m.upper() for m in getattr(view_class, "http_method_names", ())}
        return tuple(m for m in HTTP_METHODS if m in allowed and hasattr(view_class, m.lower())) or ("GET",)
    # require_http_methods / require_GET / require_POST keep the allowed list in the wrapper's closure.
    func: Any = callback
    while func is not None:
        for cell in getattr(func, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if isinstance(value, (list, tuple)) and value and all(v in (*HTTP_METHODS, "HEAD") for v in value):
                return tuple(m for m in HTTP_METHODS if m in value)
        func = getattr(func, "__wrapped__", None)
    return ("GET",)


def _drf_view_class(callback: Callable[..., Any]) -> Any:
    return getattr(callback, "cls", None)


def _view_auth(route: Route) -> str:
    """Auth of a view from what it declares (plain views) or its permission classes (DRF views)."""
    declared = getattr(route.callback, "tollgate_auth", None)
    if declared:
        return str(declared)
    if route.path.startswith("/approvals/"):
        return "session"
    view_class = _drf_view_class(route.callback)
    if view_class is not None:
        from access.authentication import HasAPIKey

        permissions = getattr(view_class, "permission_classes", ())
        if any(isinstance(p, type) and issubclass(p, HasAPIKey) for p in permissions):
            return "api_key"
        # Tool catalogs are public except where TOOL_CATALOG_REQUIRES_KEY is on (spec, Authentication 7).
        if hasattr(view_class, "check_catalog_access") and settings.TOOL_CATALOG_REQUIRES_KEY:
            return "api_key"
        return "none"
    return "none"


def _operation_auth(route: Route, security: Any) -> str:
    """The schema's security says which credentials a view accepts; DRF permissions say whether it needs one."""
    schema_auth = _auth_from_security(security)
    if _drf_view_class(route.callback) is None:
        return schema_auth
    view_auth = _view_auth(route)
    if view_auth == "none" and schema_auth == "optional":
        return "optional"
    return view_auth


# -- the OpenAPI schema as a source of operation data ---------------------------------------------

_schema_lock = threading.Lock()
_schema_cache: tuple[Any, dict[str, Any]] | None = None


def openapi_paths() -> dict[str, Any]:
    """The ``paths`` of the generated schema for the live URLconf (generated once per URLconf)."""
    global _schema_cache
    resolver = get_resolver()
    cached = _schema_cache
    if cached is not None and cached[0] is resolver:
        return cached[1]
    with _schema_lock:
        cached = _schema_cache
        if cached is not None and cached[0] is resolver:
            return cached[1]
        from drf_spectacular.generators import SchemaGenerator

        try:
            schema = SchemaGenerator().get_schema(request=None, public=True)
            paths: dict[str, Any] = dict(schema.get("paths", {}))
        except Exception:  # a broken view must not take discovery down; fall back to introspection
            logger.exception("OpenAPI generation failed; discovery falls back to view introspection")
            paths = {}
        _schema_cache = (resolver, paths)
        return paths


def _auth_from_security(security: Any) -> str:
    if not security:
        return "none"
    return "optional" if any(not requirement for requirement in security) else "api_key"


@dataclass(frozen=True)
class Operation:
    method: str
    operation_id: str | None
    summary: str
    auth: str
    deprecated: bool


@dataclass(frozen=True)
class Endpoint:
    """A routed path with its operations, as advertised."""

    path: str
    name: str | None
    group: str
    operations: tuple[Operation, ...]

    @property
    def methods(self) -> list[str]:
        return [op.method for op in self.operations]

    @property
    def auth(self) -> str:
        kinds = {op.auth for op in self.operations}
        for kind in ("api_key", "session", "optional", "none"):
            if kinds == {kind}:
                return kind
        return "mixed"

    @property
    def summary(self) -> str:
        return next((op.summary for op in self.operations if op.summary), "")

    @property
    def deprecated(self) -> bool:
        return bool(self.operations) and all(op.deprecated for op in self.operations)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"path": self.path, "methods": self.methods, "auth": self.auth}
        if self.summary:
            data["summary"] = self.summary
        if self.deprecated:
            data["deprecated"] = True
        return data


def group_of(path: str) -> str:
    """The capability group of a path (see GROUP_DESCRIPTIONS)."""
    if path == "/mcp" or path.startswith(("/mcp/", "/.well-known/mcp")):
        return "mcp"
    if path.startswith("/v1/"):
        segment = path.split("/")[2]
        return _V1_GROUPS.get(segment, segment.replace("-", "_"))
    if path == "/.well-known/jwks.json":
        return "signing_keys"
    if path.startswith("/tlog/") or path == "/.well-known/tlog-keys":
        return "transparency_log"
    if path.startswith("/health"):
        return "health"
    if path.startswith(("/dashboard", "/docs", "/redoc", "/approvals/")):
        return "human"
    if path.startswith("/proof"):
        return "proof_surfaces"
    return "discovery"


def _advertised(path: str) -> bool:
    if path.startswith(HIDDEN_PREFIXES):
        return False
    # The standard Streamable HTTP transport exists only when an operator enables it (spec, MCP table).
    return not (path == "/mcp" and not settings.ENABLE_MCP_STREAMABLE_HTTP)


def endpoints() -> list[Endpoint]:
    """Every advertised endpoint of the live URLconf, with its operations."""
    schema_paths = openapi_paths()
    out = []
    for route in routes():
        if not _advertised(route.path):
            continue
        item = schema_paths.get(route.path)
        operations: list[Operation] = []
        if item:
            for method in HTTP_METHODS:
                op = item.get(method.lower())
                if op is None:
                    continue
                operations.append(
                    Operation(
                        method=method,
                        operation_id=op.get("operationId"),
                        summary=str(op.get("summary") or ""),
                        auth=_operation_auth(route, op.get("security")),
                        deprecated=bool(op.get("deprecated", False)),
                    )
                )
        if not operations:
            auth = _view_auth(route)
            operations = [
                Operation(method=m, operation_id=None, summary="", auth=auth, deprecated=False)
                for m in _view_methods(route.callback)
            ]
        out.append(Endpoint(path=route.path, name=route.name, group=group_of(route.path), operations=tuple(operations)))
    return out


# -- documents -----------------------------------------------------------------------------------


def _documents() -> dict[str, str]:
    out = {}
    for key, url_name in DOCUMENTS:
        path = path_for(url_name)
        if path is not None and _advertised(path):
            out[key] = path
    return out


def bootstrap_sequence() -> list[dict[str, Any]]:
    """The spec's bootstrap order, limited to the steps that are routed."""
    steps: list[dict[str, Any]] = []
    for url_name, purpose in BOOTSTRAP:
        path = path_for(url_name)
        if path is not None:
            steps.append({"step": len(steps) + 1, "path": path, "purpose": purpose})
    return steps


def rate_limits() -> dict[str, Any]:
    backend = str(settings.CACHES["default"]["BACKEND"])
    shared = "locmem" not in backend.lower() and "dummy" not in backend.lower()
    return {
        "requests_per_window": settings.RATE_LIMIT_REQUESTS,
        "window_seconds": settings.RATE_LIMIT_WINDOW_SECONDS,
        "scope": "per_api_key_and_wallet_line",
        "wallet_line": "a wallet key's requests also count against its wallet's bucket (a child wallet's against"
        " its agent parent's); a request is refused when either bucket is over",
        "accounting": "fixed_window",
        "burst": 0,
        "burst_note": "No burst allowance is promised; do not rely on one.",
        "anonymous": "one shared bucket for every request without credentials, except public key material"
        " and catalogues",
        "public_documents": "per client address: /.well-known/jwks.json, /v1/signing-keys/*, /mcp/public and the"
        " discovery documents, without credentials",
        "rejected_credentials": {"bucket": "per client address", "multiplier": settings.RATE_LIMIT_REJECTED_MULTIPLIER},
        "per_partner_override": False,
        "headers": ["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"],
        "state": "shared cache (all processes)" if shared else "process memory (per process)",
    }


def auth_summary(eps: list[Endpoint]) -> dict[str, Any]:
    return {
        "schemes": [
            {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            {"type": "http", "scheme": "bearer", "header": "Authorization: Bearer <key>"},
        ],
        "key_scope": "wallet-scoped keys act on their wallet and its descendants; operator keys on everything",
        "wallet_key_required_for": "/v1/me operations (403 wallet_key_required otherwise)",
        "public_signup": False,
        "unauthenticated_key_mint": False,
        "provisioning": PROVISIONING,
        "tool_catalog_requires_key": bool(settings.TOOL_CATALOG_REQUIRES_KEY),
        "public_endpoints": [e.path for e in eps if e.auth == "none"],
        "optional_auth_endpoints": [e.path for e in eps if e.auth == "optional"],
        "rejected_credentials": "a presented but invalid key is 401 even on public endpoints",
    }


def surface_boundaries() -> dict[str, Any]:
    mounted = path_for("proof-index") is not None
    return {
        "proof_surfaces_mounted": mounted,
        "proof_surfaces": list(PROOF_SURFACES),
        "proof_surfaces_note": "Demo scaffolding: simulations only, never evidence of real effects; mounted only "
        "when ENABLE_PROOF_SURFACES is true.",
        "core_trust": list(CORE_TRUST),
        "dormant_trust": list(DORMANT_TRUST),
        "dormant_trust_note": "Named for continuity; not part of the trust boundary and not mounted here.",
        "claim_boundary": CLAIM_BOUNDARY,
        "dispatch_uncertainty_scope": "Only the configured upstream tool; local and dogfood tools "
        f"({', '.join(sorted(LOCAL_TOOLS))}) are not covered.",
    }


def _human_observability() -> dict[str, Any]:
    pages = {key: path_for(name) for key, name in (("dashboard", "dashboard"), ("docs", "docs"), ("redoc", "redoc"))}
    out: dict[str, Any] = {key: path for key, path in pages.items() if path is not None}
    approvals = path_for("approvals-queue")
    if approvals is not None:
        out["permit_approvals"] = approvals
    out["note"] = "Tenant inspection stays API-only; the dashboard shows tenant evidence to staff users only."
    return out


def _dependency_health_hint() -> str | None:
    path = path_for("health-dependencies")
    return f"{path}?tool=<name>" if path is not None else None


def agent_manifest() -> dict[str, Any]:
    """``/.well-known/agent.json``: every member the spec names, generated from the URLconf and settings."""
    eps = endpoints()
    v1 = [e.as_dict() for e in eps if e.path.startswith("/v1/")]
    mcp = [e.as_dict() for e in eps if e.group == "mcp"]
    docs = _documents()
    proof_enabled = bool(settings.ENABLE_PROOF_SURFACES)
    return {
        "name": NAME,
        "version": settings.SERVICE_VERSION,
        "description": DESCRIPTION,
        "base_url": settings.PUBLIC_BASE_URL.rstrip("/"),
        "positioning": POSITIONING,
        "agent_first": {
            "primary_audience": "Autonomous AI agents (MCP clients) acting for an operator; humans observe "
            "and approve.",
            "design_principle": "Machine-readable first and fail closed: every capability is discoverable from "
            "this manifest, /llms.txt, the tool catalog and /openapi.json; every consequential action is "
            "idempotent, permit-scoped, debited at most once, dispatched at most once and receipted; an "
            "uncertain delivery is a recorded state, never a silent retry.",
            "positioning": POSITIONING,
            "bootstrap_sequence": bootstrap_sequence(),
            "human_observability": _human_observability(),
            "proof_surfaces_enabled": proof_enabled,
            "simulation_and_dependency_truth": {
                "proof_surfaces": "Simulations only when mounted; they never stand for a real downstream effect.",
                "dependency_health": _dependency_health_hint(),
                "http_200_is_not_readiness": "An HTTP 200 alone does not mean every dependency is ready; "
                "read the dependency report for the selected tool.",
                "health_is_not_authorization": "Health never replaces authentication, permit authorization or "
                "receipt verification.",
            },
        },
        "canonical_loop": list(CANONICAL_LOOP),
        "idempotency": IDEMPOTENCY_RULE,
        "delivery_uncertain": DELIVERY_UNCERTAIN,
        "receipt_outcomes": [choice.value for choice in Outcome],
        "surface_boundaries": surface_boundaries(),
        "services": {
            "agent_billing": {
                "base_path": "/v1",
                "description": "Wallets, ledger, credits, API keys, permits, quotes, policies, receipts, evidence, "
                "audit and signing keys: the supporting mechanisms of the governed action.",
                "endpoints": v1,
            },
            "mcp_server": {
                "base_path": "/mcp",
                "description": "MCP tool gateway. Every tool call runs the same governed path: permit -> meter -> "
                "dispatch -> receipt. /mcp/tools.json is authoritative for callable tools.",
                "streamable_http_enabled": bool(settings.ENABLE_MCP_STREAMABLE_HTTP),
                "tool_catalog_requires_key": bool(settings.TOOL_CATALOG_REQUIRES_KEY),
                "endpoints": mcp,
            },
        },
        "auth": auth_summary(eps),
        "rate_limits": rate_limits(),
        "docs": docs,
        # Superseded by the positioning block; still carried for existing readers.
        "product_wedge": {
            "superseded_by": "positioning",
            "summary": "Governed MCP tool calls for autonomous agents: scoped permits, metered credits, signed "
            "receipts and a hash-chained audit log.",
        },
        "product_loop": {
            "superseded_by": "positioning",
            "steps": ["permit", "meter", "dispatch", "receipt"],
        },
    }


def capability_groups(eps: list[Endpoint]) -> list[dict[str, Any]]:
    groups: dict[str, list[Endpoint]] = {}
    for e in eps:
        groups.setdefault(e.group, []).append(e)
    out = []
    for group, members in groups.items():
        trust = "core" if group in CORE_TRUST else ("dormant" if group in DORMANT_TRUST else "supporting")
        if group == "proof_surfaces":
            trust = "simulation"
        out.append(
            {
                "group": group,
                "trust": trust,
                "description": GROUP_DESCRIPTIONS.get(group, ""),
                "endpoints": [m.as_dict() for m in members],
            }
        )
    return out


def operations_for(eps: list[Endpoint], *, is_operator: bool) -> list[dict[str, str]]:
    """Operations a key of this kind may call (each still subject to per-wallet reach)."""
    out = []
    for e in eps:
        for op in e.operations:
            if op.auth == "session":
                continue
            if op.operation_id in OPERATOR_ONLY_OPERATIONS and not is_operator:
                continue
            if e.path.startswith("/v1/me/") and is_operator:
                continue
            out.append({"method": op.method, "path": e.path})
    return out


def discover_catalog(caller: Any | None) -> dict[str, Any]:
    """``/v1/discover``: the expanded catalog; with a valid key, what that key can do."""
    eps = endpoints()
    caller_info: dict[str, Any] = {"authenticated": False}
    if caller is not None:
        caller_info = {
            "authenticated": True,
            "key_id": caller.key_id,
            "key_type": "operator" if caller.is_operator else "wallet",
            "wallet_id": caller.wallet_id,
            "tenant_id": caller.tenant_id,
            "available_operations": operations_for(eps, is_operator=caller.is_operator),
        }
    return {
        "name": NAME,
        "version": settings.SERVICE_VERSION,
        "description": DESCRIPTION,
        "canonical_loop": list(CANONICAL_LOOP),
        "bootstrap_sequence": bootstrap_sequence(),
        "idempotency": IDEMPOTENCY_RULE,
        "delivery_uncertain": DELIVERY_UNCERTAIN,
        "authentication": auth_summary(eps),
        "rate_limits": rate_limits(),
        "surface_boundaries": surface_boundaries(),
        "capabilities": capability_groups(eps),
        "documents": _documents(),
        "caller": caller_info,
    }


def _endpoint_line(e: Endpoint) -> str:
    auth = {"api_key": "key", "none": "public", "optional": "key optional", "session": "login"}.get(e.auth, e.auth)
    extra = ", deprecated" if e.deprecated else ""
    summary = f": {e.summary}" if e.summary else ""
    return f"- `{e.path}` ({', '.join(e.methods)}; {auth}{extra}){summary}"


def llms_txt() -> str:
    """``/llms.txt``: the readable description for agents (llmstxt.org layout), generated live."""
    eps = endpoints()
    docs = _documents()
    version = settings.SERVICE_VERSION
    limits = rate_limits()
    lines = [
        f"# {NAME} {version}",
        "",
        f"> {DESCRIPTION}",
        "",
        f"Version {version}. The manifest is authoritative for the version; a cached copy of this text may be stale.",
        "",
        f"Claim boundary: {CLAIM_BOUNDARY}",
        "",
        "## Bootstrap (read in this order)",
        "",
    ]
    for step in bootstrap_sequence():
        lines.append(f"{step['step']}. `{step['path']}`: {step['purpose']}")
    discover = docs.get("discover")
    if discover:
        lines.append(f"\nOptional: `{discover}` is the expanded capability catalog (a key adds caller detail).")
    lines += ["", "## Canonical loop", ""]
    lines += [f"{i}. {stage}" for i, stage in enumerate(CANONICAL_LOOP, start=1)]
    lines += [
        "",
        "Every entry point that invokes a tool runs the same governed path: permit -> meter -> dispatch -> "
        "receipt. A tool call carries a permit id and an idempotency key.",
        "",
        "## Authentication",
        "",
        "- Send the API key as `X-API-Key: <key>` or `Authorization: Bearer <key>`.",
        "- Keys are wallet-scoped; /v1/me operations need a wallet-scoped key.",
        f"- {PROVISIONING}",
        "- A presented but invalid key is rejected (401) even where no key is required.",
    ]
    if settings.TOOL_CATALOG_REQUIRES_KEY:
        lines.append("- On this deployment the tool catalogs require a key.")
    lines += [
        "",
        "## Idempotency",
        "",
        IDEMPOTENCY_RULE,
        "",
        "## delivery_uncertain",
        "",
        DELIVERY_UNCERTAIN,
        "",
        "Receipt outcomes: " + ", ".join(choice.value for choice in Outcome) + ".",
        "",
        "## Limits",
        "",
        f"- {limits['requests_per_window']} requests per {limits['window_seconds']} seconds per API key, "
        "and as many per wallet line (a wallet and its child wallets share one), fixed window; no burst allowance "
        "is promised.",
        "- Requests without credentials share one anonymous bucket, except public key material and catalogues "
        "(the JWKS, signing keys, /mcp/public, the tool manifests and these documents), counted per client "
        "address and cacheable (ETag, Cache-Control); rejected credentials cost "
        f"{limits['rejected_credentials']['multiplier']} units of a per-client bucket.",
        "- Rate-limited responses carry X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset; "
        "a 429 also carries Retry-After.",
        f"- Rate-limit state lives in {limits['state']}.",
        "- Lists take limit 1-200 (default 50) and offset >= 0.",
        "",
        "## Endpoints",
        "",
    ]
    groups: dict[str, list[Endpoint]] = {}
    for e in eps:
        groups.setdefault(e.group, []).append(e)
    for group, members in groups.items():
        lines.append(f"### {group}")
        lines.append("")
        if GROUP_DESCRIPTIONS.get(group):
            lines.append(GROUP_DESCRIPTIONS[group])
            lines.append("")
        lines += [_endpoint_line(e) for e in members]
        lines.append("")
    lines += ["## Links", ""]
    titles = {
        "agent_manifest": "Agent manifest",
        "openapi": "OpenAPI 3.1.0",
        "swagger_ui": "Interactive API docs",
        "redoc": "API reference",
        "tool_catalog": "Tool catalog",
        "wedge": "What Tollgate is for (WEDGE.md)",
        "security_limitations": "What Tollgate does not guarantee (SECURITY_LIMITATIONS.md)",
        "jwks": "Public signing keys (JWKS)",
        "health_dependencies": "Dependency health",
        "dashboard": "Status dashboard",
    }
    for key, title in titles.items():
        if key in docs:
            lines.append(f"- [{title}]({docs[key]})")
    lines.append("")
    return "\n".join(lines)


# -- OpenAPI postprocessing hook -----------------------------------------------------------------


def _documented_routes() -> Iterator[tuple[Route, DocumentSpec]]:
    for route in routes():
        spec = getattr(route.callback, "openapi_document", None)
        if spec is None and route.name is not None:
            spec = FOREIGN_DOCUMENTS.get(route.name)
        if isinstance(spec, DocumentSpec):
            yield route, spec


def openapi_documents_hook(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: describe the routed plain views (documents, pages, /health)."""
    paths = result.setdefault("paths", {})
    for route, spec in _documented_routes():
        item = paths.setdefault(route.path, {})
        item.setdefault(spec.method.lower(), spec.operation())
    return result
