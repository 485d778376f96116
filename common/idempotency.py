"""Idempotency-key rules shared by every operation that takes a key (docs/architecture.md, "HTTP contract").

A key is 1 to 255 printable ASCII characters; keys are scoped by wallet. The
request hash is SHA-256 of the RFC 8785 canonical JSON of the normalized request.
"""

from __future__ import annotations

import re
from typing import Any

from common.canonical import canonical_bytes_fast, sha256_hex
from common.errors import RequestValidationError

_PRINTABLE = re.compile(r"^[\x20-\x7e]{1,255}$")
HEADER = "Idempotency-Key"


def validate_idempotency_key(value: str | None, *, required: bool) -> str | None:
    """The key from the header, validated; 422 (``loc: ["header", "Idempotency-Key"]``) otherwise."""
    if value is None or value == "":
        if required:
            raise RequestValidationError.single(["header", HEADER], "Field required.", "missing")
        return None
    if not _PRINTABLE.match(value) or value.strip() != value:
        raise RequestValidationError.single(
            ["header", HEADER],
            "An idempotency key is 1 to 255 printable characters without leading or trailing spaces.",
            "value_error",
        )
    return value


def request_hash(payload: Any) -> str:
    """SHA-256 of the canonical JSON of ``payload`` (decimals must already be strings)."""
    return sha256_hex(canonical_bytes_fast(payload))


def idempotency_scope(*, wallet_id: str | None, key_id: str) -> str:
    """Keys are scoped by the caller's wallet; operator keys each have their own scope."""
    return wallet_id or f"operator:{key_id}"


# The header's OpenAPI schema: the rule above, stated (printable ASCII, no surrounding spaces).
HEADER_SCHEMA: dict[str, object] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 255,
    "pattern": "^[\\x21-\\x7e](?:[\\x20-\\x7e]*[\\x21-\\x7e])?$",
}
