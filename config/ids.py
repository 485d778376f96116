"""Identifiers: a type prefix and 22 random base62 characters (~131 bits)."""

from __future__ import annotations

import secrets
import string

BASE62 = string.digits + string.ascii_letters


def random_base62(length: int) -> str:
    return "".join(secrets.choice(BASE62) for _ in range(length))


def new_id(prefix: str) -> str:
    """A new identifier such as ``key_3kTMd9...``. ``prefix`` includes no underscore."""
    return f"{prefix}_{random_base62(22)}"
