"""Audit, signing-key and alert HTTP API (spec "Audit", "Signing keys", ``/v1/me/alerts``)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from access.authentication import AllowAnyone, principal
from access.generics import PageView, page_schema
from access.selectors import Principal
from audit import chain_verification, selectors, services
from audit.serializers import (
    AlertListResponse,
    AlertResponse,
    AuditChainVerifyRequest,
    AuditChainVerifyResponse,
    AuditEventListResponse,
    AuditEventQuery,
    AuditEventResponse,
    AuditEventSummaryItem,
    AuditSummaryQuery,
    AuditSummaryResponse,
    JWKSResponse,
    MeAuditEventQuery,
    SigningKeyMetadataResponse,
    jwk_data,
)
from common.pagination import parse_body, parse_query
from common.schema import error_responses

AUDIT = ["audit"]
SIGNING_KEYS = ["signing_keys"]
ME = ["me"]
_SIGNING_UNAVAILABLE = OpenApiResponse(description="No usable signing key on this server (signing_key_unavailable).")


@page_schema(
    "audit_events_list",
    "List audit events (wallet keys: their wallet's and those below it; operator keys: all)",
    AUDIT,
    AuditEventListResponse,
    401,
    422,
)
class AuditEventListView(PageView):
    query = AuditEventQuery
    rows = staticmethod(selectors.audit_event_list)

    def item_for(self, params: dict[str, Any]) -> type[serializers.Serializer]:
        return AuditEventSummaryItem if params["summary"] else AuditEventResponse


class AuditSummaryView(APIView):
    @extend_schema(
        operation_id="audit_summary",
        tags=AUDIT,
        parameters=[AuditSummaryQuery],
        responses={200: AuditSummaryResponse, **error_responses(401, 422)},
        summary="Count audit events by event and outcome over a time range",
    )
    def get(self, request: Request) -> Response:
        caller = principal(request)
        params = parse_query(request, AuditSummaryQuery)
        summary = selectors.audit_summary(
            caller, created_after=params.get("created_after"), created_before=params.get("created_before")
        )
        return Response(AuditSummaryResponse(summary).data)


class AuditChainVerifyView(APIView):
    @extend_schema(
        operation_id="audit_verify_chain",
        tags=AUDIT,
        request=AuditChainVerifyRequest,
        responses={
            200: AuditChainVerifyResponse,
            **error_responses(401, 403, 404, 422),
            503: _SIGNING_UNAVAILABLE,
        },
        summary="Recompute an audit chain, report the first broken event and sign a checkpoint",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        data = parse_body(request, AuditChainVerifyRequest)
        chain = selectors.chain_for_caller(caller, data.get("chain"))
        result = chain_verification.audit_chain_verify(
            chain=chain,
            from_seq=data["from_seq"],
            to_seq=data.get("to_seq"),
            checkpoint=data.get("checkpoint"),
            record=True,
        )
        return Response(AuditChainVerifyResponse(result).data)


@page_schema(
    "me_audit_events_list",
    "Audit events about the caller's own wallet (wallet-scoped keys only)",
    ME,
    AuditEventListResponse,
    401,
    403,
    422,
)
class MyAuditEventListView(PageView):
    query, item = MeAuditEventQuery, AuditEventResponse
    rows = staticmethod(selectors.my_audit_event_list)


@page_schema(
    "me_alerts_list",
    "Alerts of the caller's own wallet (wallet-scoped keys only)",
    ME,
    AlertListResponse,
    401,
    403,
    422,
)
class MyAlertListView(PageView):
    item = AlertResponse

    def rows(self, caller: Principal, params: dict[str, Any]) -> QuerySet[Any]:
        return selectors.my_alerts(caller)


def signing_keys_schema(operation_id: str, summary: str, response: Any, *errors: int, unavailable: bool = False) -> Any:
    """The schema of a signing-key endpoint: public (no security requirement), tag ``signing_keys``, ``response``
    for 200, then ``errors``, and 503 where the answer needs a usable signing key on this server."""
    responses = {200: response, **error_responses(*errors)}
    if unavailable:
        responses[503] = _SIGNING_UNAVAILABLE
    return extend_schema(operation_id=operation_id, tags=SIGNING_KEYS, auth=[], responses=responses, summary=summary)


# The signing keys' public metadata: anyone may read it (a presented key is still checked: a bad one is 401).
class PublicKeyView(APIView):
    permission_classes = [AllowAnyone]


class SigningKeyActiveView(PublicKeyView):
    @signing_keys_schema(
        "signing_keys_active",
        "Public metadata of the active evidence signing key",
        SigningKeyMetadataResponse,
        unavailable=True,
    )
    def get(self, request: Request) -> Response:
        # Public metadata, from the database row: 200 whether or not this instance holds the private part.
        return Response(SigningKeyMetadataResponse(services.signing_key_active_published()).data)


class SigningKeyDetailView(PublicKeyView):
    @signing_keys_schema(
        "signing_keys_get",
        "Public metadata of an active or retired evidence signing key",
        SigningKeyMetadataResponse,
        404,
    )
    def get(self, request: Request, key_id: str) -> Response:
        return Response(SigningKeyMetadataResponse(selectors.signing_key_get(key_id)).data)


class JWKSView(PublicKeyView):
    @signing_keys_schema(
        "signing_keys_jwks", "JSON Web Key Set of every published evidence signing key (OKP, Ed25519)", JWKSResponse
    )
    def get(self, request: Request) -> Response:
        return Response({"keys": [jwk_data(key) for key in selectors.signing_keys_published()]})
