"""Receipts and evidence HTTP API (spec "Receipts and evidence")."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.signing import verify_statement
from billing.authentication import principal, wallet_principal
from common.errors import OperatorKeyRequired
from common.jsonbody import storable_text
from common.pagination import page, parse_body, parse_query
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


class ReceiptListView(APIView):
    @extend_schema(
        operation_id="receipts_list",
        tags=TAG,
        parameters=[ReceiptListQuery],
        responses={200: ReceiptListResponse, **error_responses(401, 422)},
        summary="List receipts visible to the caller",
    )
    def get(self, request: Request) -> Response:
        caller = principal(request)
        params = parse_query(request, ReceiptListQuery)
        return Response(page(selectors.receipt_list(caller, params), params, ReceiptResponse))


class PermitReceiptListView(APIView):
    @extend_schema(
        operation_id="receipts_by_permit",
        tags=TAG,
        parameters=[PermitReceiptQuery],
        responses={200: ReceiptListResponse, **error_responses(401, 404, 422)},
        summary="Receipts of one permit",
    )
    def get(self, request: Request, permit_id: str) -> Response:
        caller = principal(request)
        params = parse_query(request, PermitReceiptQuery)
        permit = permit_for_caller(caller, permit_id)
        qs = selectors.receipt_list(caller, {**params, "permit_id": permit.permit_id})
        return Response(page(qs, params, ReceiptResponse))


class PermitReceiptsView(APIView):
    @extend_schema(
        operation_id="permits_receipts",
        tags=["permits"],
        parameters=[PermitReceiptsQuery],
        responses={200: ReceiptListResponse, **error_responses(401, 404, 422)},
        summary="Receipts of one permit",
    )
    def get(self, request: Request, permit_id: str) -> Response:
        caller = principal(request)
        params = parse_query(request, PermitReceiptsQuery)
        permit = permit_for_caller(caller, permit_id)
        qs = selectors.receipt_list(caller, {**params, "permit_id": permit.permit_id})
        return Response(page(qs, params, ReceiptResponse))


class ReceiptDetailView(APIView):
    @extend_schema(
        operation_id="receipts_retrieve",
        tags=TAG,
        responses={200: ReceiptResponse, **error_responses(401, 404)},
        summary="One receipt",
    )
    def get(self, request: Request, receipt_id: str) -> Response:
        return Response(ReceiptResponse(selectors.receipt_for_caller(principal(request), receipt_id)).data)


class ReceiptEvidenceView(APIView):
    @extend_schema(
        operation_id="receipts_evidence",
        tags=TAG,
        responses={200: ReceiptEvidenceResponse, **error_responses(401, 404)},
        summary="Evidence of one receipt with every check computed now",
    )
    def get(self, request: Request, receipt_id: str) -> Response:
        receipt = selectors.receipt_for_caller(principal(request), receipt_id)
        return Response(ReceiptEvidenceResponse(selectors.evidence_bundle(receipt)).data)


class EvidenceBundleView(APIView):
    @extend_schema(
        operation_id="evidence_retrieve",
        tags=["evidence"],
        responses={200: EvidenceBundleResponse, **error_responses(401, 404)},
        summary="The evidence bundle: receipt, permit, ledger entry, audit event and verification map",
    )
    def get(self, request: Request, receipt_id: str) -> Response:
        receipt = selectors.receipt_for_caller(principal(request), receipt_id)
        return Response(EvidenceBundleResponse(selectors.evidence_bundle(receipt)).data)


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


class MeReceiptsView(APIView):
    @extend_schema(
        operation_id="me_receipts",
        tags=["me"],
        parameters=[MeReceiptQuery],
        responses={200: ReceiptListResponse, **error_responses(401, 403, 422)},
        summary="Receipts of the caller's own wallet",
    )
    def get(self, request: Request) -> Response:
        caller = wallet_principal(request)
        params = parse_query(request, MeReceiptQuery)
        qs = selectors.receipt_list(caller, {**params, "wallet_id": caller.wallet_id})
        return Response(page(qs, params, ReceiptResponse))


class RefundReconciliationListView(APIView):
    @extend_schema(
        operation_id="receipts_refund_reconciliation_list",
        tags=TAG,
        parameters=[RefundReconciliationQuery],
        responses={200: RefundReconciliationListResponse, **error_responses(401, 422)},
        summary="Refunds owed (pending) or posted (resolved)",
    )
    def get(self, request: Request) -> Response:
        caller = principal(request)
        params = parse_query(request, RefundReconciliationQuery)
        qs = selectors.reconciliation_visible(caller).filter(status=params["status"]).order_by("created_at", "id")
        return Response(page(qs, params, RefundReconciliationItem))


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
