"""Request and response records of the billing API (names follow the spec)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from rest_framework import serializers

from billing.models import APIKey, KeyRotationLog, ServiceCategory, WalletStatus, WalletType
from common.pagination import MAX_LIMIT, MAX_OFFSET, list_envelope


class NamedChoiceField(serializers.ChoiceField):
    """A choice field documented as a named enum component (``component``) in the schema."""

    def __init__(self, *, component: str, **kwargs: Any) -> None:
        self.component = component
        super().__init__(**kwargs)


class NamedChoiceFieldSchema(OpenApiSerializerFieldExtension):
    """Reference one named enum component instead of an inline enum.

    Several records have a ``status`` with different choice sets; inline enums of one
    name used in several components cannot be named unambiguously by the enum post-processing.
    """

    target_class = "billing.serializers.NamedChoiceField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> Any:
        field = self.target
        component = ResolvedComponent(
            name=field.component,
            type=ResolvedComponent.SCHEMA,
            object=field.component,
            schema={"type": "string", "enum": [str(choice) for choice in field.choices]},
        )
        auto_schema.registry.register_on_missing(component)
        return component.ref


class CreateAPIKeyRequest(serializers.Serializer):
    """Create a wallet-scoped API key."""

    wallet_id = serializers.CharField(max_length=40)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class APIKeyResponse(serializers.Serializer):
    """An API key as listed: the secret is masked."""

    key_id = serializers.CharField()
    wallet_id = serializers.CharField(allow_null=True)
    name = serializers.CharField()
    masked_key = serializers.CharField(source="masked")
    status = NamedChoiceField(component="APIKeyStatus", choices=["active", "revoked"])
    created_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True)
    revoke_reason = serializers.CharField()
    rotated_from = serializers.CharField()
    created_by_key_id = serializers.CharField(
        help_text="The key that minted this one (empty: the operator or the console). Revoking it revokes this key."
    )


class APIKeyWithSecret(APIKeyResponse):
    """A new API key with its secret. The secret is shown in this response only."""

    secret = serializers.CharField(help_text="The full API key. Shown once; store it now.")


APIKeyListResponse = list_envelope("APIKeyListResponse", APIKeyResponse)


class RotateAPIKeyRequest(serializers.Serializer):
    """Rotate a key: a successor is created; the old key is revoked unless ``revoke_old`` is false."""

    wallet_id = serializers.CharField(max_length=40)
    key_id = serializers.CharField(max_length=40)
    revoke_old = serializers.BooleanField(default=True)
    reason = serializers.CharField(max_length=200, required=False, default="rotation")


class RotationResponse(serializers.Serializer):
    """The result of a rotation; ``new_key.secret`` is shown once."""

    old_key_id = serializers.CharField()
    old_key_revoked = serializers.BooleanField()
    new_key = APIKeyWithSecret()


class EmergencyKeyRevocationRequest(serializers.Serializer):
    """Revoke every key of a wallet and of the wallets below it immediately, with the keys they minted."""

    wallet_id = serializers.CharField(max_length=40)
    reason = serializers.CharField(max_length=200, required=False, default="emergency")


class EmergencyKeyRevocationResponse(serializers.Serializer):
    """Which keys the emergency revocation revoked."""

    wallet_id = serializers.CharField()
    revoked_count = serializers.IntegerField()
    revoked_key_ids = serializers.ListField(child=serializers.CharField())
    reason = serializers.CharField()


class KeyRotationLogEntry(serializers.ModelSerializer):
    """One lifecycle event of a wallet's API keys."""

    wallet_id = serializers.CharField()

    class Meta:
        model = KeyRotationLog
        fields = ["wallet_id", "action", "key_id", "new_key_id", "reason", "actor_key_id", "created_at"]


class KeyLogQuery(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=200, default=50)


class RevokeQuery(serializers.Serializer):
    reason = serializers.CharField(max_length=200, default="user_request")


def api_key_data(key: APIKey, secret: str | None = None) -> dict[str, object]:
    data = dict(APIKeyResponse(key).data)
    if secret is not None:
        data["secret"] = secret
    return data


# --- Wallets, ledger, pricing, charge ------------------------------------------------------


