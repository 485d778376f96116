"""Authority HTTP API: permits, permit requests, quotes, policy bundles and /v1/me views."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponse
from django.template.loader import render_to_string
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from access.authentication import principal, wallet_principal
from access.generics import DetailView, MePageView, PageView, detail_schema, page_schema
from access.selectors import Principal
from audit.signing import verify_statement
from billing.exceptions import money
from billing.models import Wallet, WalletStatus
from billing.selectors import caller_wallet, wallet_for_caller, wallet_spend
from common.errors import NotFound
from common.idempotency import HEADER_SCHEMA, idempotency_scope, request_hash, validate_idempotency_key
from common.jsonbody import storable_text
from common.pagination import parse_body
from common.schema import error_responses
from permits import selectors, services
from permits.models import PermitStatus
from permits.serializers import (
    AuthoritySummaryResponse,
    MePermitListQuery,
    PermitCreateRequest,
    PermitListQuery,
    PermitListResponse,
    PermitRequestCreate,
    PermitRequestListQuery,
    PermitRequestListResponse,
    PermitRequestResponse,
    PermitResponse,
    PermitVerifyRequest,
    PermitVerifyResponse,
    PolicyBundleCreate,
    PolicyBundleListResponse,
    PolicyBundlePatch,
    PolicyBundleResponse,
    PolicyChangeProposalResponse,
    PolicyListQuery,
    QuoteCreateRequest,
    QuoteListQuery,
    QuoteListResponse,
    QuoteResponse,
)

IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key",
    HEADER_SCHEMA,  # a raw schema: length and character rule
    OpenApiParameter.HEADER,
    required=True,
    description="1 to 255 printable characters; the same key and body replay the first response.",
)


def _money(value: Any) -> str:
    return money(value)


def _normalized(data: dict[str, Any]) -> dict[str, Any]:
    """The validated request as canonical-JSON-safe values, for the idempotency hash."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if hasattr(value, "quantize"):
            out[key] = _money(value)
        elif isinstance(value, list):
            out[key] = sorted(set(value))
        else:
            out[key] = value
    return out


def _idempotent_create(
    request: Request, serializer_class: type[serializers.Serializer]
) -> tuple[Principal, dict[str, Any], dict[str, Any]]:
    """The caller, the validated body and the idempotency arguments of a create: the ``Idempotency-Key``
    (required, and checked before the body), scoped to the caller's key, with the hash of the body."""
    caller = principal(request)
    key = validate_idempotency_key(request.headers.get("Idempotency-Key"), required=True)
    assert key is not None
    data = parse_body(request, serializer_class)
    idempotency = {
        "idempotency_scope": idempotency_scope(wallet_id=caller.wallet_id, key_id=caller.key_id),
        "idempotency_key": key,
        "request_hash": request_hash(_normalized(data)),
    }
    return caller, data, idempotency


def _created(body: Any, code: int, *, replayed: bool, headers: dict[str, str] | None = None) -> Response:
    """The answer of a create, marked ``Idempotent-Replayed`` when it replays the first one."""
    response = Response(body, status=code, headers=headers)
    if replayed:
        response["Idempotent-Replayed"] = "true"
    return response


class WalletNotFound(NotFound):
    code = "wallet_not_found"
    message = "The key's wallet no longer exists."


# --- Permits -------------------------------------------------------------------------


@page_schema("permits_list", "List permits visible to the caller", ["permits"], PermitListResponse, 401, 422)
class PermitCollectionView(PageView):
    query, item = PermitListQuery, PermitResponse
    rows = staticmethod(selectors.permit_list)

    @extend_schema(
        operation_id="permits_create",
        tags=["permits"],
        parameters=[IDEMPOTENCY_HEADER],
        request=PermitCreateRequest,
        responses={201: PermitResponse, **error_responses(401, 403, 404, 422)},
        summary="Issue a signed permit (issuer: the caller's wallet, the subject or above it)",
    )
    def post(self, request: Request) -> Response:
        caller, data, idempotency = _idempotent_create(request, PermitCreateRequest)
        subject = wallet_for_caller(caller, data["wallet_id"])
        issuer = None if caller.is_operator else caller_wallet(caller)
        result = services.permit_issue(
            terms=services.PermitTerms(
                wallet=subject,
                issuer_wallet=issuer,
                issued_by_key_id=caller.key_id,
                allowed_tools=data["allowed_tools"],
                max_credits=data["max_credits"],
                max_calls=data["max_calls"],
                expires_at=timezone.now() + timedelta(seconds=data["expires_in_seconds"]),
                subject_key_id=data["subject_key_id"],
                allowed_servers=data.get("allowed_servers"),
            ),
            **idempotency,
        )
        return _created(PermitResponse(result.permit).data, status.HTTP_201_CREATED, replayed=result.replayed)


