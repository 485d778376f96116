"""Request and response records of the audit and signing-key API (names follow the spec)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from common.pagination import PageQuery, list_envelope


class SigningKeyMetadataResponse(serializers.Serializer):
    """Public metadata of an evidence signing key. Private keys never leave the server."""

    key_id = serializers.CharField()
    algorithm = serializers.CharField(help_text='Always "Ed25519".')
    public_key = serializers.CharField(help_text="Raw 32-byte Ed25519 public key, unpadded base64url.")
    state = serializers.ChoiceField(choices=["active", "retired"])
    created_at = serializers.DateTimeField()
    activated_at = serializers.DateTimeField(allow_null=True)
    retired_at = serializers.DateTimeField(allow_null=True)


class JWK(serializers.Serializer):
    """An Ed25519 public key as an OKP JSON Web Key (RFC 8037), with its state."""

    kty = serializers.CharField(help_text='Always "OKP".')
    crv = serializers.CharField(help_text='Always "Ed25519".')
    x = serializers.CharField(help_text="The public key, unpadded base64url.")
    kid = serializers.CharField()
    use = serializers.CharField(help_text='Always "sig".')
    alg = serializers.CharField(help_text='Always "EdDSA".')
    status = serializers.CharField(help_text="The key's state: active or retired (retired keys only verify).")


class JWKSResponse(serializers.Serializer):
    """Every published evidence signing key (active and retired)."""

    keys = JWK(many=True)


def jwk_data(key: Any) -> dict[str, str]:
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": key.public_key,
        "kid": key.key_id,
        "use": "sig",
        "alg": "EdDSA",
        "status": key.state,
    }


class MeAuditEventQuery(PageQuery):
    """Filters of the caller's own audit events."""

    event = serializers.CharField(required=False, max_length=64)
    tool = serializers.CharField(required=False, max_length=200)
    endpoint = serializers.CharField(required=False, max_length=300)
    policy_decision_id = serializers.CharField(required=False, max_length=40)
    request_id = serializers.CharField(required=False, max_length=128)
    ok = serializers.BooleanField(required=False)
    actor = serializers.CharField(
        required=False,
        max_length=200,
        help_text="Who acted, exactly as recorded in the event's detail.actor (admin:<username>, "
        "manage.py <command>, velocity).",
    )
    object_id = serializers.CharField(
        required=False,
        max_length=128,
        help_text="Events about one object: its id in a column (wallet, key, request, policy decision) or in "
        "the detail (policy_id, permit_id, receipt_id, quote_id, action_id, key ids, ledger entry ids...).",
    )
    created_after = serializers.DateTimeField(required=False, help_text="Inclusive lower bound (ISO 8601).")
    created_before = serializers.DateTimeField(required=False, help_text="Exclusive upper bound (ISO 8601).")


class AuditEventQuery(MeAuditEventQuery):
    """Filters of the audit event list."""

    wallet_id = serializers.CharField(required=False, max_length=40)
    key_id = serializers.CharField(required=False, max_length=40)
    summary = serializers.BooleanField(default=False, help_text="Compact items (no hashes, detail or secondary ids).")


class AuditSummaryQuery(serializers.Serializer):
    created_after = serializers.DateTimeField(required=False, help_text="Inclusive lower bound (ISO 8601).")
    created_before = serializers.DateTimeField(required=False, help_text="Exclusive upper bound (ISO 8601).")


class AuditEventSummaryItem(serializers.Serializer):
    """The compact form of an audit event (``summary=true``)."""

    event_id = serializers.CharField()
    chain = serializers.CharField()
    seq = serializers.IntegerField()
    event = serializers.CharField()
    ok = serializers.BooleanField()
    wallet_id = serializers.CharField(allow_null=True)
    tool = serializers.CharField(allow_null=True)
    request_id = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


class AuditEventResponse(AuditEventSummaryItem):
    """One audit event. The fields below ``created_at`` are left out of the compact form (``summary=true``)."""

    tenant_id = serializers.CharField(allow_null=True, required=False)
    key_id = serializers.CharField(allow_null=True, required=False)
    endpoint = serializers.CharField(allow_null=True, required=False)
    policy_decision_id = serializers.CharField(allow_null=True, required=False)
    detail = serializers.DictField(required=False)
    prev_hash = serializers.CharField(required=False, help_text="Hash of the previous event in the chain (hex).")
    hash = serializers.CharField(required=False, help_text="SHA-256(prev_hash bytes || RFC 8785 canonical event), hex.")


