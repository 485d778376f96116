"""Access failures, one class per domain failure (rendered by ``common.errors``)."""

from __future__ import annotations

from common.errors import Conflict, PermissionDeniedError


class APIKeyLimitReached(Conflict):
    """The wallet holds ``API_KEYS_PER_WALLET`` active keys: revoke one, or rotate one (revoking the old)."""

    code = "api_key_limit_reached"
    message = "The wallet has as many active API keys as it may hold: revoke or rotate one instead."


class AncestorKeyRotation(PermissionDeniedError):
    """A key tried to rotate a key it descends from (its minter, or further up its lineage)."""

    code = "ancestor_key_rotation"
    message = (
        "A key cannot rotate a key it descends from (the key that minted it, or one above that): the rotation "
        "would revoke the caller's own key and leave its successor minted by a revoked key. Rotate it with a "
        "key above it, or revoke it."
    )
