"""Canonical JSON (RFC 8785) and hashing helpers shared by every signed or chained object.

This module imports no Django so the offline verifier can reuse the same rules.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import rfc8785


def canonical_bytes(obj: Any) -> bytes:
    """RFC 8785 (JCS) canonical UTF-8 bytes of a JSON-compatible object."""
    return rfc8785.dumps(obj)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    padding = "=" * (-len(text) % 4)
    return base64.urlsafe_b64decode(text + padding)
