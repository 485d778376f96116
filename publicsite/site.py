"""Discovery, health, readiness and human status pages (spec, "Discovery, health and documents").

JSON endpoints are DRF views with ``@extend_schema``; text documents and the
dashboard are plain Django views that describe themselves for ``/openapi.json``
through :func:`publicsite.discovery.advertise`. Every path list in these
documents comes from the live URLconf (see :mod:`publicsite.discovery`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_safe
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from access.authentication import AllowAnyone, optional_principal, principal
from common.errors import NotFound, json_error
from common.pagination import parse_body, parse_query
from common.schema import error_responses
from publicsite import discovery, health, preflight
from publicsite.discovery import DocumentSpec, advertise

DOCS_DIR = Path(__file__).resolve().parent / "docs"
DISCOVERY = ["discovery"]
HEALTH = ["health"]
READINESS = ["readiness"]
PROOF = ["proof_surfaces"]
# Public but key-aware: a presented key is checked (401 when invalid), none is needed.
OPTIONAL_KEY: list[dict[str, list[str]]] = [{"APIKeyHeader": []}, {"BearerAuth": []}, {}]


# -- records -------------------------------------------------------------------------------------


class EndpointInfo(serializers.Serializer):
    """One routed path: its methods, who may call it and what it does."""

    path = serializers.CharField()
    methods = serializers.ListField(child=serializers.CharField())
    auth = serializers.CharField(help_text="api_key, optional, none, session or mixed")
    summary = serializers.CharField(required=False)
    deprecated = serializers.BooleanField(required=False)


class BootstrapStep(serializers.Serializer):
    """One step of the bootstrap sequence."""

    step = serializers.IntegerField()
    path = serializers.CharField()
    purpose = serializers.CharField()


class Positioning(serializers.Serializer):
    """The positioning block (schema_version 1.0); supersedes product_wedge and product_loop."""

    schema_version = serializers.CharField()
    effective_date = serializers.CharField()
    category = serializers.CharField()
    statement = serializers.CharField()
    claim_boundary = serializers.CharField()
    is_not = serializers.ListField(child=serializers.CharField())
    legacy_aliases = serializers.ListField(child=serializers.CharField())
    supersedes = serializers.ListField(child=serializers.CharField())


class AgentFirst(serializers.Serializer):
    """How an agent should approach the service."""

    primary_audience = serializers.CharField()
    design_principle = serializers.CharField()
    positioning = Positioning()
    bootstrap_sequence = BootstrapStep(many=True)
    human_observability = serializers.DictField(child=serializers.CharField())
    proof_surfaces_enabled = serializers.BooleanField()
    simulation_and_dependency_truth = serializers.DictField(child=serializers.CharField(allow_null=True))


class SurfaceBoundaries(serializers.Serializer):
    """Which surfaces belong to the trust boundary, which are dormant, which are simulations."""

    proof_surfaces_mounted = serializers.BooleanField()
    proof_surfaces = serializers.ListField(child=serializers.CharField())
    proof_surfaces_note = serializers.CharField()
    core_trust = serializers.ListField(child=serializers.CharField())
    dormant_trust = serializers.ListField(child=serializers.CharField())
    dormant_trust_note = serializers.CharField()
    claim_boundary = serializers.CharField()
    dispatch_uncertainty_scope = serializers.CharField()


class ManifestService(serializers.Serializer):
    """A service of the manifest with its routed endpoints."""

    base_path = serializers.CharField()
    description = serializers.CharField()
    streamable_http_enabled = serializers.BooleanField(required=False)
    tool_catalog_requires_key = serializers.BooleanField(required=False)
    endpoints = EndpointInfo(many=True)


class ManifestServices(serializers.Serializer):
    agent_billing = ManifestService()
    mcp_server = ManifestService()


class AuthScheme(serializers.Serializer):
    type = serializers.CharField()
    name = serializers.CharField(required=False)
    scheme = serializers.CharField(required=False)
    header = serializers.CharField(required=False)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["in"] = serializers.CharField(required=False)  # a Python keyword, so not declarable above
        return fields


class AuthSummary(serializers.Serializer):
    """How to authenticate, and what needs no key."""

    schemes = AuthScheme(many=True)
    key_scope = serializers.CharField()
    wallet_key_required_for = serializers.CharField()
    public_signup = serializers.BooleanField()
    unauthenticated_key_mint = serializers.BooleanField()
    provisioning = serializers.CharField()
    tool_catalog_requires_key = serializers.BooleanField()
    public_endpoints = serializers.ListField(child=serializers.CharField())
    optional_auth_endpoints = serializers.ListField(child=serializers.CharField())
    rejected_credentials = serializers.CharField()


class RejectedCredentialsLimit(serializers.Serializer):
    bucket = serializers.CharField()
    multiplier = serializers.IntegerField()


class RateLimitsInfo(serializers.Serializer):
    """Request limits (spec, Limits). No burst allowance is promised."""

    requests_per_window = serializers.IntegerField()
    window_seconds = serializers.IntegerField()
    scope = serializers.CharField()
    accounting = serializers.CharField()
    burst = serializers.IntegerField()
    burst_note = serializers.CharField()
    wallet_line = serializers.CharField()
    anonymous = serializers.CharField()
    public_documents = serializers.CharField()
    rejected_credentials = RejectedCredentialsLimit()
    per_partner_override = serializers.BooleanField()
    headers = serializers.ListField(child=serializers.CharField())
    state = serializers.CharField()


class SupersededMember(serializers.Serializer):
    """A legacy member kept for existing readers."""

    superseded_by = serializers.CharField()
    summary = serializers.CharField(required=False)
    steps = serializers.ListField(child=serializers.CharField(), required=False)


class AgentManifestResponse(serializers.Serializer):
    """The agent manifest at ``/.well-known/agent.json``."""

    name = serializers.CharField()
    version = serializers.CharField()
    description = serializers.CharField()
    base_url = serializers.CharField()
    positioning = Positioning()
    agent_first = AgentFirst()
    canonical_loop = serializers.ListField(child=serializers.CharField())
    idempotency = serializers.CharField()
    delivery_uncertain = serializers.CharField()
    receipt_outcomes = serializers.ListField(child=serializers.CharField())
    surface_boundaries = SurfaceBoundaries()
    services = ManifestServices()
    auth = AuthSummary()
    rate_limits = RateLimitsInfo()
    docs = serializers.DictField(child=serializers.CharField())
    product_wedge = SupersededMember()
    product_loop = SupersededMember()


class CapabilityGroup(serializers.Serializer):
    """Endpoints of one capability group."""

    group = serializers.CharField()
    trust = serializers.CharField(help_text="core, supporting or simulation")
    description = serializers.CharField(allow_blank=True)
    endpoints = EndpointInfo(many=True)


class OperationRef(serializers.Serializer):
    method = serializers.CharField()
    path = serializers.CharField()


class DiscoverCaller(serializers.Serializer):
    """Who is asking: present in detail only when a valid key was sent."""

    authenticated = serializers.BooleanField()
    key_id = serializers.CharField(required=False)
    key_type = serializers.CharField(required=False, help_text="operator or wallet")
    wallet_id = serializers.CharField(required=False, allow_null=True)
    tenant_id = serializers.CharField(required=False, allow_null=True)
    available_operations = OperationRef(
        many=True,
        required=False,
        help_text="Operations this kind of key may call; each is still subject to per-wallet reach.",
    )


class DiscoverResponse(serializers.Serializer):
    """The expanded capability catalog."""

    name = serializers.CharField()
    version = serializers.CharField()
    description = serializers.CharField()
    canonical_loop = serializers.ListField(child=serializers.CharField())
    bootstrap_sequence = BootstrapStep(many=True)
    idempotency = serializers.CharField()
    delivery_uncertain = serializers.CharField()
    authentication = AuthSummary()
    rate_limits = RateLimitsInfo()
    surface_boundaries = SurfaceBoundaries()
    capabilities = CapabilityGroup(many=True)
    documents = serializers.DictField(child=serializers.CharField())
    caller = DiscoverCaller()


class DependencyCheck(serializers.Serializer):
    """One dependency: ok, down, skipped (with reason) or not_configured."""

    status = serializers.ChoiceField(choices=["ok", "down", "skipped", "not_configured"])
    latency_ms = serializers.FloatField(allow_null=True)
    error = serializers.CharField(allow_null=True)
    reason = serializers.CharField(required=False)
    key_id = serializers.CharField(required=False, help_text="Public id of the active signing key.")
    backend = serializers.CharField(required=False, help_text="Cache backend class.")


class ReadinessChecks(serializers.Serializer):
    database = DependencyCheck()
    signing_key = DependencyCheck()


class HealthDependencies(ReadinessChecks):
    cache = DependencyCheck()
    upstream = DependencyCheck()


class HealthDependenciesResponse(serializers.Serializer):
    """Dependency truth for the selected tool; ``degraded`` is answered with 503."""

    status = serializers.ChoiceField(choices=["healthy", "degraded"])
    version = serializers.CharField()
    checked_at = serializers.DateTimeField()
    tool = serializers.CharField(allow_null=True)
    tool_scope = serializers.ChoiceField(choices=["local", "upstream"], allow_null=True)
    dependencies = HealthDependencies()
    notice = serializers.CharField()


class UpstreamServerState(serializers.Serializer):
    """One enabled upstream server as readiness sees it (never its URL nor the upstream's words)."""

    slug = serializers.CharField()
    required = serializers.BooleanField()  # type: ignore[assignment]  # a field, popped by the metaclass
    reachable = serializers.BooleanField()
    protocol_version = serializers.CharField(allow_null=True)
    last_synced_at = serializers.DateTimeField(allow_null=True)
    error = serializers.ChoiceField(
        choices=["auth_refused", "server_error", "http_error", "timeout", "unreachable", "protocol_error"],
        allow_null=True,
    )


class TlogWitnessState(serializers.Serializer):
    """A transparency-log witness's standing with the integrator (docs/audit-chain.md); never its URL."""

    name = serializers.CharField()
    status = serializers.ChoiceField(choices=["ok", "backing_off", "unknown"])
    failures = serializers.IntegerField(help_text="Consecutive failures to answer.")
    retry_at = serializers.DateTimeField(allow_null=True, help_text="While backing off: not asked before then.")


class HealthReadyResponse(serializers.Serializer):
    """Ready (200) when the database, the signing key and every required upstream server are; else 503."""

    status = serializers.ChoiceField(choices=["ready", "not_ready"])
    version = serializers.CharField()
    checked_at = serializers.DateTimeField()
    dependencies = ReadinessChecks()
    upstream_servers = UpstreamServerState(many=True)
    tlog_witnesses = TlogWitnessState(many=True, help_text="Shown only: readiness does not depend on them.")


class HealthDependenciesQuery(serializers.Serializer):
    tool = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=200,
        help_text="Tool whose dependencies to check; a local tool skips the upstream check.",
    )


