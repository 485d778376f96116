"""The audit search index holds the ids an event's detail names, not the whole detail (docs/decisions.md,
"The audit search index holds the ids only"), and the actor and object_id filters find what JSON
containment on the whole detail finds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from audit.models import AuditEvent
from audit.selectors import OBJECT_ID_DETAIL_KEYS, actor_q, object_id_q
from audit.services import audit_record

pytestmark = pytest.mark.django_db


def _refs(detail: Any) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT audit_detail_refs(%s::jsonb)", [json.dumps(detail)])
        (value,) = cursor.fetchone()
    return json.loads(value) if isinstance(value, str) else value


def test_the_search_index_holds_the_ids_not_the_whole_detail() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'audit_event' AND indexdef ILIKE '%% USING gin %%'"
        )
        definitions = [row[0] for row in cursor.fetchall()]
    assert definitions == [
        "CREATE INDEX audit_detail_refs_path_ops ON public.audit_event"
        " USING gin (audit_detail_refs(detail) jsonb_path_ops)"
    ]


def test_audit_detail_refs_keeps_the_actor_and_the_object_id_keys_only() -> None:
    """The SQL function's keys and audit.selectors' are one list: a key added to one and not the other fails."""
    searched = {"actor", *OBJECT_ID_DETAIL_KEYS}
    every = {key: f"v_{key}" for key in searched}
    assert _refs({**every, "amount": "1.00", "upstream_url": "http://x", "status_code": 200}) == every
    # JSON nulls (a free call's ledger_entry_id, a call without a quote) add nothing to the index.
    assert _refs({"action_id": "act_1", "quote_id": None, "ledger_entry_id": None}) == {"action_id": "act_1"}
    # A detail that is not an object never makes an insert fail.
    not_objects: list[Any] = [[1, 2], "s", 3, {}]
    for not_an_object in not_objects:
        assert _refs(not_an_object) == {}


def test_the_filters_find_what_containment_on_the_whole_detail_finds() -> None:
    details: list[dict[str, Any]] = [
        {"actor": "admin:ana", "policy_id": "pol_1"},
        {"actor": "admin:bob", "note": "pol_1"},  # the id outside the searched keys: not found by object_id
        {"action_id": "act_1", "permit_id": "pmt_1", "ledger_entry_id": None, "amount": "0.1"},
        {"receipt_id": "rcpt_1", "action_id": "act_1", "nested": {"permit_id": "pmt_1"}},
        {"entry_id": "led_1", "transaction_id": "ltx_1", "actor": "manage.py x"},
        {"key_id": "key_1", "actor": "admin:ana"},
    ]
    events = [
        audit_record(event="test.searched", ok=True, tenant_id=None, wallet_id=None, detail=detail)
        for detail in details
    ]
    ids = {event.event_id for event in events}
    for term in (
        "admin:ana",
        "admin:bob",
        "manage.py x",
        "pol_1",
        "act_1",
        "pmt_1",
        "rcpt_1",
        "led_1",
        "ltx_1",
        "key_1",
        "0.1",
        "nobody",
    ):
        by_actor = set(AuditEvent.objects.filter(actor_q(term), event_id__in=ids).values_list("event_id", flat=True))
        contained = set(
            AuditEvent.objects.filter(detail__contains={"actor": term}, event_id__in=ids).values_list(
                "event_id", flat=True
            )
        )
        assert by_actor == contained, term
        by_object = set(
            AuditEvent.objects.filter(object_id_q(term), event_id__in=ids).values_list("event_id", flat=True)
        )
        expected = {
            event.event_id for event in events if any(event.detail.get(key) == term for key in OBJECT_ID_DETAIL_KEYS)
        }
        assert by_object == expected, term
    assert {e.event_id for e in AuditEvent.objects.filter(object_id_q("pmt_1"))} == {events[2].event_id}
    assert {e.event_id for e in AuditEvent.objects.filter(actor_q("admin:ana"))} >= {
        events[0].event_id,
        events[5].event_id,
    }
