"""API-key HTTP API (spec "API keys"): create, list (masked), rotate, revoke, emergency revoke, logs.

The wallet a request addresses is resolved by billing's rule (403/404 as
``billing.selectors.wallet_for_caller``), given through ``access.wallets``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from access import selectors, services
from access.authentication import principal
from access.generics import PageView, page_schema
from access.selectors import Principal
from access.serializers import (
    APIKeyListResponse,
    APIKeyResponse,
    APIKeyWithSecret,
    CreateAPIKeyRequest,
    EmergencyKeyRevocationRequest,
    EmergencyKeyRevocationResponse,
    KeyLogQuery,
    KeyRotationLogEntry,
    RevokeQuery,
    RotateAPIKeyRequest,
    RotationResponse,
    api_key_data,
)
from access.wallets import wallet_directory
from common.pagination import parse_body, parse_query
from common.schema import ERRORS_KEY, error_responses

TAG = ["api_keys"]

# The answers that carry a key's secret (create, rotate): no cache (browser, proxy) may keep a copy.
NO_STORE = {"Cache-Control": "no-store"}


class APIKeyCreateView(APIView):
    @extend_schema(
        operation_id="api_keys_create",
        tags=TAG,
        request=CreateAPIKeyRequest,
        responses={201: APIKeyWithSecret, **error_responses(401, 403, 404, 409, 422)},
        summary="Create a wallet-scoped API key (the secret is shown once)",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        data = parse_body(request, CreateAPIKeyRequest)
        wallet = wallet_directory().for_caller(caller, data["wallet_id"])
        issued = services.api_key_create(wallet=wallet, name=data["name"], actor_key_id=caller.key_id)
        return Response(api_key_data(issued.key, issued.secret), status=status.HTTP_201_CREATED, headers=NO_STORE)


@page_schema("api_keys_list", "List a wallet's API keys (masked)", TAG, APIKeyListResponse, 401, 403, 404, 422)
class APIKeyListView(PageView):
    item = APIKeyResponse

    def rows(self, caller: Principal, params: dict[str, Any], wallet_id: str) -> QuerySet[Any]:
        return selectors.api_keys_of_wallet(wallet_directory().for_caller(caller, wallet_id))


class APIKeyRotateView(APIView):
    @extend_schema(
        operation_id="api_keys_rotate",
        tags=TAG,
        request=RotateAPIKeyRequest,
        responses={200: RotationResponse, **error_responses(401, 403, 404, 409, 422)},
        summary="Rotate a key: create its successor (shown once), optionally revoking it",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        data = parse_body(request, RotateAPIKeyRequest)
        wallet = wallet_directory().for_caller(caller, data["wallet_id"])
        issued = services.api_key_rotate(
            wallet=wallet,
            key_id=data["key_id"],
            revoke_old=data["revoke_old"],
            reason=data["reason"],
            actor_key_id=caller.key_id,
        )
        body = {
            "old_key_id": data["key_id"],
            "old_key_revoked": data["revoke_old"],
            "new_key": api_key_data(issued.key, issued.secret),
        }
        return Response(body, headers=NO_STORE)


class APIKeyRevokeView(APIView):
    @extend_schema(
        operation_id="api_keys_revoke",
        tags=TAG,
        parameters=[RevokeQuery],
        responses={204: OpenApiResponse(description="Revoked."), **ERRORS_KEY},
        summary="Revoke one API key immediately (cannot be undone)",
    )
    def delete(self, request: Request, wallet_id: str, key_id: str) -> Response:
        caller = principal(request)
        params = parse_query(request, RevokeQuery)
        wallet = wallet_directory().for_caller(caller, wallet_id)
        services.api_key_revoke(wallet=wallet, key_id=key_id, reason=params["reason"], actor_key_id=caller.key_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class APIKeyEmergencyRevokeView(APIView):
    @extend_schema(
        operation_id="api_keys_emergency_revoke",
        tags=TAG,
        request=EmergencyKeyRevocationRequest,
        responses={200: EmergencyKeyRevocationResponse, **error_responses(401, 403, 404, 422)},
        summary="Revoke every key of a wallet immediately",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        data = parse_body(request, EmergencyKeyRevocationRequest)
        wallet = wallet_directory().for_caller(caller, data["wallet_id"])
        revoked = services.api_key_emergency_revoke(wallet=wallet, reason=data["reason"], actor_key_id=caller.key_id)
        body = {
            "wallet_id": wallet.wallet_id,
            "revoked_count": len(revoked),
            "revoked_key_ids": revoked,
            "reason": data["reason"],
        }
        return Response(body)


class APIKeyLogsView(APIView):
    @extend_schema(
        operation_id="api_keys_logs",
        tags=TAG,
        parameters=[KeyLogQuery],
        responses={200: KeyRotationLogEntry(many=True), **ERRORS_KEY},
        summary="Key lifecycle log of a wallet (creation, rotation, revocation)",
    )
    def get(self, request: Request, wallet_id: str) -> Response:
        caller = principal(request)
        params = parse_query(request, KeyLogQuery)
        wallet = wallet_directory().for_caller(caller, wallet_id)
        rows = selectors.key_logs_of_wallet(wallet)[: params["limit"]]
        return Response(KeyRotationLogEntry(rows, many=True).data)
