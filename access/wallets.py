"""What access reads of wallets, which billing owns: billing, above access, registers a
``WalletDirectory`` at start-up (``billing.apps``), as a higher app gives a lower one what only it
knows (docs/architecture.md, "The apps"). Access imports nothing of billing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from access.selectors import Principal


class KeyWallet(Protocol):
    """A key's wallet as access reads it (billing's ``Wallet``)."""

    @property
    def wallet_id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def line_id(self) -> str: ...

    @property
    def ancestry(self) -> list[str]: ...


@dataclass(frozen=True)
class WalletDirectory:
    """Billing's answers about wallets.

    ``columns(alias)`` are the wallet table's columns (``billing_wallet`` under ``alias``), ``width``
    their count and ``from_row`` the wallet they read, for the key lookup's one-statement join;
    ``get`` reads one wallet (None when there is none); ``ids_in_reach`` the ids of the wallets a
    caller reaches, as a subquery (the reach rule, ``billing.selectors.scope_to_caller``);
    ``for_caller`` the wallet a caller addresses by id (403/404 as ``billing.selectors.wallet_for_caller``).
    ``lock`` takes a wallet's row lock (the lock closing takes) and returns it as it now reads (None
    when there is none); ``require_open`` refuses a closed wallet new keys (403 ``wallet_closed``);
    ``subtree_ids`` the ids of a wallet and every wallet below it, as a subquery; ``choices`` every open
    wallet, for the console's key form.
    """

    columns: Callable[[str], str]
    width: int
    from_row: Callable[[Sequence[Any]], KeyWallet]
    get: Callable[[str], KeyWallet | None]
    ids_in_reach: Callable[[Principal], Any]
    for_caller: Callable[[Principal, str], KeyWallet]
    lock: Callable[[str], KeyWallet | None]
    require_open: Callable[[KeyWallet], None]
    subtree_ids: Callable[[KeyWallet], Any]
    choices: Callable[[], Any]


_directory: WalletDirectory | None = None


def wallet_directory_register(directory: WalletDirectory) -> None:
    """Billing's registration (``billing.apps``); a later one replaces it."""
    global _directory
    _directory = directory


def wallet_directory() -> WalletDirectory:
    """The registered directory (billing is installed wherever access authenticates a wallet key)."""
    if _directory is None:
        raise RuntimeError("No wallet directory is registered (billing.apps registers it at start-up).")
    return _directory