class PreflightRequest(serializers.Serializer):
    """Values to check. For operator keys an empty field falls back to the deployment's settings;
    a wallet key gets only the checks of the values it sends."""

    base_url = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    payment_secret_key = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=500, write_only=True
    )
    campaign_source_url = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class PreflightCheck(serializers.Serializer):
    """One readiness check and what it found."""

    name = serializers.ChoiceField(choices=["KEYS", "DOMAIN", "ORACLE", "ASSETS"])
    status = serializers.ChoiceField(
        choices=["pass", "warn", "fail", "skipped"],
        help_text="skipped: nothing to check (a value was not sent, or the check is the operator's configuration).",
    )
    details = serializers.ListField(child=serializers.CharField())


class PreflightResponse(serializers.Serializer):
    """GO when no check failed, else NO-GO."""

    verdict = serializers.ChoiceField(choices=["GO", "NO-GO"])
    base_url = serializers.CharField()
    checked_at = serializers.DateTimeField()
    checks = PreflightCheck(many=True)


class ProofSurface(serializers.Serializer):
    name = serializers.CharField()
    classification = serializers.CharField(help_text="Always SIMULATION.")
    simulation = serializers.BooleanField()
    description = serializers.CharField()


class ProofSurfaceIndexResponse(serializers.Serializer):
    """The demo surfaces, each a simulation."""

    simulation = serializers.BooleanField()
    notice = serializers.CharField()
    surfaces = ProofSurface(many=True)


