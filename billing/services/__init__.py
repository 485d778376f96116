"""Billing writes: API keys, wallets, the double-entry ledger, charges and prices.

One module per entity: ``api_keys``, ``ledger`` (the building blocks every movement of money goes
through, and the spend controls), ``wallets``, ``charge`` (POST /v1/billing/charge) and ``prices``.
This package names their public services, so callers import from ``billing.services``.

Every public service owns its transaction (``@transaction.atomic(durable=True)``)
and writes its audit events inside it, as the last statements. The exceptions
are the building blocks ``ledger_debit`` and ``ledger_refund``, which run
inside a transaction the caller holds, and ``debit_call`` (the arguments of the
database function ``billing_debit``, which the tool gateway's ``gateway_claim``
runs inside its phase-1 transaction).

Lock order. Wallet row locks are always taken ancestor first: a parent before
its child (funding, auto-refill, closing), the agent ancestors of a charged or
refunded wallet before the wallet (their spend windows change with it), and the
audit chain head last. Two transactions therefore never wait on each other in a
cycle.
"""

from billing.services.api_keys import (
    IssuedKey,
    api_key_create,
    api_key_emergency_revoke,
    api_key_revoke,
    api_key_rotate,
    operator_key_create,
    operator_key_revoke,
)
from billing.services.charge import ChargeOutcome, charge_call, wallet_charge
from billing.services.ledger import (
    CENT,
    DEBIT_COLUMNS,
    VELOCITY_DAY_LIMIT,
    VELOCITY_HOUR_LIMIT,
    DebitCall,
    DebitResult,
    debit_call,
    ledger_audit,
    ledger_debit,
    ledger_event_detail,
    ledger_refund,
    refusal_for_viewer,
    to_money,
    wallet_check_may_spend,
)
from billing.services.prices import category_price_set, tool_price_remove, tool_price_set
from billing.services.wallets import (
    WALLET_SETTINGS,
    WalletSettingsChange,
    wallet_close,
    wallet_create_agent,
    wallet_create_sponsor,
    wallet_freeze,
    wallet_freeze_for_velocity,
    wallet_fund,
    wallet_provision,
    wallet_refund,
    wallet_settings_change,
    wallet_unfreeze,
)

__all__ = [
    "CENT",
    "DEBIT_COLUMNS",
    "VELOCITY_DAY_LIMIT",
    "VELOCITY_HOUR_LIMIT",
    "WALLET_SETTINGS",
    "ChargeOutcome",
    "DebitCall",
    "DebitResult",
    "IssuedKey",
    "WalletSettingsChange",
    "api_key_create",
    "api_key_emergency_revoke",
    "api_key_revoke",
    "api_key_rotate",
    "category_price_set",
    "charge_call",
    "debit_call",
    "ledger_audit",
    "ledger_debit",
    "ledger_event_detail",
    "ledger_refund",
    "operator_key_create",
    "operator_key_revoke",
    "refusal_for_viewer",
    "to_money",
    "tool_price_remove",
    "tool_price_set",
    "wallet_charge",
    "wallet_check_may_spend",
    "wallet_close",
    "wallet_create_agent",
    "wallet_create_sponsor",
    "wallet_freeze",
    "wallet_freeze_for_velocity",
    "wallet_fund",
    "wallet_provision",
    "wallet_refund",
    "wallet_settings_change",
    "wallet_unfreeze",
]