class MoneyField(serializers.DecimalField):
    """A credit amount: a decimal with 8 places, serialized as a JSON string."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_digits=20, decimal_places=8, coerce_to_string=True, **kwargs)


class CreateSponsorWalletRequest(serializers.Serializer):
    """Create a sponsor wallet (a new tenant). Operator keys only."""

    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    initial_credits = MoneyField(
        min_value=Decimal(0), required=False, default=Decimal(0), help_text="Credits provisioned from mint."
    )
    daily_limit = MoneyField(min_value=Decimal(0), required=False, allow_null=True, default=None)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class CreateAgentWalletRequest(serializers.Serializer):
    """Create an agent wallet under a sponsor, or a child wallet under an agent, funded from the parent."""

    parent_wallet_id = serializers.CharField(max_length=40)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    initial_balance = MoneyField(
        min_value=Decimal(0),
        required=False,
        default=Decimal(0),
        help_text="Moved from the parent in the same transaction (402 when the parent cannot cover it).",
    )
    budget = MoneyField(
        min_value=Decimal(0), required=False, allow_null=True, default=None, help_text="Lifetime spend cap."
    )
    daily_limit = MoneyField(min_value=Decimal(0), required=False, allow_null=True, default=None)
    refill_threshold = MoneyField(min_value=Decimal(0), required=False, allow_null=True, default=None)
    refill_amount = MoneyField(min_value=Decimal("0.00000001"), required=False, allow_null=True, default=None)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if (attrs.get("refill_threshold") is None) != (attrs.get("refill_amount") is None):
            raise serializers.ValidationError(
                {"refill_amount": "Set both refill_threshold and refill_amount, or neither."}
            )
        return attrs


class WalletResponse(serializers.Serializer):
    """A wallet with its balance, spend figures and controls."""

    wallet_id = serializers.CharField()
    wallet_type = serializers.ChoiceField(choices=WalletType.choices)
    parent_wallet_id = serializers.CharField(source="parent_id", allow_null=True)
    tenant_id = serializers.CharField()
    name = serializers.CharField()
    status = NamedChoiceField(
        component="WalletStatus",
        choices=WalletStatus.choices,
        source="effective_status",
        help_text="An active wallet past its expiry reads as expired.",
    )
    frozen_reason = serializers.CharField()
    balance = MoneyField()
    daily_spent = MoneyField(
        help_text="Net spend (charges minus refunds) since 00:00 UTC; an agent's includes the wallets below it."
    )
    total_spent = MoneyField(
        help_text="Lifetime net spend; an agent's includes the wallets below it. The budget applies to it."
    )
    budget = MoneyField(allow_null=True)
    daily_limit = MoneyField(allow_null=True)
    refill_threshold = MoneyField(allow_null=True)
    refill_amount = MoneyField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


WalletListResponse = list_envelope("WalletListResponse", WalletResponse)


class WalletSettingsRequest(serializers.Serializer):
    """The settings to change (the others stay); null removes a limit or the auto-refill."""

    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    budget = MoneyField(min_value=Decimal(0), required=False, allow_null=True, help_text="Lifetime spend cap.")
    daily_limit = MoneyField(min_value=Decimal(0), required=False, allow_null=True)
    refill_threshold = MoneyField(min_value=Decimal(0), required=False, allow_null=True)
    refill_amount = MoneyField(min_value=Decimal("0.00000001"), required=False, allow_null=True)


class WalletSettingChange(serializers.Serializer):
    before = serializers.CharField(allow_null=True)
    after = serializers.CharField(allow_null=True)


class WalletSettingsResponse(WalletResponse):
    """The wallet after the change, what changed (before and after) and notices (a limit under what is spent)."""

    changes = serializers.DictField(child=WalletSettingChange())
    notices = serializers.ListField(child=serializers.CharField())


class WalletListQuery(serializers.Serializer):
    wallet_type = serializers.ChoiceField(choices=WalletType.choices, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, default=50)
    offset = serializers.IntegerField(min_value=0, max_value=MAX_OFFSET, default=0)


class LedgerQuery(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, default=50)


class LedgerEntryResponse(serializers.Serializer):
    """One ledger entry of a wallet: a signed amount (+ credit, - debit) and the balance after it."""

    entry_id = serializers.CharField()
    transaction_id = serializers.CharField()
    wallet_id = serializers.CharField(source="account")
    counterparty = serializers.CharField(help_text="The other account: a wallet id, mint or revenue.")
    kind = serializers.CharField()
    amount = MoneyField()
    balance_after = MoneyField(allow_null=True)
    service_category = serializers.CharField()
    units = MoneyField(allow_null=True)
    description = serializers.CharField()
    request_path = serializers.CharField()
    correlation_id = serializers.CharField()
    refund_of = serializers.CharField(source="refund_of_id", allow_null=True)
    created_at = serializers.DateTimeField()


class LedgerResponse(serializers.Serializer):
    """The newest entries of one wallet's ledger."""

    wallet_id = serializers.CharField()
    balance = MoneyField()
    items = LedgerEntryResponse(many=True)
    total = serializers.IntegerField()
    limit = serializers.IntegerField()


class CategoryPrice(serializers.Serializer):
    """Credits per unit of one service category."""

    service_category = serializers.ChoiceField(choices=ServiceCategory.choices)
    credits_per_unit = MoneyField()


class ToolPriceResponse(serializers.Serializer):
    """Credits per call of one tool; null when its price is not set."""

    tool = serializers.CharField()
    credits_per_call = MoneyField(allow_null=True)


class PricingTableResponse(serializers.Serializer):
    """The price list: per service category (charges) and per tool (gateway calls)."""

    unit = serializers.CharField()
    categories = CategoryPrice(many=True)
    tools = ToolPriceResponse(many=True)


