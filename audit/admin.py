"""Operator console: audit events, chain heads, alerts and signing keys, all read-only.

Audit events are immutable and signing keys change only through
``manage.py rotate_signing_key``; no page can add, change or delete them.
Signing keys show public metadata only (the private keys are not in the database).
"""

from __future__ import annotations

from django.contrib import admin

from audit.models import Alert, AuditEvent, ChainHead, SigningKey
from common.console import ReadOnlyAdmin


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "chain", "seq", "event", "ok", "wallet_id", "key_id", "request_id", "created_at"]
    list_filter = ["ok", "event"]
    search_fields = ["event_id", "chain", "wallet_id", "key_id", "request_id", "tool"]
    ordering = ["-created_at", "-seq"]
    readonly_fields = [f.name for f in AuditEvent._meta.fields]
    show_full_result_count = False


@admin.register(ChainHead)
class ChainHeadAdmin(ReadOnlyAdmin):
    list_display = ["chain", "seq", "head_hash", "updated_at"]
    search_fields = ["chain"]
    readonly_fields = [f.name for f in ChainHead._meta.fields]


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ["alert_id", "wallet_id", "kind", "severity", "created_at"]
    list_filter = ["severity", "kind"]
    search_fields = ["alert_id", "wallet_id", "tenant_id"]
    readonly_fields = [f.name for f in Alert._meta.fields]


@admin.register(SigningKey)
class SigningKeyAdmin(ReadOnlyAdmin):
    list_display = ["key_id", "state", "algorithm", "created_at", "activated_at", "retired_at"]
    list_filter = ["state"]
    readonly_fields = [f.name for f in SigningKey._meta.fields]
