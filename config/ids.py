"""Identifiers: a type prefix and 22 random base62 characters (~131 bits)."""

from __future__ import annotations

import secrets
import string

BASE62 = string.digits + string.ascii_letters


def random_base62(length: int) -> str:
    """``length`` uniformly random base62 characters from the system's CSPRNG.

    One ``token_bytes`` call per identifier (not one per character): 64 random
    bits more than ``length`` base62 digits need, reduced modulo 62**length, so
    the bias from the reduction is below 2**-64.
    """
    span = 62**length
    value = int.from_bytes(secrets.token_bytes((span.bit_length() + 64 + 7) // 8)) % span
    digits = []
    for _ in range(length):
        value, digit = divmod(value, 62)
        digits.append(BASE62[digit])
    return "".join(digits)


def new_id(prefix: str) -> str:
    """A new identifier such as ``key_3kTMd9...``. ``prefix`` includes no underscore."""
    return f"{prefix}_{random_base62(22)}"
