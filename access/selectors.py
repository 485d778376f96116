"""Access reads: the key a secret presents (with its wallet, in one statement on the hot path), the
caller (``Principal``) and a wallet's keys and key log."""

from __future__ import annotations

import functools
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db.models import QuerySet

from access.keys import MIN_SECRET_LENGTH, hash_secret, parse_secret
from access.models import APIKey, APIKeyStatus, KeyRotationLog
from access.wallets import KeyWallet, wallet_directory
from common import fastsql
from common.errors import InvalidAPIKey


def api_key_authenticate(*, secret: str) -> APIKey:
    """The active key for a presented secret. Raises InvalidAPIKey (401) otherwise.

    Looks the key up by id and compares SHA-256 digests in constant time.
    """
    key_id = _key_id_of(secret)
    row = fastsql.fetch_row(_key_with_wallet_sql(), [key_id])
    return _verified(row, secret)


def api_key_authenticate_charging(*, secret: str, window_index: int) -> tuple[APIKey, int]:
    """:func:`api_key_authenticate`, and one unit charged to the key's rate-limit window, in one round trip.

    Returns the key and the larger of its windows' counts after the charge. The window rows of
    ``key:<key_id>`` and of its wallet line (``access.ratelimit``) are charged only when the presented
    secret's digest is the key's and the key is active, so a caller guessing
    secrets for a known key id never spends that key's allowance (it is charged
    to its own address by the rate limiter, as before). Raises InvalidAPIKey
    exactly as :func:`api_key_authenticate` does, having charged nothing.
    """
    key_id = _key_id_of(secret)
    row = fastsql.fetch_row(_key_charge_sql(), [key_id, hash_secret(secret), window_index, key_id])
    key = _verified(row[:-1] if row is not None else None, secret)
    assert row is not None
    if row[-1] is None:
        # The row read active, but the function, reading afresh, refused: the key was revoked (or its
        # secret replaced) while the statement ran. Answered as the key now reads; nothing was charged.
        api_key_authenticate(secret=secret)
        raise InvalidAPIKey("The API key is not valid.", key_id=key.key_id)
    return key, int(row[-1])


def _key_id_of(secret: str) -> str:
    if len(secret) < MIN_SECRET_LENGTH:
        raise InvalidAPIKey("The API key is missing, malformed or too short.")
    key_id = parse_secret(secret)
    if key_id is None:
        raise InvalidAPIKey("The API key is malformed.")
    return key_id


def _verified(row: tuple[Any, ...] | None, secret: str) -> APIKey:
    """The key of a ``_key_with_wallet_sql`` row if ``secret`` is its active secret; InvalidAPIKey otherwise."""
    if row is None:
        raise InvalidAPIKey("The API key is not valid.")
    split = fastsql.width(APIKey)
    key = fastsql.instance(APIKey, row[:split])
    if not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
        raise InvalidAPIKey("The API key is not valid.")
    if key.status != APIKeyStatus.ACTIVE:
        raise InvalidAPIKey("The API key has been revoked.", key_id=key.key_id)
    key.wallet_attach(wallet_directory().from_row(row[split:]) if key.wallet_id else None)
    return key


@functools.cache
def _key_with_wallet_sql() -> str:
    """The key and its wallet (NULLs for operator keys) in one precompiled query (every request runs it)."""
    # Column names come from the models' metadata, never from input.
    return (
        f"SELECT {fastsql.columns(APIKey, 'k')}, {wallet_directory().columns('w')} "  # noqa: S608
        "FROM billing_api_key k LEFT JOIN billing_wallet w ON w.wallet_id = k.wallet_id WHERE k.key_id = %s"
    )


@functools.cache
def _key_charge_sql() -> str:
    """``_key_with_wallet_sql`` plus one unit on the key's rate-limit window and its wallet line's
    (``access.ratelimit``), charged by ``billing_rate_limit_key_charge`` (billing/sql), which charges
    only the holder of the key's secret: the count (the larger window's) is NULL when it refused
    (unknown key, wrong secret, revoked key).
    """
    # Column names come from the models' metadata, never from input. One row at most (the key's id is
    # its primary key), so the window is charged at most once.
    return (
        f"SELECT {fastsql.columns(APIKey, 'k')}, {wallet_directory().columns('w')}, "  # noqa: S608
        "billing_rate_limit_key_charge(%s, %s, %s, NULL) "
        "FROM billing_api_key k LEFT JOIN billing_wallet w ON w.wallet_id = k.wallet_id WHERE k.key_id = %s"
    )


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: one API key, wallet-scoped or operator.

    ``access.authentication`` puts it on ``request.user``. Its reach is billing's rule
    (``billing.selectors.scope_to_caller``), given to access through ``access.wallets``.
    """

    key: APIKey

    @property
    def key_id(self) -> str:
        return self.key.key_id

    @property
    def wallet_id(self) -> str | None:
        return self.key.wallet_id

    @property
    def tenant_id(self) -> str | None:
        return self.key.tenant_id

    @property
    def is_operator(self) -> bool:
        return self.key.wallet_id is None

    def wallet_ids_in_reach(self) -> Any:
        """The ids of the wallets a wallet key reaches (its own and its descendants), as a subquery.

        For apps below billing (audit, access) that store plain wallet ids and cannot read the tree.
        """
        return wallet_directory().ids_in_reach(self)

    # DRF and Django treat request.user as a user object.
    @property
    def is_authenticated(self) -> bool:
        return True


def api_keys_of_wallet(wallet: KeyWallet) -> QuerySet[APIKey]:
    """The wallet's keys, newest first."""
    return APIKey.objects.filter(wallet_id=wallet.wallet_id).order_by("-created_at", "key_id")


def key_logs_of_wallet(wallet: KeyWallet) -> QuerySet[KeyRotationLog]:
    """The wallet's key log, newest first."""
    return KeyRotationLog.objects.filter(wallet_id=wallet.wallet_id, tenant_id=wallet.tenant_id).order_by(
        "-created_at", "-id"
    )


def api_key_file_active(*, path: Path, field: str) -> bool:
    """Whether the JSON credentials file at ``path`` (a bootstrap command's, from an earlier run) holds under
    ``field`` the secret of a key that is still active. False when the file is unreadable or the database
    was reset since."""
    try:
        secret = json.loads(path.read_text())[field]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    key_id = parse_secret(secret) if isinstance(secret, str) else None
    return key_id is not None and APIKey.objects.filter(key_id=key_id, status=APIKeyStatus.ACTIVE).exists()