class ChargeQuery(serializers.Serializer):
    """Query parameters of POST /v1/billing/charge."""

    wallet_id = serializers.CharField(max_length=40)
    service_category = serializers.ChoiceField(choices=ServiceCategory.choices, required=False)
    service = serializers.ChoiceField(
        choices=ServiceCategory.choices, required=False, help_text="Alias of service_category."
    )
    units = serializers.DecimalField(
        max_digits=20,
        decimal_places=8,
        coerce_to_string=False,
        default=Decimal("1.0"),
        min_value=Decimal("0.00000001"),
        help_text="Greater than 0; up to 8 decimal places.",
    )
    request_path = serializers.CharField(max_length=300, required=False, default="", allow_blank=True)
    description = serializers.CharField(max_length=500, required=False, default="", allow_blank=True)

    def validate_units(self, value: Decimal) -> Decimal:
        if value <= 0:
            raise serializers.ValidationError("Ensure this value is greater than 0.", code="greater_than")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        category, alias = attrs.get("service_category"), attrs.pop("service", None)
        if category is not None and alias is not None and category != alias:
            raise serializers.ValidationError({"service": "service is an alias of service_category; they differ."})
        attrs["service_category"] = category or alias or ServiceCategory.OTHER
        return attrs


class RefillInfo(serializers.Serializer):
    """An automatic refill posted before the charge."""

    entry_id = serializers.CharField()
    amount = MoneyField()
    parent_wallet_id = serializers.CharField()


class ChargeResponse(serializers.Serializer):
    """A posted charge: the ledger entry, the price and the wallet's figures after it."""

    entry_id = serializers.CharField(help_text="The wallet's ledger entry for this charge.")
    transaction_id = serializers.CharField()
    wallet_id = serializers.CharField()
    service_category = serializers.ChoiceField(choices=ServiceCategory.choices)
    units = MoneyField()
    unit_price = MoneyField()
    amount = MoneyField(help_text="Credits charged.")
    balance = MoneyField(help_text="The wallet's balance after the charge.")
    daily_spent = MoneyField()
    refill = RefillInfo(allow_null=True)
    description = serializers.CharField()
    request_path = serializers.CharField()
    correlation_id = serializers.CharField()
    idempotency_key = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


class InsufficientFundsResponse(serializers.Serializer):
    """402: the wallet cannot cover the amount. Decimals are strings."""

    error = serializers.CharField()
    message = serializers.CharField()
    wallet_id = serializers.CharField()
    balance = MoneyField()
    required = MoneyField()  # type: ignore[assignment]  # a field named like Field.required
    shortfall = MoneyField()


class InsufficientFundsError(serializers.Serializer):
    """402 body: the InsufficientFundsResponse fields inside ``detail``."""

    detail = InsufficientFundsResponse()


# Written as ChargeResponse writes them (unbound fields, so a template costs no serializer copy).
_MONEY = MoneyField()
_DATETIME = serializers.DateTimeField()
_CHARGE_ORDER = tuple(ChargeResponse().fields)
_REFILL_ORDER = tuple(RefillInfo().fields)


def charge_response_template(
    *,
    entry_id: str,
    transaction_id: str,
    wallet_id: str,
    service_category: str,
    units: Decimal,
    description: str,
    request_path: str,
    correlation_id: str,
    idempotency_key: str | None,
    created_at: datetime,
) -> dict[str, Any]:
    """The fields of a ChargeResponse known before the debit, each as ChargeResponse writes it.

    The database function ``billing_charge`` adds ``unit_price``, ``amount``, ``balance``,
    ``daily_spent`` and ``refill`` once the debit is known, stores the whole body for replay and
    returns it; tests/test_billing_charge_fn.py checks that body against ``ChargeResponse``.
    """
    return {
        "entry_id": entry_id,
        "transaction_id": transaction_id,
        "wallet_id": wallet_id,
        "service_category": service_category,
        "units": _MONEY.to_representation(units),
        "description": description,
        "request_path": request_path,
        "correlation_id": correlation_id,
        "idempotency_key": idempotency_key,
        "created_at": _DATETIME.to_representation(created_at),
    }


def charge_response_in_order(body: dict[str, Any]) -> dict[str, Any]:
    """A stored charge body with its keys in ChargeResponse's order (jsonb keeps keys in an order of its own).

    Keys the record does not name (none today) follow, as stored.
    """
    ordered = {name: body[name] for name in _CHARGE_ORDER if name in body}
    refill = ordered.get("refill")
    if isinstance(refill, dict):
        ordered["refill"] = {name: refill[name] for name in _REFILL_ORDER if name in refill}
        ordered["refill"].update((name, value) for name, value in refill.items() if name not in _REFILL_ORDER)
    ordered.update((name, value) for name, value in body.items() if name not in ordered)
    return ordered