# -- JSON endpoints ------------------------------------------------------------------------------


class AgentManifestView(APIView):
    permission_classes = [AllowAnyone]

    @extend_schema(
        operation_id="agent_manifest",
        tags=DISCOVERY,
        auth=[],
        responses={200: AgentManifestResponse, **error_responses(401)},
        summary="Agent manifest: version, surfaces, services and their routed endpoints, auth, limits, docs",
    )
    def get(self, request: Request) -> Response:
        return Response(AgentManifestResponse(discovery.agent_manifest()).data)


class DiscoverView(APIView):
    permission_classes = [AllowAnyone]

    @extend_schema(
        operation_id="discover",
        tags=DISCOVERY,
        auth=OPTIONAL_KEY,  # type: ignore[arg-type]  # security requirement objects; {} = anonymous allowed
        responses={200: DiscoverResponse, **error_responses(401)},
        summary="Expanded capability catalog; with a valid key, the caller's wallet and usable operations",
    )
    def get(self, request: Request) -> Response:
        return Response(DiscoverResponse(discovery.discover_catalog(optional_principal(request))).data)


class HealthDependenciesView(APIView):
    permission_classes = [AllowAnyone]

    @extend_schema(
        operation_id="health_dependencies",
        tags=HEALTH,
        auth=[],
        parameters=[HealthDependenciesQuery],
        responses={
            200: OpenApiResponse(HealthDependenciesResponse, description="Every dependency that applies is ok."),
            503: OpenApiResponse(HealthDependenciesResponse, description="At least one dependency is down."),
            **error_responses(401, 422),
        },
        summary="Dependency truth (database, signing key, cache, upstream) for the selected tool",
    )
    def get(self, request: Request) -> Response:
        params = parse_query(request, HealthDependenciesQuery)
        report = health.dependency_report(tool=params.get("tool") or None)
        status = 200 if report["status"] == health.HEALTHY else 503
        response = Response(HealthDependenciesResponse(report).data, status=status)
        response["Cache-Control"] = "no-store"
        return response


