"""Receipts and evidence HTTP API (spec "Receipts and evidence")."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from access.authentication import principal
from access.generics import DetailView, MePageView, PageView, detail_schema, page_schema
from access.selectors import Principal
from audit.signing import verify_statement
from common.errors import OperatorKeyRequired
from common.jsonbody import storable_text
from common.pagination import parse_body
from common.schema import error_responses
from permits.selectors import permit_for_caller
from receipts import selectors, services
from receipts.serializers import (
    EvidenceBundleResponse,
    MeReceiptQuery,
    PermitReceiptQuery,
    PermitReceiptsQuery,
    PortableReceiptResponse,
    ReceiptEvidenceResponse,
    ReceiptListQuery,
    ReceiptListResponse,
    ReceiptResponse,
    ReceiptVerifyRequest,
    ReceiptVerifyResponse,
    RefundReconciliationItem,
    RefundReconciliationListResponse,
    RefundReconciliationQuery,
    RefundReconciliationRetryResponse,
)

TAG = ["receipts"]


@page_schema("receipts_list", "List receipts visible to the caller", TAG, ReceiptListResponse, 401, 422)
class ReceiptListView(PageView):
    query, item = ReceiptListQuery, ReceiptResponse
    rows = staticmethod(selectors.receipt_list)


# The receipts of the permit in the URL (404 for a permit the caller may not see).
class PermitReceiptsPage(PageView):
    item = ReceiptResponse

    def rows(self, caller: Principal, params: dict[str, Any], permit_id: str) -> QuerySet[Any]:
        permit = permit_for_caller(caller, permit_id)
        return selectors.receipt_list(caller, {**params, "permit_id": permit.permit_id})


@page_schema("receipts_by_permit", "Receipts of one permit", TAG, ReceiptListResponse, 401, 404, 422)
class PermitReceiptListView(PermitReceiptsPage):
    query = PermitReceiptQuery


@page_schema("permits_receipts", "Receipts of one permit", ["permits"], ReceiptListResponse, 401, 404, 422)
class PermitReceiptsView(PermitReceiptsPage):
    query = PermitReceiptsQuery


@detail_schema("receipts_retrieve", "One receipt", TAG, 401, 404)
class ReceiptDetailView(DetailView):
    item = ReceiptResponse
    lookup = staticmethod(selectors.receipt_for_caller)


# The evidence bundle of the receipt in the URL, every check computed now.
class EvidenceView(DetailView):
    def lookup(self, caller: Principal, key: str) -> Any:
        return selectors.evidence_bundle(selectors.receipt_for_caller(caller, key))


@detail_schema("receipts_evidence", "Evidence of one receipt with every check computed now", TAG, 401, 404)
class ReceiptEvidenceView(EvidenceView):
    item = ReceiptEvidenceResponse


@detail_schema(
    "evidence_retrieve",
    "The evidence bundle: receipt, permit, ledger entry, audit event and verification map",
    ["evidence"],
    401,
    404,
)
class EvidenceBundleView(EvidenceView):
    item = EvidenceBundleResponse


class PortableReceiptView(APIView):
    @extend_schema(
        operation_id="receipts_portable",
        tags=TAG,
        responses={200: PortableReceiptResponse, **error_responses(401, 404)},
        summary="Export a receipt for offline verification against published keys",
    )
    def get(self, request: Request, receipt_id: str) -> Response:
        receipt = selectors.receipt_for_caller(principal(request), receipt_id)
        return Response(selectors.portable_receipt(receipt))


class ReceiptVerifyView(APIView):
    @extend_schema(
        operation_id="receipts_verify",
        tags=TAG,
        request=ReceiptVerifyRequest,
        responses={200: ReceiptVerifyResponse, **error_responses(401, 422)},
        summary="Verify a receipt by id or by its signed document",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        data = parse_body(request, ReceiptVerifyRequest)
        if data.get("receipt") is not None:
            statement, signature = data["receipt"], data["signature"]
        else:
            found = selectors.receipts_visible(caller).filter(receipt_id=data["receipt_id"]).first()
            if found is None:
                return Response(
                    {"valid": False, "reason": "unknown_receipt", "receipt_id": data["receipt_id"], "kid": None}
                )
            statement, signature = found.signed_statement, found.signature
        result = verify_statement(statement, signature, expected_type="receipt")
        valid, reason = result.valid, result.reason
        given_id = data.get("receipt_id")
        if valid and data.get("receipt") is not None and given_id not in (None, statement.get("receipt_id")):
            # An id given beside the document must be the one it signs, as the offline verifiers require.
            valid, reason = False, "receipt_id_differs_from_signed_bytes"
        # A document is only read here, so it may carry text that cannot be encoded: echoed as null.
        return Response(
            {
                "valid": valid,
                "reason": reason,
                "receipt_id": storable_text(statement.get("receipt_id")),
                "kid": storable_text(statement.get("kid")),
            }
        )


@page_schema("me_receipts", "Receipts of the caller's own wallet", ["me"], ReceiptListResponse, 401, 403, 422)
class MeReceiptsView(MePageView):
    query, item = MeReceiptQuery, ReceiptResponse

    def rows(self, caller: Principal, params: dict[str, Any]) -> QuerySet[Any]:
        return selectors.receipt_list(caller, {**params, "wallet_id": caller.wallet_id})


@page_schema(
    "receipts_refund_reconciliation_list",
    "Refunds owed (pending) or posted (resolved)",
    TAG,
    RefundReconciliationListResponse,
    401,
    422,
)
class RefundReconciliationListView(PageView):
    query, item = RefundReconciliationQuery, RefundReconciliationItem

    def rows(self, caller: Principal, params: dict[str, Any]) -> QuerySet[Any]:
        return selectors.reconciliation_visible(caller).filter(status=params["status"]).order_by("created_at", "id")


class RefundReconciliationRetryView(APIView):
    @extend_schema(
        operation_id="receipts_refund_reconciliation_retry",
        tags=TAG,
        request=None,
        responses={200: RefundReconciliationRetryResponse, **error_responses(401, 403, 404)},
        summary="Post an owed refund (operator key; at most once per receipt)",
    )
    def post(self, request: Request, receipt_id: str) -> Response:
        caller = principal(request)
        if not caller.is_operator:
            raise OperatorKeyRequired()
        item = services.refund_reconciliation_retry(receipt_id=receipt_id, actor=f"key:{caller.key_id}")
        return Response({"item": RefundReconciliationItem(item).data, "refunded": item.status == "resolved"})
