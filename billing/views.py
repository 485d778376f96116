"""Billing HTTP API: wallets, ledger, pricing, charge (spec "Billing"). API keys are access's (``access.views``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from access.authentication import principal
from access.generics import DetailView, PageView, detail_schema, page_schema
from access.ratelimit import DeferredRefused
from access.selectors import Principal
from billing import selectors, services
from billing.models import ServiceCategory
from billing.serializers import (
    ChargeQuery,
    ChargeResponse,
    CreateAgentWalletRequest,
    CreateSponsorWalletRequest,
    InsufficientFundsError,
    LedgerQuery,
    LedgerResponse,
    PricingTableResponse,
    WalletListQuery,
    WalletListResponse,
    WalletResponse,
    WalletSettingsRequest,
    WalletSettingsResponse,
)
from common.errors import OperatorKeyRequired
from common.idempotency import HEADER as IDEMPOTENCY_HEADER_NAME
from common.idempotency import HEADER_SCHEMA, validate_idempotency_key
from common.pagination import parse_body, parse_query
from common.schema import error_responses

BILLING = ["billing"]

IDEMPOTENCY_HEADER = OpenApiParameter(
    IDEMPOTENCY_HEADER_NAME,
    HEADER_SCHEMA,  # a raw schema: length and character rule
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "1 to 255 printable ASCII characters (no leading or trailing space), scoped by wallet. "
        "The same key with the same parameters replays the stored response "
        "(header Idempotent-Replayed: true) without a second debit; with other parameters "
        "it is 422 idempotency_key_reused. A refused charge does not use the key up."
    ),
)
INSUFFICIENT_FUNDS = OpenApiResponse(InsufficientFundsError, description="Insufficient credits.")


class SponsorWalletCreateView(APIView):
    @extend_schema(
        operation_id="billing_wallets_create_sponsor",
        tags=BILLING,
        request=CreateSponsorWalletRequest,
        responses={201: WalletResponse, **error_responses(401, 403, 422)},
        summary="Create a sponsor wallet, optionally provisioning credits (operator key only)",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        if not caller.is_operator:
            raise OperatorKeyRequired()
        data = parse_body(request, CreateSponsorWalletRequest)
        wallet = services.wallet_create_sponsor(**data, actor_key_id=caller.key_id)
        return Response(WalletResponse(selectors.wallet_detail(caller, wallet.wallet_id)).data, status=201)


class AgentWalletCreateView(APIView):
    @extend_schema(
        operation_id="billing_wallets_create_agent",
        tags=BILLING,
        request=CreateAgentWalletRequest,
        responses={201: WalletResponse, 402: INSUFFICIENT_FUNDS, **error_responses(401, 403, 404, 422)},
        summary="Create an agent (or child) wallet funded from its parent",
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        data = parse_body(request, CreateAgentWalletRequest)
        parent = selectors.wallet_for_caller(caller, data.pop("parent_wallet_id"))
        wallet = services.wallet_create_agent(parent=parent, **data, actor_key_id=caller.key_id)
        return Response(WalletResponse(selectors.wallet_detail(caller, wallet.wallet_id)).data, status=201)


@detail_schema("billing_wallets_get", "A wallet: balance, daily spend, status and controls", BILLING, 401, 403, 404)
class WalletDetailView(DetailView):
    item = WalletResponse
    lookup = staticmethod(selectors.wallet_detail)

    @extend_schema(
        operation_id="billing_wallets_update_settings",
        tags=BILLING,
        request=WalletSettingsRequest,
        responses={200: WalletSettingsResponse, **error_responses(401, 403, 404, 422)},
        summary="Change a wallet's name, budget, daily limit or auto-refill (extension)",
        description=(
            "An extension of the 1.3.0 API. Keys of a wallet above and operator keys may change a wallet's "
            "settings; a key may lower its own wallet's limits but never raise them (403 "
            "wallet_limit_raise_denied), nor set a wallet below it above its own budget or daily limit. "
            "A change applies from the next charge; a limit set under what was already spent in its window "
            "is kept and reported in notices. Audited as wallet.settings_changed with before and after."
        ),
        extensions={"x-tollgate-extension": True},
    )
    def patch(self, request: Request, wallet_id: str) -> Response:
        caller = principal(request)
        data = parse_body(request, WalletSettingsRequest)
        wallet = selectors.wallet_for_caller(caller, wallet_id)
        result = services.wallet_settings_change(wallet=wallet, changes=data, actor_key_id=caller.key_id)
        detail = selectors.wallet_detail(caller, wallet_id)
        detail.changes = result.changes  # type: ignore[attr-defined]
        detail.notices = result.notices  # type: ignore[attr-defined]
        return Response(WalletSettingsResponse(detail).data)


@page_schema(
    "billing_wallets_list",
    "Wallets visible to the caller (its own wallet and descendants; all for operators)",
    BILLING,
    WalletListResponse,
    401,
    422,
)
class WalletListView(PageView):
    query, item = WalletListQuery, WalletResponse

    def rows(self, caller: Principal, params: dict[str, Any]) -> QuerySet[Any]:
        return selectors.wallets_list(caller, wallet_type=params.get("wallet_type"))


class LedgerView(APIView):
    @extend_schema(
        operation_id="billing_ledger_list",
        tags=BILLING,
        parameters=[LedgerQuery],
        responses={200: LedgerResponse, **error_responses(401, 403, 404, 422)},
        summary="The newest ledger entries of a wallet",
    )
    def get(self, request: Request, wallet_id: str) -> Response:
        params = parse_query(request, LedgerQuery)
        wallet = selectors.wallet_for_caller(principal(request), wallet_id)
        entries = selectors.ledger_of_wallet(wallet)
        body = {
            "wallet_id": wallet.wallet_id,
            "balance": wallet.balance,
            "items": list(entries[: params["limit"]]),
            "total": entries.count(),
            "limit": params["limit"],
        }
        return Response(LedgerResponse(body).data)


class PricingView(APIView):
    @extend_schema(
        operation_id="billing_pricing",
        tags=BILLING,
        responses={200: PricingTableResponse, **error_responses(401)},
        summary="The price list: credits per unit of each service category and per call of each tool",
    )
    def get(self, request: Request) -> Response:
        principal(request)
        return Response(PricingTableResponse(selectors.pricing_table()).data)


# The Accept headers ChargeView answers with JSON without DRF's negotiation (billing.fastcharge takes only these).
PLAIN_ACCEPT = (None, "*/*", "application/json")


class ChargeView(APIView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[BaseRenderer, str]:
        """DRF's negotiation, answered directly in the usual case (no ``Accept`` or ``*/*`` or JSON, no ``format``).

        The answer is the one DRF gives there (the JSON renderer, ``application/json``); any other
        request is negotiated by DRF, which may refuse it (406, or 404 for an unknown ``format``).
        """
        if request.META.get("HTTP_ACCEPT") in PLAIN_ACCEPT and (
            self.settings.URL_FORMAT_OVERRIDE not in request.query_params
        ):
            renderer = self.get_renderers()[0]
            if renderer.media_type == "application/json":
                return renderer, renderer.media_type
        negotiated: tuple[BaseRenderer, str] = super().perform_content_negotiation(request, force)
        return negotiated

    @extend_schema(
        operation_id="billing_charge",
        tags=BILLING,
        parameters=[ChargeQuery, IDEMPOTENCY_HEADER],
        request=None,
        responses={
            200: ChargeResponse,
            402: INSUFFICIENT_FUNDS,
            **error_responses(401, 403, 404, 409, 422),
        },
        summary="Debit a wallet: price of the service category times units",
        description=(
            "Spend controls apply under the wallet's row lock: closed, frozen or expired wallets, the "
            "lifetime budget and the daily limit answer 403; a charge that would take spend above 1000 "
            "credits in an hour or 10000 in a day is refused with 403 wallet_frozen and freezes the wallet; "
            "an uncovered amount is 402."
        ),
    )
    def post(self, request: Request) -> Response:
        caller = principal(request)
        params = charge_query(request)
        key = validate_idempotency_key(request.headers.get(IDEMPOTENCY_HEADER_NAME), required=False)
        try:
            outcome = charge(request._request, caller, params, key)
        except DeferredRefused:
            return Response(status=429)
        response = Response(outcome.body, status=outcome.status)
        if outcome.replayed:
            response["Idempotent-Replayed"] = "true"
        return response


def charge(
    request: HttpRequest, caller: Principal, params: dict[str, Any], idempotency_key: str | None
) -> services.ChargeOutcome:
    """The charge of ``params`` (``charge_query``'s) for ``caller``: ``ChargeView``'s, and billing.fastcharge's.

    Raises ``DeferredRefused`` when the rate-limit charge deferred to the statement refuses it.
    """
    # The wallet's reach is checked in the charge's own statement (``caller``), and so is a key's rate limit
    # when the middleware deferred its charge (access.ratelimit); a refusal there is the middleware's to answer.
    return services.wallet_charge(
        wallet=params["wallet_id"],
        service_category=params["service_category"],
        units=params["units"],
        request_path=params["request_path"],
        description=params["description"],
        idempotency_key=idempotency_key,
        actor_key_id=caller.key_id,
        caller=caller,
        deferred=getattr(request, "_tollgate_rate", None),
    )


# Values ChargeQuery accepts unchanged: printable ASCII without surrounding spaces (nothing to trim,
# no NUL or surrogate), within the field's length; units with at most 12 + 8 digits (max_digits 20).
_ID = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,38}[\x21-\x7e])?")
_PATH = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e]{0,298}[\x21-\x7e])?)?")
_TEXT = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e]{0,498}[\x21-\x7e])?)?")
_UNITS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,8})?")
_CATEGORIES = frozenset(ServiceCategory.values)
_DEFAULT_UNITS = Decimal("1.0")  # ChargeQuery's default


def charge_query(request: Request) -> dict[str, Any]:
    """The charge's query parameters, as ``parse_query(request, ChargeQuery)`` returns them.

    Plain values (the usual request) are read by ``plain_charge_params``; anything else goes to
    ``ChargeQuery``, which decides and writes the 422.
    """
    return plain_charge_params(request.query_params) or parse_query(request, ChargeQuery)


def plain_charge_params(query: Mapping[str, str]) -> dict[str, Any] | None:
    """The charge's parameters from ``query`` (each name's last value) when every value is plain, else None.

    Plain values are read directly, which costs a few microseconds instead of a serializer; None
    for anything else (a value to trim, non-ASCII text, a malformed or zero ``units``, an unknown
    or conflicting category, a missing ``wallet_id``), which ``ChargeQuery`` then decides.
    """
    wallet_id, units = query.get("wallet_id"), query.get("units")
    category, alias = query.get("service_category"), query.get("service")
    request_path, description = query.get("request_path", ""), query.get("description", "")
    if (
        wallet_id is not None
        and _ID.fullmatch(wallet_id)
        and (category is None or category in _CATEGORIES)
        and (alias is None or alias in _CATEGORIES)
        and (category is None or alias is None or category == alias)
        and (units is None or _UNITS.fullmatch(units))
        and _PATH.fullmatch(request_path)
        and _TEXT.fullmatch(description)
    ):
        amount = _DEFAULT_UNITS if units is None else Decimal(units).quantize(services.CENT)
        if amount > 0:
            return {
                "wallet_id": wallet_id,
                "service_category": category or alias or ServiceCategory.OTHER,
                "units": amount,
                "request_path": request_path,
                "description": description,
            }
    return None