class HealthReadyView(APIView):
    permission_classes = [AllowAnyone]

    @extend_schema(
        operation_id="health_ready",
        tags=HEALTH,
        auth=[],
        responses={
            200: OpenApiResponse(HealthReadyResponse, description="Ready: every required upstream server too."),
            503: OpenApiResponse(HealthReadyResponse, description="Not ready."),
            **error_responses(),
        },
        summary="Readiness: database, signing key and each enabled upstream server (reachable, protocol, last sync)",
    )
    def get(self, request: Request) -> Response:
        report = health.readiness_report()
        response = Response(HealthReadyResponse(report).data, status=200 if report["status"] == "ready" else 503)
        response["Cache-Control"] = "no-store"
        return response


class LaunchPreflightView(APIView):
    @extend_schema(
        operation_id="launch_preflight",
        tags=READINESS,
        request=PreflightRequest,
        responses={200: PreflightResponse, **error_responses(401, 422)},
        summary="Launch readiness: KEYS, DOMAIN, ORACLE and ASSETS checks with a GO or NO-GO verdict",
        description="Read-only: nothing is written and no directory is contacted. Network reads are https only, "
        "without redirects, to public addresses, with short timeouts.",
    )
    def post(self, request: Request) -> Response:
        data = parse_body(request, PreflightRequest) if request.body else PreflightRequest().to_internal_value({})
        report = preflight.launch_preflight_run(
            base_url=data["base_url"],
            payment_secret_key=data["payment_secret_key"],
            campaign_source_url=data["campaign_source_url"],
            fetcher=preflight.default_fetcher(),
            # The deployment's configuration is the operator's business (adversarial review item 11).
            include_configuration=principal(request).is_operator,
        )
        return Response(PreflightResponse(report).data)


PROOF_SURFACE_DESCRIPTIONS = {
    "agentic-web": "Simulated agent-to-website interactions.",
    "browser": "Simulated browser automation runs.",
    "content": "Simulated content generation and publication.",
    "oracle": "Simulated agent directory and oracle lookups.",
    "sandbox": "Simulated sandboxed code execution.",
    "media": "Simulated media processing.",
    "iot": "Simulated IoT device commands.",
    "red-team": "Simulated adversarial probes against the gateway.",
    "telemetry": "Simulated telemetry streams.",
}


class ProofSurfaceIndexView(APIView):
    permission_classes = [AllowAnyone]

    @extend_schema(
        operation_id="proof_surfaces_index",
        tags=PROOF,
        auth=[],
        responses={200: ProofSurfaceIndexResponse, **error_responses(401)},
        summary="Read-only index of the demo surfaces; every one is a simulation",
    )
    def get(self, request: Request) -> Response:
        surfaces = [
            {
                "name": name,
                "classification": "SIMULATION",
                "simulation": True,
                "description": PROOF_SURFACE_DESCRIPTIONS.get(name, "Simulated surface."),
            }
            for name in discovery.PROOF_SURFACES
        ]
        body = {
            "simulation": True,
            "notice": "Demo scaffolding. Nothing here touches a real system, moves credits or produces evidence; "
            "no output of a simulation is proof of a downstream effect.",
            "surfaces": surfaces,
        }
        return Response(ProofSurfaceIndexResponse(body).data)


# -- documents -----------------------------------------------------------------------------------


