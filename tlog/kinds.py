"""The kinds of statement that are leaves of a tenant's log, and where the integrator reads their bytes.

A leaf is the statement's signed canonical bytes (RFC 8785), exactly what its signature covers (a
portable receipt's ``signed_bytes``; docs/decisions.md, Evidence). For an audit event, which is
hash-chained rather than signed, the leaf is its canonical payload, the bytes its chain link hashes.
Adding a kind is one entry here and one trigger in tlog/sql/tlog_leaf_pending.sql (or, for a
statement no table keeps, ``tlog.services.tlog_leaf_append`` with its bytes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from audit.models import AuditEvent
from common.canonical import canonical_bytes, event_bytes, iso_utc

LeafLoader = Callable[[str, Sequence[str]], dict[str, bytes]]


def signed_statement_loader(table: str, id_column: str) -> LeafLoader:
    """Leaves of a table that keeps each statement as signed in ``signed_statement`` (jsonb)."""

    def load(tenant_id: str, ids: Sequence[str]) -> dict[str, bytes]:
        with connection.cursor() as cursor:
            cursor.execute(
                # The table and column are KINDS' constants, never input.
                f"SELECT {id_column}, signed_statement FROM {table} WHERE tenant_id = %s AND {id_column} = ANY(%s)",  # noqa: S608
                [tenant_id, list(ids)],
            )
            rows: list[tuple[str, Any]] = cursor.fetchall()
        return {statement_id: canonical_bytes(_json(statement)) for statement_id, statement in rows}

    return load


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def audit_event_leaves(tenant_id: str, ids: Sequence[str]) -> dict[str, bytes]:
    """The canonical payload of each audit event (what ``audit_append`` hashes into the chain)."""
    rows = AuditEvent.objects.filter(chain=tenant_id, event_id__in=list(ids)).values_list(
        "chain", "seq", "event_id", "event", "tenant_id", "wallet_id", "key_id", "tool", "endpoint",
        "policy_decision_id", "request_id", "ok", "detail", "created_at",
    )  # fmt: skip
    return {row[2]: event_bytes(*row[:13], iso_utc(row[13])) for row in rows}


@dataclass(frozen=True)
class Kind:
    """How the integrator reads the leaves of one kind of statement (None: the pending row carries them)."""

    load: LeafLoader | None


KINDS: dict[str, Kind] = {
    "receipt": Kind(signed_statement_loader("receipts_receipt", "receipt_id")),
    "permit": Kind(signed_statement_loader("permits_permit", "permit_id")),
    "quote": Kind(signed_statement_loader("permits_quote", "quote_id")),
    "permit_approval": Kind(signed_statement_loader("permits_permit_approval", "approval_id")),
    "audit_event": Kind(audit_event_leaves),
    "audit_checkpoint": Kind(None),
}
