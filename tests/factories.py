"""Test factories. Wallets are created through the model until the wallet services exist."""

from __future__ import annotations

from decimal import Decimal

from billing import services
from billing.models import Wallet, WalletType
from config.ids import new_id


def make_sponsor(name: str = "sponsor", balance: Decimal | int = 0) -> Wallet:
    wallet_id = new_id("spn")
    return Wallet.objects.create(
        wallet_id=wallet_id,
        tenant_id=wallet_id,
        path=wallet_id,
        wallet_type=WalletType.SPONSOR,
        name=name,
        balance=Decimal(balance),
    )


def make_wallet(parent: Wallet, name: str = "agent", balance: Decimal | int = 0) -> Wallet:
    wallet_type = WalletType.AGENT if parent.wallet_type == WalletType.SPONSOR else WalletType.CHILD
    wallet_id = new_id("agt" if wallet_type == WalletType.AGENT else "chd")
    return Wallet.objects.create(
        wallet_id=wallet_id,
        tenant_id=parent.tenant_id,
        parent=parent,
        path=f"{parent.path}/{wallet_id}",
        wallet_type=wallet_type,
        name=name,
        balance=Decimal(balance),
    )


def make_key(wallet: Wallet, name: str = "") -> services.IssuedKey:
    return services.api_key_create(wallet=wallet, name=name)


def make_operator_key() -> services.IssuedKey:
    return services.operator_key_create(name="test operator")