def _text(body: str, content_type: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "public, max-age=300"
    return response


@cache
def _markdown(name: str) -> str:
    return (DOCS_DIR / name).read_text(encoding="utf-8")


def _text_document(
    *, operation_id: str, summary: str, media_type: str, body: Callable[[], str]
) -> Callable[[HttpRequest], HttpResponse]:
    """A public text document (UTF-8, cacheable for five minutes), described for ``/openapi.json``."""

    @advertise(document=DocumentSpec(operation_id=operation_id, summary=summary, media_type=media_type))
    @require_safe
    def view(request: HttpRequest) -> HttpResponse:
        return _text(body(), f"{media_type}; charset=utf-8")

    view.__name__ = view.__qualname__ = operation_id
    return view


llms_txt = _text_document(
    operation_id="llms_txt",
    summary="Readable service description for agents (generated from the live routes)",
    media_type="text/plain",
    body=discovery.llms_txt,
)
llm_txt = _text_document(
    operation_id="llm_txt",
    summary="Alias of /llms.txt (kept for existing clients)",
    media_type="text/plain",
    body=discovery.llms_txt,
)
wedge_md = _text_document(
    operation_id="wedge_md",
    summary="What Tollgate is for and where it stops",
    media_type="text/markdown",
    body=lambda: _markdown("WEDGE.md"),
)
security_limitations_md = _text_document(
    operation_id="security_limitations_md",
    summary="What Tollgate does not guarantee",
    media_type="text/markdown",
    body=lambda: _markdown("SECURITY_LIMITATIONS.md"),
)


# -- the dashboard -------------------------------------------------------------------------------

DEPENDENCY_LABELS = {
    "database": "Database",
    "signing_key": "Signing key",
    "cache": "Cache",
    "upstream": "Upstream MCP server",
}
OUTCOME_TONE = {
    "success": "ok",
    "tool_error": "warn",
    "response_rejected": "warn",
    "delivery_uncertain": "warn",
    "failed_refunded": "muted",
    "failed_unrefunded": "bad",
    "denied": "bad",
    "insufficient_funds": "bad",
}


def _outcome_counts(since: Any) -> list[dict[str, Any]]:
    from receipts.models import Outcome, Receipt

    rows = dict(
        Receipt.objects.filter(created_at__gte=since)
        .order_by()
        .values("outcome")
        .annotate(n=Count("receipt_id"))
        .values_list("outcome", "n")
    )
    return [{"outcome": o.value, "count": rows.get(o.value, 0), "tone": OUTCOME_TONE.get(o.value, "")} for o in Outcome]


def _staff_context() -> dict[str, Any]:
    from audit.models import ChainHead, SigningKey, SigningKeyState
    from receipts.models import Receipt

    receipts = list(
        Receipt.objects.order_by("-created_at").only(
            "receipt_id", "tool", "outcome", "wallet_id", "credits_charged", "created_at"
        )[:50]
    )
    for r in receipts:
        r.tone = OUTCOME_TONE.get(r.outcome, "")  # type: ignore[attr-defined]
    return {
        "chain_heads": list(ChainHead.objects.order_by("-updated_at")[:50]),
        "chain_count": ChainHead.objects.count(),
        "signing_key_id": SigningKey.objects.filter(state=SigningKeyState.ACTIVE)
        .values_list("key_id", flat=True)
        .first(),
        "receipts": receipts,
    }


@advertise(
    document=DocumentSpec(
        operation_id="dashboard",
        summary="Status page: version, dependency health, receipt outcomes (24 h); staff see the evidence index",
        media_type="text/html",
        tags=("human",),
    )
)
@require_safe
def dashboard(request: HttpRequest) -> HttpResponse:
    """Aggregate status for everyone; chain heads, signing key and the evidence index for staff only."""
    now = timezone.now()
    report = health.dependency_report(tool=None)
    outcomes = _outcome_counts(now - timedelta(hours=24))
    # The evidence index lists every tenant's receipts: staff with the receipts view permission only.
    is_staff = _may_inspect_evidence(request)
    context: dict[str, Any] = {
        "version": settings.SERVICE_VERSION,
        "report": report,
        "checks": [(DEPENDENCY_LABELS.get(name, name), check) for name, check in report["dependencies"].items()],
        "outcomes": outcomes,
        "outcome_total": sum(o["count"] for o in outcomes),
        "is_staff": is_staff,
        "now": now,
        "proof_surfaces_enabled": settings.ENABLE_PROOF_SURFACES,
    }
    if is_staff:
        context.update(_staff_context())
    response = render(request, "site/dashboard.html", context)
    response["Cache-Control"] = "no-store" if is_staff else "no-cache"
    return response


def _may_inspect_evidence(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_authenticated and user.is_staff and user.has_perm("receipts.view_receipt"))


def _staff_receipt(request: HttpRequest, receipt_id: str) -> Any:
    from receipts.models import Receipt

    if not _may_inspect_evidence(request):
        return None
    return Receipt.objects.filter(receipt_id=receipt_id).first()


def _evidence_json(request: HttpRequest, receipt_id: str, build: Any) -> HttpResponse:
    if not request.user.is_authenticated:
        # Console-only (staff with receipts.view_receipt): the console's login, not the approvers'.
        return redirect_to_login(request.get_full_path(), login_url=reverse("admin:login"))
    receipt = _staff_receipt(request, receipt_id)
    if receipt is None:
        return json_error(request, NotFound("No such receipt.", receipt_id=receipt_id))
    response = JsonResponse(build(receipt), json_dumps_params={"indent": 2})
    response["Cache-Control"] = "no-store"
    return response


@require_safe
def dashboard_evidence(request: HttpRequest, receipt_id: str) -> HttpResponse:
    """The evidence bundle of ``GET /v1/evidence/{id}``, for a staff session (the dashboard's links)."""
    from receipts.selectors import evidence_bundle
    from receipts.serializers import EvidenceBundleResponse

    return _evidence_json(request, receipt_id, lambda r: EvidenceBundleResponse(evidence_bundle(r)).data)


@require_safe
def dashboard_portable(request: HttpRequest, receipt_id: str) -> HttpResponse:
    """The portable receipt of ``GET /v1/receipts/{id}/portable``, for a staff session."""
    from receipts.selectors import portable_receipt

    return _evidence_json(request, receipt_id, portable_receipt)


LANDING_LINKS = [
    ("Dashboard", "/dashboard", "Status of the gateway and its dependencies; the evidence index for staff."),
    ("API reference", "/docs", "Interactive OpenAPI documentation (also /redoc and /openapi.json)."),
    ("Approvals", "/approvals/", "For people who approve agents' permit requests."),
    ("Operator console", "/admin/", "Wallets, credits, keys, prices, permits and reconciliation."),
    ("Agent manifest", "/.well-known/agent.json", "Where an agent starts: the bootstrap sequence."),
    ("llms.txt", "/llms.txt", "The service described for language models."),
]


@require_safe
def landing(request: HttpRequest) -> HttpResponse:
    """``/``: an HTML page for browsers, JSON for API clients (content negotiation on ``Accept``)."""
    accept = request.headers.get("Accept", "")
    html, json_ = accept.find("text/html"), accept.find("application/json")
    wants_html = html != -1 and (json_ == -1 or html < json_)  # browsers list text/html first
    if wants_html:
        return render(request, "site/landing.html", {"links": LANDING_LINKS, "version": settings.SERVICE_VERSION})
    return JsonResponse(
        {
            "name": "Tollgate",
            "version": settings.SERVICE_VERSION,
            "description": "Transaction-integrity gateway for consequential actions taken by autonomous AI agents.",
            "links": {title.lower().replace(" ", "_"): href for title, href, _ in LANDING_LINKS},
        }
    )


@require_GET
def liveness(request: HttpRequest) -> JsonResponse:
    """Liveness only: the process answers. Dependency truth is ``/health/dependencies``."""
    return JsonResponse({"status": "ok", "service": "tollgate", "version": settings.SERVICE_VERSION})


@cache
def _favicon_bytes() -> bytes:
    """A 16x16 icon (the console's dark blue square), an ICO holding one PNG, built once."""
    import struct
    import zlib

    size = 16
    row = b"\x00" + bytes((0x16, 0x1B, 0x26, 0xFF)) * size  # filter byte, then RGBA pixels
    chunks = b""
    for kind, data in (
        (b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)),
        (b"IDAT", zlib.compress(row * size)),
        (b"IEND", b""),
    ):
        chunks += struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    png = b"\x89PNG\r\n\x1a\n" + chunks
    header = struct.pack("<HHH", 0, 1, 1) + struct.pack("<BBBBHHII", size, size, 0, 0, 1, 32, len(png), 22)
    return header + png


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``: browsers ask for it on every page; it answered 404."""
    response = HttpResponse(_favicon_bytes(), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response
