"""Test factories. Wallets and balances are made through the billing services, so every
balance has its ledger entries and audit events."""

from __future__ import annotations

from decimal import Decimal

from billing import services
from billing.models import Wallet, WalletType


def make_sponsor(name: str = "sponsor", balance: Decimal | int = 0, **controls: object) -> Wallet:
    """A sponsor wallet with ``balance`` credits provisioned from mint."""
    return services.wallet_create_sponsor(name=name, initial_credits=Decimal(balance), **controls)  # type: ignore[arg-type]


def make_wallet(parent: Wallet, name: str = "agent", balance: Decimal | int = 0, **controls: object) -> Wallet:
    """An agent (under a sponsor) or child (under an agent) wallet funded with ``balance`` from ``parent``.

    When the parent cannot cover it, the shortfall is provisioned to the sponsor and funded down first.
    """
    amount = Decimal(balance)
    parent.refresh_from_db()
    if parent.balance < amount:
        top_up(parent, amount - parent.balance)
    wallet = services.wallet_create_agent(parent=parent, name=name, initial_balance=amount, **controls)  # type: ignore[arg-type]
    parent.refresh_from_db()
    return wallet


def top_up(wallet: Wallet, amount: Decimal | int) -> None:
    """Make sure ``wallet`` holds at least ``amount`` more than it does, funding down from the sponsor."""
    amount = Decimal(amount)
    if wallet.wallet_type == WalletType.SPONSOR:
        services.wallet_provision(wallet=wallet, amount=amount)
        return
    assert wallet.parent is not None
    top_up(wallet.parent, amount)
    services.wallet_fund(source=wallet.parent, target=wallet, amount=amount)


def make_key(wallet: Wallet, name: str = "") -> services.IssuedKey:
    return services.api_key_create(wallet=wallet, name=name)


def make_operator_key() -> services.IssuedKey:
    return services.operator_key_create(name="test operator")
