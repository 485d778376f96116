"""Failures of the evidence services, in the one error model (common.errors)."""

from __future__ import annotations

from rest_framework import status

from common.errors import ApplicationError


class SigningKeyUnavailable(ApplicationError):
    """The active signing key's private part is in neither the environment nor the key file."""

    code = "signing_key_unavailable"
    http_status = status.HTTP_503_SERVICE_UNAVAILABLE
    message = "The evidence signing key is not available on this server; the operator must provide or rotate it."


class SigningKeyRetired(ApplicationError):
    """SIGNING_KEY_PRIVATE names a key that was retired; a retired key never signs again."""

    code = "signing_key_retired"
    http_status = status.HTTP_503_SERVICE_UNAVAILABLE
    message = "The configured signing key has been retired; configure a new one."