AuditEventListResponse = list_envelope("AuditEventListResponse", AuditEventResponse)


class AuditSummaryEventCount(serializers.Serializer):
    """Counts for one event name."""

    event = serializers.CharField()
    total = serializers.IntegerField()
    ok = serializers.IntegerField()
    failed = serializers.IntegerField()


class AuditSummaryResponse(serializers.Serializer):
    """Counts of the caller's visible audit events by event name and outcome over a time range."""

    created_after = serializers.DateTimeField(allow_null=True)
    created_before = serializers.DateTimeField(allow_null=True)
    total = serializers.IntegerField()
    ok = serializers.IntegerField()
    failed = serializers.IntegerField()
    by_event = AuditSummaryEventCount(many=True)


class AuditCheckpoint(serializers.Serializer):
    """A signed statement that events ``first_seq``..``last_seq`` of a chain were checked, and its hash there.

    Issued only by a verification that walked the chain from its first event, so
    ``first_seq`` is 1 and ``size`` equals ``last_seq``: a checkpoint never claims
    events that were not checked. Keep it to detect later rewrites or truncation.
    The signature covers the RFC 8785 bytes of every other field.
    """

    type = serializers.CharField(help_text='Always "audit_checkpoint".')
    chain = serializers.CharField()
    first_seq = serializers.IntegerField(
        min_value=1, required=False, help_text="The first event checked (always 1; absent on older checkpoints)."
    )
    last_seq = serializers.IntegerField(
        min_value=0, required=False, help_text="The last event checked (absent on older checkpoints)."
    )
    size = serializers.IntegerField(min_value=0, help_text="Number of events (the seq of the last one).")
    head_hash = serializers.CharField(max_length=64, min_length=64)
    kid = serializers.CharField(max_length=40)
    issued_at = serializers.CharField(max_length=40, help_text="ISO 8601, as signed.")
    signature = serializers.CharField(max_length=200, help_text="Ed25519, unpadded base64url.")


class AuditChainVerifyRequest(serializers.Serializer):
    """Which chain and range to recompute, and optionally a checkpoint kept from an earlier verification."""

    chain = serializers.CharField(
        required=False,
        max_length=64,
        help_text="Default: the caller's tenant chain (operator keys: system). Operators may name any chain.",
    )
    from_seq = serializers.IntegerField(min_value=1, default=1)
    to_seq = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text=(
            "Default: the chain's head. A range ending below the head is anchored: the events above it are "
            "checked up to the head (not counted in checked_events) and a break there makes the range invalid."
        ),
    )
    checkpoint = AuditCheckpoint(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        to_seq = attrs.get("to_seq")
        if to_seq is not None and to_seq < attrs["from_seq"]:
            raise serializers.ValidationError({"to_seq": ["to_seq must not be below from_seq."]})
        return attrs


class AuditChainVerifyResponse(serializers.Serializer):
    """The result of recomputing a chain, with a signed checkpoint when it is valid and was checked from seq 1."""

    valid = serializers.BooleanField()
    chain = serializers.CharField()
    from_seq = serializers.IntegerField()
    to_seq = serializers.IntegerField()
    checked_events = serializers.IntegerField()
    head_seq = serializers.IntegerField()
    head_hash = serializers.CharField()
    first_broken_seq = serializers.IntegerField(allow_null=True)
    first_broken_event_id = serializers.CharField(allow_null=True)
    reason = serializers.CharField(
        allow_null=True,
        help_text=(
            "sequence_gap, prev_hash_mismatch, hash_mismatch, not_canonicalizable, missing_events, "
            "head_mismatch, events_beyond_head, truncated_below_checkpoint or checkpoint_mismatch."
        ),
    )
    checkpoint_verified = serializers.BooleanField(
        allow_null=True, help_text="Whether the supplied checkpoint still matches (null: none supplied)."
    )
    checkpoint = AuditCheckpoint(
        allow_null=True,
        help_text="Null when the chain is broken, or when the walk started after seq 1 (earlier events unchecked).",
    )


class AlertResponse(serializers.Serializer):
    """Something the wallet's owner should know about (key revoked, wallet frozen, delivery uncertain...)."""

    alert_id = serializers.CharField()
    wallet_id = serializers.CharField()
    kind = serializers.CharField()
    severity = serializers.ChoiceField(choices=["info", "warning", "critical"])
    message = serializers.CharField()
    detail = serializers.DictField()
    created_at = serializers.DateTimeField()


AlertListResponse = list_envelope("AlertListResponse", AlertResponse)