@detail_schema("permits_retrieve", "One permit", ["permits"], 401, 404)
class PermitDetailView(DetailView):
    item = PermitResponse
    lookup = staticmethod(selectors.permit_for_caller)


class PermitRevokeView(APIView):
    @extend_schema(
        operation_id="permits_revoke",
        tags=["permits"],
        request=None,
        responses={200: PermitResponse, **error_responses(401, 404)},
        summary="Revoke a permit (the response is the permit)",
    )
    def post(self, request: Request, permit_id: str) -> Response:
        caller = principal(request)
        permit = selectors.permit_for_caller(caller, permit_id)
        permit = services.permit_revoke(permit_id=permit.permit_id, reason="revoked_by_api", actor_key_id=caller.key_id)
        return Response(PermitResponse(permit).data)


class PermitVerifyView(APIView):
    @extend_schema(
        operation_id="permits_verify",
        tags=["permits"],
        request=PermitVerifyRequest,
        responses={200: PermitVerifyResponse, **error_responses(401, 422)},
        summary="Verify a permit by id or by its full signed document",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        data = parse_body(request, PermitVerifyRequest)
        now = timezone.now()
        reasons: list[str] = []
        if data.get("permit") is not None:
            statement, signature = data["permit"], data["signature"]
            # Only read, so it may hold text no permit id can be (NUL, a lone surrogate): then no id at all.
            permit_id = storable_text(statement.get("permit_id"))
        else:
            permit_id = data["permit_id"]
            found = selectors.permits_visible(caller).filter(permit_id=permit_id).first()
            if found is None:
                body = {
                    "valid": False,
                    "permit_id": permit_id,
                    "status": None,
                    "signature_valid": False,
                    "key_id": None,
                    "reasons": ["unknown_permit"],
                }
                return Response(body)
            statement, signature = found.signed_statement, found.signature
        result = verify_statement(statement, signature, expected_type="permit")
        if not result.valid:
            reasons.append("unknown_key" if result.reason in ("unknown_kid", "missing_kid") else "bad_signature")
        permit = selectors.permits_visible(caller).filter(permit_id=permit_id).first() if permit_id else None
        current_status = None
        if permit is None:
            reasons.append("unknown_permit")
        else:
            problem = services.permit_statement_problem(permit) if result.valid else None
            if result.valid and "bad_signature" not in reasons and permit.signed_statement != statement:
                # A validly signed document that is not this permit's statement.
                reasons.append("bad_signature")
            elif problem is not None:
                # Stored columns that disagree with the statement, or an approval it names that does not
                # hold (docs/decisions.md, Authority, "Approvals are signed"): refused at use.
                reasons.append("approval_invalid" if problem.startswith("approval_") else "bad_signature")
            current_status = permit.effective_status(now)
            if current_status in (PermitStatus.EXPIRED, PermitStatus.REVOKED, PermitStatus.EXHAUSTED):
                reasons.append(current_status)
        body = {
            "valid": not reasons,
            "permit_id": permit_id,
            "status": current_status,
            "signature_valid": result.valid,
            "key_id": storable_text(statement.get("kid")) if isinstance(statement, dict) else None,
            "reasons": reasons,
        }
        return Response(body)


# --- Permit requests -----------------------------------------------------------------


class CardRenderer(BaseRenderer):
    media_type = "text/html"
    format = "html"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return data.encode() if isinstance(data, str) else b""


class PermitRequestCreateView(APIView):
    @extend_schema(
        operation_id="permit_requests_create",
        tags=["permits"],
        parameters=[IDEMPOTENCY_HEADER],
        request=PermitRequestCreate,
        responses={202: PermitRequestResponse, **error_responses(401, 403, 409, 422)},
        summary="Ask a human for a permit; poll the returned URL for the decision",
    )
    def post(self, request: Request) -> Response:
        caller, data, idempotency = _idempotent_create(request, PermitRequestCreate)
        wallet = wallet_for_caller(caller, data["wallet_id"])
        result = services.permit_request_create(
            wallet=wallet,
            requested_by_key_id=caller.key_id,
            allowed_tools=data["allowed_tools"],
            max_credits=data["max_credits"],
            max_calls=data["max_calls"],
            permit_ttl_seconds=data["expires_in_seconds"],
            subject_key_id=data["subject_key_id"],
            justification=data["justification"],
            allowed_servers=data.get("allowed_servers"),
            **idempotency,
        )
        body = PermitRequestResponse(result.permit_request).data
        return _created(
            body, status.HTTP_202_ACCEPTED, replayed=result.replayed, headers={"Location": body["poll_url"]}
        )


@detail_schema(
    "permit_requests_retrieve", "Poll a permit request; includes the minted permit once approved", ["permits"], 401, 404
)
class PermitRequestDetailView(DetailView):
    item = PermitRequestResponse
    lookup = staticmethod(selectors.permit_request_for_caller)


class PermitRequestCardView(APIView):
    renderer_classes = [CardRenderer, JSONRenderer]

    @extend_schema(
        operation_id="permit_requests_card",
        tags=["permits"],
        responses={
            (200, "text/html"): OpenApiResponse(OpenApiTypes.STR, description="Read-only approver card."),
            **error_responses(401, 404),
        },
        summary="The read-only HTML card of a permit request (same as the approver's notification)",
    )
    def get(self, request: Request, request_id: str) -> HttpResponse:
        preq = selectors.permit_request_for_caller(principal(request), request_id)
        card = selectors.permit_request_card_context(preq, approval_url=services.approval_url(preq.request_id))
        html = render_to_string("permits/card_page.html", {**card, "show_decide_link": True}, request=request._request)
        return HttpResponse(html, content_type="text/html; charset=utf-8")

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(response, Response) and response.status_code >= 400:
            # Errors are JSON like everywhere else, whatever the Accept header asked for.
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)


