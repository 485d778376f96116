"""The one encrypt/decrypt pair for upstream credentials' secrets (docs/decisions.md, "Upstream servers").

A credential's secret (a bearer token, custom headers) is stored only as the output of
``secret_encrypt``: Fernet (AES-128-CBC with HMAC-SHA256, from the ``cryptography`` package) under
one key, from ``UPSTREAM_SECRETS_KEY`` (a Fernet key: 32 url-safe base64 bytes) or, without it, the
file ``UPSTREAM_SECRETS_KEY_FILE`` (default ``.data/keys/upstream-secrets.key``), created mode 0600 on
first use. Everything that writes or reads a secret goes through this pair, so that key rotation
or an external KMS changes this module only.

Rotation: ``UPSTREAM_SECRETS_PREVIOUS_KEYS`` (comma-separated Fernet keys) are keys that still
decrypt but never encrypt. Set the new key as the current one and the old one as previous on every
instance, run ``manage.py rotate_upstream_secrets`` (``secrets_rotate``: every stored secret
re-encrypted under the current key), then remove the previous key (README, "Governing several MCP
servers").
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

_lock = threading.Lock()
_fernet: tuple[tuple[str, ...], Fernet, MultiFernet] | None = None  # (key sources, current cipher, all)


class SecretUnreadable(Exception):
    """A stored secret does not decrypt under the current key (the key changed, or the blob was altered)."""


def _key_from_file(path: Path) -> bytes:
    """The key in ``path``, created (mode 0600, exclusively: two processes agree on one key) when absent."""
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Fernet.generate_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it first: use its key
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    return key


def _ciphers() -> tuple[Fernet, MultiFernet]:
    """The current key's cipher, and one that decrypts under the current key or any previous one."""
    global _fernet
    previous = tuple(k.strip() for k in settings.UPSTREAM_SECRETS_PREVIOUS_KEYS if k.strip())
    sources = (settings.UPSTREAM_SECRETS_KEY or f"file:{settings.UPSTREAM_SECRETS_KEY_FILE}", *previous)
    with _lock:
        if _fernet is None or _fernet[0] != sources:
            if settings.UPSTREAM_SECRETS_KEY:
                key = settings.UPSTREAM_SECRETS_KEY.encode()
            else:
                key = _key_from_file(Path(settings.UPSTREAM_SECRETS_KEY_FILE).expanduser())
            current = Fernet(key)
            _fernet = (sources, current, MultiFernet([current, *(Fernet(k.encode()) for k in previous)]))
        return _fernet[1], _fernet[2]


def secret_encrypt(value: dict[str, Any]) -> bytes:
    """``value`` (JSON) encrypted and authenticated under the current key."""
    return _ciphers()[0].encrypt(json.dumps(value, sort_keys=True).encode())


def secret_decrypt(blob: bytes) -> dict[str, Any]:
    """The value ``secret_encrypt`` encrypted; raises ``SecretUnreadable`` when it does not decrypt."""
    try:
        plain = _ciphers()[1].decrypt(blob)
    except InvalidToken as exc:
        raise SecretUnreadable(
            "the credential does not decrypt under UPSTREAM_SECRETS_KEY or UPSTREAM_SECRETS_PREVIOUS_KEYS"
        ) from exc
    value = json.loads(plain)
    if not isinstance(value, dict):
        raise SecretUnreadable("the credential is not a JSON object")
    return value


def secret_is_current(blob: bytes) -> bool:
    """Whether ``blob`` decrypts under the current key (False: under a previous key, or under none)."""
    try:
        _ciphers()[0].decrypt(blob)
    except InvalidToken:
        return False
    return True


def secret_reencrypt(blob: bytes) -> bytes:
    """``blob`` encrypted again under the current key; raises ``SecretUnreadable`` when no key decrypts it."""
    try:
        return _ciphers()[1].rotate(blob)
    except InvalidToken as exc:
        raise SecretUnreadable("the credential does not decrypt under any configured key") from exc
