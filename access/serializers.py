"""Request and response records of the API-key API (names follow the spec)."""

from __future__ import annotations

from rest_framework import serializers

from access.models import APIKey, KeyRotationLog
from common.pagination import list_envelope
from common.schema import NamedChoiceField


class CreateAPIKeyRequest(serializers.Serializer):
    """Create a wallet-scoped API key."""

    wallet_id = serializers.CharField(max_length=40)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class APIKeyResponse(serializers.Serializer):
    """An API key as listed: the secret is masked."""

    key_id = serializers.CharField()
    wallet_id = serializers.CharField(allow_null=True)
    name = serializers.CharField()
    masked_key = serializers.CharField(source="masked")
    status = NamedChoiceField(component="APIKeyStatus", choices=["active", "revoked"])
    created_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True)
    revoke_reason = serializers.CharField()
    rotated_from = serializers.CharField()
    created_by_key_id = serializers.CharField(
        help_text="The key that minted this one (empty: the operator or the console). Revoking it revokes this key."
    )


class APIKeyWithSecret(APIKeyResponse):
    """A new API key with its secret. The secret is shown in this response only."""

    secret = serializers.CharField(help_text="The full API key. Shown once; store it now.")


APIKeyListResponse = list_envelope("APIKeyListResponse", APIKeyResponse)


class RotateAPIKeyRequest(serializers.Serializer):
    """Rotate a key: a successor is created; the old key is revoked unless ``revoke_old`` is false."""

    wallet_id = serializers.CharField(max_length=40)
    key_id = serializers.CharField(max_length=40)
    revoke_old = serializers.BooleanField(default=True)
    reason = serializers.CharField(max_length=200, required=False, default="rotation")


class RotationResponse(serializers.Serializer):
    """The result of a rotation; ``new_key.secret`` is shown once."""

    old_key_id = serializers.CharField()
    old_key_revoked = serializers.BooleanField()
    new_key = APIKeyWithSecret()


class EmergencyKeyRevocationRequest(serializers.Serializer):
    """Revoke every key of a wallet and of the wallets below it immediately, with the keys they minted."""

    wallet_id = serializers.CharField(max_length=40)
    reason = serializers.CharField(max_length=200, required=False, default="emergency")


class EmergencyKeyRevocationResponse(serializers.Serializer):
    """Which keys the emergency revocation revoked."""

    wallet_id = serializers.CharField()
    revoked_count = serializers.IntegerField()
    revoked_key_ids = serializers.ListField(child=serializers.CharField())
    reason = serializers.CharField()


class KeyRotationLogEntry(serializers.ModelSerializer):
    """One lifecycle event of a wallet's API keys."""

    wallet_id = serializers.CharField()

    class Meta:
        model = KeyRotationLog
        fields = ["wallet_id", "action", "key_id", "new_key_id", "reason", "actor_key_id", "created_at"]


class KeyLogQuery(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=200, default=50)


class RevokeQuery(serializers.Serializer):
    reason = serializers.CharField(max_length=200, default="user_request")


def api_key_data(key: APIKey, secret: str | None = None) -> dict[str, object]:
    data = dict(APIKeyResponse(key).data)
    if secret is not None:
        data["secret"] = secret
    return data