# --- Quotes --------------------------------------------------------------------------


class QuoteCreateView(APIView):
    @extend_schema(
        operation_id="quotes_create",
        tags=["permits"],
        request=QuoteCreateRequest,
        responses={201: QuoteResponse, **error_responses(401, 403, 422)},
        summary="Quote one call of a tool for a wallet (free; no side effect on the wallet)",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        data = parse_body(request, QuoteCreateRequest)
        wallet = wallet_for_caller(caller, data["wallet_id"])
        quote = services.quote_create(wallet=wallet, tool=data["tool"], requested_by_key_id=caller.key_id)
        return Response(QuoteResponse(quote).data, status=status.HTTP_201_CREATED)


@detail_schema("quotes_retrieve", "One quote", ["permits"], 401, 404)
class QuoteDetailView(DetailView):
    item = QuoteResponse
    lookup = staticmethod(selectors.quote_for_caller)


# --- Policy bundles ------------------------------------------------------------------


@page_schema("policies_list", "List policy bundles", ["policies"], PolicyBundleListResponse, 401, 422)
class PolicyCollectionView(PageView):
    query, item = PolicyListQuery, PolicyBundleResponse

    def rows(self, caller: Principal, params: dict[str, Any]) -> QuerySet[Any]:
        qs = selectors.policies_visible(caller)
        if params.get("wallet_id"):
            qs = qs.filter(wallet_id=params["wallet_id"])
        return qs.order_by("-created_at", "policy_id")

    @extend_schema(
        operation_id="policies_create",
        tags=["policies"],
        request=PolicyBundleCreate,
        responses={201: PolicyBundleResponse, **error_responses(401, 403, 404, 422)},
        summary="Create a policy bundle for a wallet and the wallets below it",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        data = parse_body(request, PolicyBundleCreate)
        wallet = wallet_for_caller(caller, data.pop("wallet_id"))
        policy = services.policy_create(
            wallet=wallet, actor_key_id=caller.key_id, actor_wallet_id=caller.wallet_id or "", **data
        )
        return Response(PolicyBundleResponse(policy).data, status=status.HTTP_201_CREATED)


@detail_schema("policies_retrieve", "One policy bundle", ["policies"], 401, 404)
class PolicyDetailView(DetailView):
    item = PolicyBundleResponse
    lookup = staticmethod(selectors.policy_for_caller)

    @extend_schema(
        operation_id="policies_partial_update",
        tags=["policies"],
        request=PolicyBundlePatch,
        responses={
            200: PolicyBundleResponse,
            202: OpenApiResponse(
                PolicyChangeProposalResponse,
                description=(
                    "The change relaxes human approval (turns human_approval_required off or disables a policy "
                    "requiring it): nothing changed; it is recorded as a proposal that a second person confirms "
                    "in the operator console before it expires. The whole change waits, tightening rules included."
                ),
            ),
            **error_responses(401, 403, 404, 422),
        },
        summary="Change some rules of a policy bundle (relaxing human approval: 202, a proposal)",
    )
    def patch(self, request: Request, policy_id: str) -> Response:
        caller = principal(request)
        policy = selectors.policy_for_change(caller, policy_id)
        data = parse_body(request, PolicyBundlePatch)
        result = services.policy_change(
            policy_id=policy.policy_id, actor_key_id=caller.key_id, actor_wallet_id=caller.wallet_id or "", **data
        )
        if result.proposal is not None:
            return Response(PolicyChangeProposalResponse(result.proposal).data, status=status.HTTP_202_ACCEPTED)
        return Response(PolicyBundleResponse(result.policy).data)


# --- /v1/me --------------------------------------------------------------------------


class MeAuthorityView(APIView):
    @extend_schema(
        operation_id="me_authority",
        tags=["me"],
        responses={200: AuthoritySummaryResponse, **error_responses(401, 403, 404)},
        summary="Policies, active permits, approval requirement, pending requests, balance and daily spend",
    )
    def get(self, request: Request) -> Response:
        caller = wallet_principal(request)
        wallet = Wallet.objects.filter(wallet_id=caller.wallet_id).first()
        if wallet is None or wallet.status == WalletStatus.CLOSED:
            raise WalletNotFound(wallet_id=caller.wallet_id)
        now = timezone.now()
        permits = selectors.permit_status_filter(
            selectors.permits_visible(caller).filter(wallet=wallet), PermitStatus.ACTIVE, now
        ).order_by("-created_at")[:200]
        pending = selectors.lapsing_status_filter(
            selectors.permit_requests_visible(caller).filter(wallet=wallet), "pending", now
        ).order_by("-created_at")[:200]
        policies = list(selectors.policies_shown_to_wallet(wallet))
        body = {
            "wallet_id": wallet.wallet_id,
            "wallet_type": wallet.wallet_type,
            "wallet_status": wallet.status,
            "balance": _money(wallet.balance),
            "daily_spend": _money(wallet_spend(wallet, now=now).today),
            "human_approval_required": any(p.enabled and p.human_approval_required for p in policies),
            "policies": PolicyBundleResponse(policies, many=True).data,
            "active_permits": PermitResponse(permits, many=True).data,
            "pending_permit_requests": PermitRequestResponse(pending, many=True).data,
        }
        return Response(body)


@page_schema("me_permits", "Permits of the caller's own wallet", ["me"], PermitListResponse, 401, 403, 422)
class MePermitsView(MePageView):
    query, item = MePermitListQuery, PermitResponse

    def rows(self, caller: Principal, params: dict[str, Any]) -> QuerySet[Any]:
        return selectors.permit_list(caller, params).filter(wallet_id=caller.wallet_id)


def _own_by_status(visible: QuerySet[Any], caller: Principal, params: dict[str, Any]) -> QuerySet[Any]:
    """``visible`` narrowed to the caller's own wallet and to the ``status`` asked for (a lapsed row reads as
    lapsed now, whatever its stored status says)."""
    own = visible.filter(wallet_id=caller.wallet_id)
    return selectors.lapsing_status_filter(own, params["status"], timezone.now()) if params.get("status") else own


@page_schema(
    "me_permit_requests",
    "Permit requests of the caller's own wallet (listing never advances a decision)",
    ["me"],
    PermitRequestListResponse,
    401,
    403,
    422,
)
class MePermitRequestsView(MePageView):
    query, item = PermitRequestListQuery, PermitRequestResponse

    def rows(self, caller: Principal, params: dict[str, Any]) -> QuerySet[Any]:
        return _own_by_status(selectors.permit_requests_visible(caller), caller, params).order_by(
            "-created_at", "request_id"
        )


@page_schema(
    "me_quotes",
    "Quotes of the caller's own wallet (status=active for spendable ones)",
    ["me"],
    QuoteListResponse,
    401,
    403,
    422,
)
class MeQuotesView(MePageView):
    query, item = QuoteListQuery, QuoteResponse

    def rows(self, caller: Principal, params: dict[str, Any]) -> QuerySet[Any]:
        qs = _own_by_status(selectors.quotes_visible(caller), caller, params)
        if params.get("tool"):
            qs = qs.filter(tool=params["tool"])
        return qs.order_by("-created_at", "quote_id")
