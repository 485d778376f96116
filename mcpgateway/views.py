"""Gateway HTTP surface: the tool catalog and the deprecated REST invoke."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from access.authentication import AllowAnyone, NotAuthenticated, optional_principal, principal
from common import tracing
from common.errors import NotFound, OperatorKeyRequired, RequestValidationError, flatten_drf_errors
from common.pagination import parse_body, parse_query
from common.schema import error_responses
from mcpgateway import services
from mcpgateway.models import UpstreamProbeSource, UpstreamServer
from mcpgateway.serializers import (
    ToolCallRequest,
    ToolCallResponse,
    ToolCategoryQuery,
    ToolDefinition,
    ToolManifestResponse,
    ToolPageQuery,
    ToolPageResponse,
    UpstreamCredentialClearQuery,
    UpstreamCredentialRequest,
    UpstreamProbeResponse,
    UpstreamServerCreateRequest,
    UpstreamServerListResponse,
    UpstreamServerResponse,
    UpstreamServerUpdateRequest,
    UpstreamSyncResponse,
)
from mcpgateway.services import upstreams
from mcpgateway.transports import DEPRECATION, OriginNotAllowed, origin_allowed, tool_definitions
from mcpgateway.upstream.client import UpstreamError

# Security requirement objects: either key header, or none ({}: anonymous allowed).
OPTIONAL_KEY: list[dict[str, list[str]]] = [{"APIKeyHeader": []}, {"BearerAuth": []}, {}]


def catalog_schema(operation_id: str, summary: str, response: Any, *errors: int, query: Any = None) -> Any:
    """The schema of a tool catalog page: tag ``mcp``, a key optional (401 where TOOL_CATALOG_REQUIRES_KEY)."""
    return extend_schema(
        operation_id=operation_id,
        tags=["mcp"],
        auth=OPTIONAL_KEY,  # type: ignore[arg-type]
        parameters=None if query is None else [query],
        responses={200: response, **error_responses(401, *errors)},
        summary=summary,
    )


class CatalogView(APIView):
    """Tool catalogs are public, except on production-like deployments (TOOL_CATALOG_REQUIRES_KEY)."""

    permission_classes = [AllowAnyone]

    def check_catalog_access(self, request: Request) -> None:
        if settings.TOOL_CATALOG_REQUIRES_KEY and optional_principal(request) is None:
            raise NotAuthenticated("The tool catalog needs an API key on this deployment.")


def _manifest(category: str | None) -> dict[str, Any]:
    return {
        "name": "Tollgate",
        "version": settings.SERVICE_VERSION,
        "mcp_endpoint": "/mcp" if settings.ENABLE_MCP_STREAMABLE_HTTP else None,
        "tools": tool_definitions(services.tools_catalog(category=category)),
    }


class ToolManifestView(CatalogView):
    @catalog_schema(
        "mcp_tools_manifest",
        "The tool manifest (authoritative for callable tools; mirrors tools/list)",
        ToolManifestResponse,
        422,
        query=ToolCategoryQuery,
    )
    def get(self, request: Request) -> Response:
        self.check_catalog_access(request)
        params = parse_query(request, ToolCategoryQuery)
        return Response(_manifest(params.get("category")))


class WellKnownToolManifestView(ToolManifestView):
    @catalog_schema(
        "mcp_tools_manifest_well_known",
        "The tool manifest at its well-known address",
        ToolManifestResponse,
        422,
        query=ToolCategoryQuery,
    )
    def get(self, request: Request) -> Response:
        return super().get(request)


class ToolListView(CatalogView):
    @catalog_schema("mcp_tools_list", "Paginated tool list with schemas", ToolPageResponse, 422, query=ToolPageQuery)
    def get(self, request: Request) -> Response:
        self.check_catalog_access(request)
        params = parse_query(request, ToolPageQuery)
        tools = services.tools_catalog(category=params.get("category"))
        limit, offset = params["limit"], params["offset"]
        return Response(
            {
                "items": tool_definitions(tools[offset : offset + limit]),
                "total": len(tools),
                "limit": limit,
                "offset": offset,
            }
        )


class ToolDetailView(CatalogView):
    @catalog_schema("mcp_tools_retrieve", "One tool's full definition", ToolDefinition, 404)
    def get(self, request: Request, service_id: str) -> Response:
        self.check_catalog_access(request)
        tool = services.tool_get(service_id)
        if tool is None or not services.tool_is_listed(tool):  # as tools/list: an unusable one is not offered
            raise NotFound("No such tool.", service_id=service_id)
        return Response(tool_definitions([tool])[0])


class ToolInvokeView(APIView):
    @extend_schema(
        operation_id="mcp_tools_invoke",
        tags=["mcp"],
        request=ToolCallRequest,
        parameters=[OpenApiParameter("Deprecation", str, OpenApiParameter.HEADER, required=False, exclude=True)],
        responses={
            200: ToolCallResponse,
            402: ToolCallResponse,
            403: ToolCallResponse,
            502: ToolCallResponse,
            504: ToolCallResponse,
            **error_responses(401, 404, 409, 422),
        },
        deprecated=True,
        summary="Deprecated: invoke a tool over REST (same governed path as MCP tools/call)",
    )
    def post(self, request: Request, service_id: str) -> Response:
        if not origin_allowed(request):  # an MCP endpoint, as every other (docs/architecture.md, "MCP transports")
            raise OriginNotAllowed()
        caller = principal(request)
        if services.tool_get(service_id) is None:
            raise NotFound("No such tool.", service_id=service_id)
        data = request.data if isinstance(request.data, dict) else None
        serializer = ToolCallRequest(data=data)
        if data is None or not serializer.is_valid():
            errors = (
                serializer.errors if data is not None else {"non_field_errors": ["The body must be a JSON object."]}
            )
            raise RequestValidationError(flatten_drf_errors(errors, ["body"]))
        body = serializer.validated_data
        from common.idempotency import validate_idempotency_key

        try:
            validate_idempotency_key(body["idempotency_key"], required=True)
        except RequestValidationError as err:
            raise RequestValidationError([{**e, "loc": ["body", "idempotency_key"]} for e in err.errors]) from err
        answer = services.governed_call(
            services.CallRequest(
                principal=caller,
                tool=service_id,
                arguments=body["arguments"],
                idempotency_key=body["idempotency_key"],
                permit_id=body["permit_id"],
                quote_id=body["quote_id"],
                transport="rest_invoke",
                endpoint=f"/mcp/tools/{service_id}/invoke",
                trace_context=tracing.incoming_context(request.headers),
            )
        )
        stored = answer.response
        payload = {
            "action_id": stored["action_id"],
            "receipt_id": stored["receipt_id"],
            "outcome": stored["outcome"],
            "reason_code": stored["reason_code"],
            "credits_charged": stored["credits_charged"],
            "replayed": answer.replayed,
            "result": answer.result,  # the upstream's, less any io.tollgate/ key it put in _meta
            "error": stored["error"],
        }
        response = Response(payload, status=answer.http_status)
        if answer.replayed:
            response["Idempotent-Replayed"] = "true"
        return response

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        response["Deprecation"] = DEPRECATION
        response["Link"] = '</mcp>; rel="successor-version"'
        return response


# --- Upstream servers: the operator API (an extension of the spec) ---------------------------------

UPSTREAMS = ["upstreams"]
EXTENSION = {"x-tollgate-extension": True}


def upstreams_schema(operation_id: str, summary: str, responses: dict[int, Any], *errors: int, **more: Any) -> Any:
    """The schema of an operation on upstream servers: an extension of the spec, tag ``upstreams``, operator
    key only (401, 403), then ``errors``."""
    return extend_schema(
        operation_id=operation_id,
        tags=UPSTREAMS,
        extensions=EXTENSION,
        responses={**responses, **error_responses(401, 403, *errors)},
        summary=summary,
        **more,
    )


def _operator(request: Request) -> str:
    """The operator key's id, or ``OperatorKeyRequired``: servers and their credentials are the operator's."""
    caller = principal(request)
    if not caller.is_operator:
        raise OperatorKeyRequired()
    return f"key:{caller.key_id}"


_SERVER_FIELDS = [
    name for name in UpstreamServerResponse._declared_fields if name not in ("credentials", "credentials_set")
]


def _server_data(server: UpstreamServer) -> dict[str, Any]:
    credentials = sorted(
        server.credentials.values("tenant_id", "kind", "set_at"),
        key=lambda row: (row["tenant_id"] is not None, row["tenant_id"]),
    )
    return {
        **{name: getattr(server, name) for name in _SERVER_FIELDS},
        "credentials": [row["tenant_id"] for row in credentials],
        "credentials_set": credentials,
    }


def _server(slug: str) -> UpstreamServer:
    server = UpstreamServer.objects.filter(slug=slug).first()
    if server is None:
        raise upstreams.UpstreamServerNotFound(slug=slug)
    return server


class UpstreamServerListView(APIView):
    @upstreams_schema("upstreams_list", "Upstream MCP servers (operator key only)", {200: UpstreamServerListResponse})
    def get(self, request: Request) -> Response:
        _operator(request)
        servers = UpstreamServer.objects.order_by("slug")
        return Response(UpstreamServerListResponse({"items": [_server_data(s) for s in servers]}).data)

    @upstreams_schema(
        "upstreams_create",
        "Register an upstream MCP server (operator key only); its tools come with its first sync",
        {201: UpstreamServerResponse},
        409,
        422,
        request=UpstreamServerCreateRequest,
    )
    def post(self, request: Request) -> Response:
        actor = _operator(request)
        data = parse_body(request, UpstreamServerCreateRequest)
        server = upstreams.upstream_server_create(
            slug=data.pop("slug"), name=data.pop("name", ""), url=data.pop("url"), actor=actor, **data
        )
        return Response(UpstreamServerResponse(_server_data(server)).data, status=201)


class UpstreamServerDetailView(APIView):
    @upstreams_schema(
        "upstreams_get", "One upstream MCP server (operator key only)", {200: UpstreamServerResponse}, 404
    )
    def get(self, request: Request, slug: str) -> Response:
        _operator(request)
        return Response(UpstreamServerResponse(_server_data(_server(slug))).data)

    @upstreams_schema(
        "upstreams_update",
        "Change an upstream server's settings (operator key only); its stored tools keep their names",
        {200: UpstreamServerResponse},
        404,
        409,
        422,
        request=UpstreamServerUpdateRequest,
    )
    def patch(self, request: Request, slug: str) -> Response:
        actor = _operator(request)
        data = parse_body(request, UpstreamServerUpdateRequest)
        server = upstreams.upstream_server_update(server_id=_server(slug).server_id, actor=actor, **data)
        return Response(UpstreamServerResponse(_server_data(server)).data)


class UpstreamCredentialView(APIView):
    @upstreams_schema(
        "upstreams_credentials_set",
        "Set the credentials sent to a server, its own or one tenant's (write-only; operator key only)",
        {204: None},
        404,
        422,
        request=UpstreamCredentialRequest,
    )
    def put(self, request: Request, slug: str) -> Response:
        actor = _operator(request)
        data = parse_body(request, UpstreamCredentialRequest)
        secret = {name: data.get(name) for name in upstreams.CREDENTIAL_FIELDS[data["kind"]]}
        upstreams.upstream_credential_set(
            server_id=_server(slug).server_id,
            tenant_id=data["tenant_id"],
            kind=data["kind"],
            secret=secret,
            actor=actor,
        )
        return Response(status=204)

    @upstreams_schema(
        "upstreams_credentials_clear",
        "Remove a server's own credentials, or one tenant's (operator key only)",
        {204: None},
        404,
        422,
        parameters=[UpstreamCredentialClearQuery],
    )
    def delete(self, request: Request, slug: str) -> Response:
        actor = _operator(request)
        params = parse_query(request, UpstreamCredentialClearQuery)
        upstreams.upstream_credential_clear(
            server_id=_server(slug).server_id, tenant_id=params["tenant_id"], actor=actor
        )
        return Response(status=204)


class UpstreamSyncView(APIView):
    @upstreams_schema(
        "upstreams_sync",
        "Sync a server's tools: added, changed, disabled (no longer listed) and refused (name taken)",
        {200: UpstreamSyncResponse},
        404,
        502,
        request=None,
    )
    def post(self, request: Request, slug: str) -> Response:
        actor = _operator(request)
        server = _server(slug)
        try:
            report = upstreams.upstream_server_sync(server=server, actor=actor)
        except UpstreamError as exc:
            raise upstreams.UpstreamSyncFailed(error_class=upstreams.upstream_error_class(exc)) from None
        return Response(
            UpstreamSyncResponse(
                {
                    "created": report.created,
                    "changed": report.changed,
                    "disabled": report.disabled,
                    "refused": report.refused,
                    "invalid": report.invalid,
                }
            ).data
        )


class UpstreamTestView(APIView):
    @upstreams_schema(
        "upstreams_test",
        "Test the connection to a server with its own credentials (operator key only)",
        {200: UpstreamProbeResponse},
        404,
        request=None,
    )
    def post(self, request: Request, slug: str) -> Response:
        _operator(request)
        probe = upstreams.upstream_server_check(server=_server(slug), checked_by=UpstreamProbeSource.API)
        return Response(UpstreamProbeResponse(probe).data)
