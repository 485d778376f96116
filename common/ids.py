"""Identifiers: a type prefix and 22 random base62 characters (~131 bits)."""

from __future__ import annotations

import os
import string

BASE62 = string.digits + string.ascii_letters

# Byte b < 248 maps to BASE62[b % 62]: 248 = 4 * 62, so each accepted byte gives each
# character with probability exactly 1/62. Bytes 248-255 are dropped (3 % of them).
_ACCEPTED = 248
_TABLE = bytes(BASE62.encode()[b % 62] if b < _ACCEPTED else 0 for b in range(256))
_DROPPED = bytes(range(_ACCEPTED, 256))


def random_base62(length: int) -> str:
    """``length`` uniformly random base62 characters from the system's CSPRNG.

    Rejection sampling over random bytes, translated in C: unbiased, and about
    one ``os.urandom`` call per identifier (a second one only when more than
    16 of the bytes read were dropped).
    """
    chars = b""
    while len(chars) < length:
        chars += os.urandom(length - len(chars) + 16).translate(_TABLE, _DROPPED)
    return chars[:length].decode("ascii")


def new_id(prefix: str) -> str:
    """A new identifier such as ``key_3kTMd9...``. ``prefix`` includes no underscore."""
    return f"{prefix}_{random_base62(22)}"
