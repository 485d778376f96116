"""API key secret format and hashing (docs/architecture.md, "Tenancy and authority"). No Django imports."""

from __future__ import annotations

import hashlib
import re

from common.ids import random_base62

SECRET_RANDOM_LENGTH = 40
MIN_RANDOM_LENGTH = 32
# tg_ + key_<22 base62> + _ + at least 32 base62
_FORMAT = re.compile(r"^tg_(key_[0-9A-Za-z]{22})_([0-9A-Za-z]{32,128})$")
MIN_SECRET_LENGTH = len("tg_") + 4 + 22 + 1 + MIN_RANDOM_LENGTH


def make_secret(key_id: str) -> str:
    return f"tg_{key_id}_{random_base62(SECRET_RANDOM_LENGTH)}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def parse_secret(secret: str) -> str | None:
    """The key id of a well-formed secret, else None."""
    match = _FORMAT.match(secret)
    return match.group(1) if match else None
