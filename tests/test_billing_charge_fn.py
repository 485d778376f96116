"""billing_charge (billing/sql/billing_charge.sql): called directly in SQL, through the API, and under races.

The function answers the charge in one statement: reach, idempotency record, price, the debit
(billing_debit), the record and the ledger audit events. Figures known only after the debit are
spliced by PostgreSQL into canonical bytes Python prepared; the tests here prove those bytes equal
the reference RFC 8785 encoding of the stored events, and that verify-chain recomputes every link.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from audit.chain_verification import audit_chain_verify
from audit.evidence_core import GENESIS_HASH, chain_hash
from audit.models import Alert, AuditEvent
from billing import services
from billing.exceptions import money
from billing.models import ChargeIdempotency, LedgerEntry, ServicePrice, Wallet
from billing.serializers import ChargeQuery, ChargeResponse
from billing.services import charge as charging
from billing.views import charge_query
from common.canonical import audit_event_payload, canonical_bytes, iso_utc
from common.errors import RequestValidationError
from common.pagination import parse_query
from tests import factories
from tests.conftest import client_for
from tests.test_billing_concurrency import run_threads

D = Decimal

# billing_charge called by name, as a reader of the SQL file would call it.
FN_SQL = (
    f"SELECT {', '.join(charging.CHARGE_COLUMNS)} FROM billing_charge("
    + ", ".join(f"{name} => %({name})s{charging._CASTS.get(name, '')}" for name in charging.CHARGE_ARGUMENTS)
    + ")"
)


def prepared(
    wallet: Wallet,
    *,
    units: str = "1",
    category: str = "compute",
    key: str | None = None,
    reach: str | None = None,
    request_path: str = "/work",
    refill_event: bool = True,
) -> tuple[charging.ChargeCall, dict[str, Any]]:
    call = charging.charge_call(
        wallet_id=wallet.wallet_id,
        tenant_id=wallet.tenant_id,
        reach_wallet_id=reach,
        service_category=category,
        units=services.to_money(D(units)),
        request_path=request_path,
        description="direct",
        idempotency_key=key,
        actor_key_id="key_direct",
        correlation_id="req_direct",
    )
    return call, call.arguments(refill_event=refill_event)


def billing_charge(arguments: dict[str, Any], *, batch_later: bool = False) -> dict[str, Any]:
    """The function called directly; ``batch_later``: as a charge after the first of a batch."""
    sql = FN_SQL.removesuffix(")") + ", p_batch_later => true)" if batch_later else FN_SQL
    with connection.cursor() as cursor:
        cursor.execute(sql, arguments)
        return dict(zip(charging.CHARGE_COLUMNS, cursor.fetchone(), strict=True))


def written() -> tuple[int, int, int]:
    return LedgerEntry.objects.count(), ChargeIdempotency.objects.count(), AuditEvent.objects.count()


def reference_bytes(event: AuditEvent) -> bytes:
    """The event's canonical bytes by the reference RFC 8785 encoder (not the fast path)."""
    return canonical_bytes(
        audit_event_payload(
            event_id=event.event_id,
            chain=event.chain,
            seq=event.seq,
            event=event.event,
            tenant_id=event.tenant_id,
            wallet_id=event.wallet_id,
            key_id=event.key_id,
            tool=event.tool,
            endpoint=event.endpoint,
            policy_decision_id=event.policy_decision_id,
            request_id=event.request_id,
            ok=event.ok,
            detail=event.detail,
            created_at=iso_utc(event.created_at),
        )
    )


def assert_chain_recomputes(chain: str) -> int:
    """Every link of ``chain`` recomputed from the stored rows with the reference encoder, and by verify-chain."""
    prev = GENESIS_HASH
    events = list(AuditEvent.objects.filter(chain=chain).order_by("seq"))
    for seq, event in enumerate(events, start=1):
        assert event.seq == seq
        assert event.prev_hash == prev, event.event_id
        assert event.hash == chain_hash(prev, reference_bytes(event)), (event.event, event.detail)
        prev = event.hash
    verdict = audit_chain_verify(chain=chain)
    assert verdict.valid, verdict
    assert verdict.checked_events == len(events)
    return len(events)


def expected_body(
    entry: LedgerEntry, *, unit_price: Decimal, daily_spent: Decimal, key: str | None, refill: LedgerEntry | None = None
) -> dict[str, Any]:
    """The response body as the ChargeResponse serializer writes it from the posted entries."""
    data = {
        "entry_id": entry.entry_id,
        "transaction_id": entry.transaction_id,
        "wallet_id": entry.account,
        "service_category": entry.service_category,
        "units": entry.units,
        "unit_price": unit_price,
        "amount": -entry.amount,
        "balance": entry.balance_after,
        "daily_spent": daily_spent,
        "refill": None
        if refill is None
        else {"entry_id": refill.entry_id, "amount": refill.amount, "parent_wallet_id": refill.counterparty},
        "description": entry.description,
        "request_path": entry.request_path,
        "correlation_id": entry.correlation_id,
        "idempotency_key": key,
        "created_at": entry.created_at,
    }
    return dict(ChargeResponse(data).data)


# --- the function, directly in SQL ---------------------------------------------------------


@pytest.mark.django_db
def test_billing_charge_posts_the_charge_its_record_and_its_event(tenant):
    factories.top_up(tenant.agent, 10)
    call, arguments = prepared(tenant.agent, units="2.5", category="search", key="order-1")
    row = billing_charge(arguments)
    assert row["code"] == "ok"
    assert (row["unit_price"], row["charged"], row["new_balance"]) == (D("0.25"), D("0.625"), D("9.375"))
    assert row["refilled"] is None

    entry = LedgerEntry.objects.get(entry_id=call.ids[1])
    assert (entry.kind, entry.amount, entry.balance_after, entry.transaction_id) == (
        "charge",
        D("-0.625"),
        D("9.375"),
        call.ids[0],
    )
    body = json.loads(row["body"])
    assert body == expected_body(entry, unit_price=D("0.25"), daily_spent=D("0.625"), key="order-1")
    record = ChargeIdempotency.objects.get(wallet=tenant.agent, key="order-1")
    assert (record.request_hash, record.status, record.response_status) == (call.request_hash, "done", 200)
    assert record.response_body == body
    assert record.entry_id == entry.entry_id

    event = AuditEvent.objects.get(event="ledger.charge")
    assert event.event_id == arguments["p_charge_event_id"]
    assert (event.chain, event.tenant_id, event.wallet_id) == (tenant.sponsor.wallet_id,) * 2 + (
        tenant.agent.wallet_id,
    )
    assert (event.key_id, event.endpoint, event.request_id) == ("key_direct", "/v1/billing/charge", "req_direct")
    assert event.detail == {
        "entry_id": entry.entry_id,
        "transaction_id": entry.transaction_id,
        "kind": "charge",
        "amount": "-0.62500000",
        "balance_after": "9.37500000",
        "counterparty": "revenue",
        "service_category": "search",
        "request_path": "/work",
    }
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@pytest.mark.django_db
def test_billing_charge_answers_like_the_python_it_replaces(tenant, other_tenant):
    factories.top_up(tenant.agent, 10)

    # Reach: unknown wallet, a wallet outside the key's subtree, another tenant's wallet.
    ghost = Wallet(wallet_id="agt_ghost", tenant_id=tenant.sponsor.wallet_id)
    assert billing_charge(prepared(ghost)[1])["code"] == "not_found"
    assert billing_charge(prepared(tenant.sponsor, reach=tenant.agent.wallet_id)[1])["code"] == "access_denied"
    _, foreign = prepared(other_tenant.agent, reach=tenant.sponsor.wallet_id)
    foreign["p_tenant_id"] = tenant.sponsor.wallet_id
    # Another tenant's wallet is not looked at: 'not_found', which a key's charge answers as access denied.
    assert billing_charge(foreign)["code"] == "not_found"
    # Without a reach check too: a tenant that is not the wallet's finds nothing, and nothing is written.
    _, misdirected = prepared(other_tenant.agent)
    misdirected["p_tenant_id"] = tenant.sponsor.wallet_id
    assert billing_charge(misdirected)["code"] == "not_found"
    # A key of the sponsor reaches the agent below it.
    assert billing_charge(prepared(tenant.agent, reach=tenant.sponsor.wallet_id, units="1")[1])["code"] == "ok"
    after_first = written()

    # Price: the list's row, else the built-in default, else unknown; an amount of zero at 8 places.
    ServicePrice.objects.filter(category="other").delete()
    _, arguments = prepared(tenant.agent, category="other", units="1")
    arguments["p_default_price"] = None
    assert billing_charge(arguments)["code"] == "unknown_category"
    row = billing_charge(prepared(tenant.agent, category="tooling", units="0.00000004")[1])
    assert (row["code"], row["unit_price"], row["charged"]) == ("amount_too_small", D("0.1"), D("0"))
    assert written() == after_first

    # Idempotency: replay (nothing written), conflict, in progress.
    first = billing_charge(prepared(tenant.agent, units="2", key="k")[1])
    assert first["code"] == "ok"
    counts = written()
    again = billing_charge(prepared(tenant.agent, units="2", key="k")[1])
    assert (again["code"], again["response_status"]) == ("replay", 200)
    assert json.loads(again["body"]) == json.loads(first["body"])
    assert billing_charge(prepared(tenant.agent, units="3", key="k")[1])["code"] == "idempotency_key_reused"
    ChargeIdempotency.objects.create(
        wallet=tenant.agent, tenant_id=tenant.sponsor.wallet_id, key="busy", request_hash="h", status="in_progress"
    )
    _, busy = prepared(tenant.agent, units="2", key="busy")
    busy["p_request_hash"] = "h"
    assert billing_charge(busy)["code"] == "idempotency_key_in_progress"
    assert written() == (counts[0], counts[1] + 1, counts[2])

    # Refusals of billing_debit come back with its figures; nothing is written, the key stays free.
    counts = written()
    row = billing_charge(prepared(tenant.agent, units="100", key="too-much")[1])
    assert (row["code"], row["subject_id"], row["new_balance"], row["charged"]) == (
        "insufficient_funds",
        tenant.agent.wallet_id,
        D("7"),
        D("100"),
    )
    assert written() == counts
    assert not ChargeIdempotency.objects.filter(key="too-much").exists()


@pytest.mark.django_db
def test_velocity_refusal_writes_nothing_and_freezes_nothing_by_itself(tenant):
    factories.top_up(tenant.agent, 1500)
    assert billing_charge(prepared(tenant.agent, units="999")[1])["code"] == "ok"
    counts = written()
    row = billing_charge(prepared(tenant.agent, units="2", key="v")[1])
    assert (row["code"], row["spend_window"], row["figure"], row["figure_limit"]) == (
        "velocity",
        "hour",
        D("999"),
        D("1000"),
    )
    assert written() == counts
    tenant.agent.refresh_from_db()
    assert tenant.agent.status == "active"  # the caller freezes, in a transaction of its own


@pytest.mark.django_db(transaction=True)
def test_a_refill_event_is_prepared_when_the_database_asks_for_it(tenant):
    agent = factories.make_wallet(tenant.sponsor, "bot", 12, refill_threshold=D("10"), refill_amount=D("50"))
    factories.top_up(tenant.sponsor, 100)
    counts = written()
    call, arguments = prepared(agent, units="5", key="r1", refill_event=False)
    with pytest.raises(DatabaseError) as raised:
        billing_charge(arguments)
    assert getattr(raised.value.__cause__, "sqlstate", None) == "TGRF1"
    assert written() == counts  # rolled back whole, refill and charge alike

    row = billing_charge(call.arguments(refill_event=True))
    assert (row["code"], row["refilled"], row["refill_parent"], row["new_balance"]) == (
        "ok",
        D("50"),
        tenant.sponsor.wallet_id,
        D("57"),
    )
    ledger_events = AuditEvent.objects.filter(wallet_id=agent.wallet_id, event__startswith="ledger.").order_by("seq")
    refill, charge = ledger_events[1:]  # after the funding of the new wallet
    assert (refill.event, charge.event) == ("ledger.refill", "ledger.charge")
    assert refill.detail == {
        "entry_id": call.ids[5],
        "transaction_id": call.ids[3],
        "kind": "refill",
        "amount": "50.00000000",
        "balance_after": "62.00000000",
        "counterparty": tenant.sponsor.wallet_id,
    }
    assert charge.detail["balance_after"] == "57.00000000"
    body = json.loads(row["body"])
    assert body["refill"] == {
        "entry_id": call.ids[5],
        "amount": "50.00000000",
        "parent_wallet_id": tenant.sponsor.wallet_id,
    }
    entry, refill_entry = (LedgerEntry.objects.get(entry_id=entry_id) for entry_id in (call.ids[1], call.ids[5]))
    assert body == expected_body(entry, unit_price=D("1"), daily_spent=D("5"), key="r1", refill=refill_entry)
    assert_chain_recomputes(tenant.sponsor.wallet_id)

    # Through the service, the same charge needs no second thought: it asks, prepares, repeats.
    services.wallet_provision(wallet=tenant.sponsor, amount=100)
    outcome = services.wallet_charge(wallet=Wallet.objects.get(pk=agent.pk), service_category="compute", units=50)
    assert outcome.body["refill"]["amount"] == "50.00000000"
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@pytest.mark.django_db
@pytest.mark.parametrize("stop", ["frozen", "expired"])
def test_a_refill_parent_the_status_rule_stops_draws_no_refill(tenant, stop):
    """The refill parent is an ancestor: the status rule (billing_wallet_may_spend) refuses the charge,
    naming the parent, before any refill is weighed; billing_debit keeps no status check of its own for it."""
    line = factories.make_wallet(tenant.sponsor, "line", 100)
    child = factories.make_wallet(line, "sub", 2, refill_threshold=D("5"), refill_amount=D("10"))
    if stop == "frozen":
        services.wallet_freeze(wallet=line, reason="test", actor="admin:test")
    else:
        Wallet.objects.filter(pk=line.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    counts = written()
    row = billing_charge(prepared(child, units="1")[1])
    assert (row["code"], row["subject_id"], row["refilled"]) == (f"wallet_{stop}", line.wallet_id, None)
    assert written() == counts
    assert Wallet.objects.get(pk=line.pk).balance == D("98")


@pytest.mark.django_db
def test_in_a_batch_a_wallet_with_an_auto_refill_has_one_charge(tenant):
    """After the first charge of a batch the chain head is held; a charge that might lock a refill
    parent then is refused (TGBT1) rather than take that lock out of order."""
    factories.top_up(tenant.agent, 10)
    bot = factories.make_wallet(tenant.sponsor, "bot", 12, refill_threshold=D("10"), refill_amount=D("50"))
    assert billing_charge(prepared(bot, units="1")[1])["code"] == "ok"  # the first of a batch: any wallet
    assert billing_charge(prepared(tenant.agent, units="1")[1], batch_later=True)["code"] == "ok"  # may follow
    with pytest.raises(DatabaseError) as raised, transaction.atomic():
        billing_charge(prepared(bot, units="1")[1], batch_later=True)
    assert getattr(raised.value.__cause__, "sqlstate", None) == "TGBT1"


@pytest.mark.django_db(transaction=True)
def test_a_batch_is_one_statement_in_arrival_order(tenant):
    """``_charge_rows_together``: each charge sees the ones before it, and one that fails takes the
    others with it (nothing written), after which they run one by one."""
    factories.top_up(tenant.agent, 10)
    calls = [list(prepared(tenant.agent, units=units, key=f"b{n}")[1].values()) for n, units in enumerate("123")]
    rows = charging._charge_rows_together(calls)
    assert [row["code"] for row in rows] == ["ok", "ok", "ok"]
    assert [row["new_balance"] for row in rows] == [D("9"), D("7"), D("4")]
    assert [json.loads(row["body"])["idempotency_key"] for row in rows] == ["b0", "b1", "b2"]

    bot = factories.make_wallet(tenant.sponsor, "bot", 12, refill_threshold=D("10"), refill_amount=D("50"))
    before = written()
    calls = [list(prepared(bot, units="1", key=f"r{n}")[1].values()) for n in range(2)]
    with pytest.raises(DatabaseError) as raised:
        charging._charge_rows_together(calls)  # the second may lock the refill parent after the chain head
    assert getattr(raised.value.__cause__, "sqlstate", None) == "TGBT1"
    assert written() == before  # the first charge of the batch rolled back with it
    answers = charging._charge_rows(bot.wallet_id, calls)
    assert [answer["code"] for answer in answers] == ["ok", "ok"]  # type: ignore[index]
    assert bot.wallet_id in charging._unbatched
    charging._unbatched.pop(bot.wallet_id)
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@pytest.mark.django_db(transaction=True)
def test_a_batch_never_spans_two_rate_limit_windows(tenant, monkeypatch):
    """Charges of one wallet and key that meet in the process go in one batch only within one window.

    billing_charge locks the key's window row first; a later charge of a batch that crossed into the
    next window would lock that row after the chain head, against the lock order, and deadlock with a
    charge of the next window that holds it and waits for the wallet. Here the first charge's
    statement is held while charges of both windows arrive; then every batch is read back.
    """
    window = int(time.time() // 60)
    held, arrived, batches = threading.Event(), threading.Semaphore(0), []

    def recorded(wallet_id: str, calls: list[list[Any]]) -> list[DatabaseError]:
        batches.append([params[charging.CHARGE_ARGUMENTS.index("k_window_index")] for params in calls])
        arrived.release()
        held.wait(10)
        return [DatabaseError("not run") for _ in calls]

    monkeypatch.setattr(charging, "_charge_rows", recorded)

    def one(index: int) -> None:
        call = prepared(tenant.agent, key=f"w{index}")[0]
        rate = ("key_window", "0" * 64, window + index % 2, 1000)
        with pytest.raises(DatabaseError, match="not run"):
            charging._charge(dataclasses.replace(call, rate=rate))

    def waiting() -> int:  # charges queued behind a running statement
        with charging._charge_queues_lock:
            return sum(len(queue) for queue in charging._charge_queues.values())

    threads = [threading.Thread(target=one, args=(0,))]
    threads[0].start()
    assert arrived.acquire(timeout=10)  # the first charge's statement runs (and is held)
    threads += [threading.Thread(target=one, args=(index,)) for index in range(1, 7)]
    for thread in threads[1:]:
        thread.start()
    deadline = time.monotonic() + 10
    while len(batches) + waiting() < 7 and time.monotonic() < deadline:  # each one running or queued
        time.sleep(0.01)
    held.set()
    for thread in threads:
        thread.join(10)
    assert sum(len(batch) for batch in batches) == 7
    assert any(len(batch) > 1 for batch in batches)  # charges did meet
    assert all(len(set(batch)) == 1 for batch in batches), batches
    assert not charging._charge_queues


def test_a_wallet_that_refused_a_batch_runs_alone_whatever_its_group(monkeypatch):
    """The wallet's charges run one statement each after its TGBT1, from every key and window."""
    alone: list[list[Any]] = []

    def run_alone(params: list[Any]) -> dict[str, Any]:
        alone.append(params)
        return {"code": "ok"}

    monkeypatch.setattr(charging, "_charge_row", run_alone)
    charging._unbatched.set("agt_refills", True)
    for group in ("agt_refills", "agt_refills key_a 7", "agt_refills key_b 8"):
        assert charging._charge_row_grouped("agt_refills", group, [group]) == {"code": "ok"}
    assert alone == [["agt_refills"], ["agt_refills key_a 7"], ["agt_refills key_b 8"]]
    assert not charging._charge_queues


# Decimals the ledger holds: numeric(20, 8), signs included (a charge's event amount is negative). A
# negative zero never reaches an event (amounts are not zero; PostgreSQL's numeric has no -0).
MONEY = st.decimals(
    min_value=D("-999999999999.99999999"), max_value=D("999999999999.99999999"), places=8, allow_nan=False
).filter(lambda value: not (value.is_zero() and value.is_signed()))
IDS = st.from_regex(r"(agt|chd|spn)_[0-9A-Za-z]{1,22}", fullmatch=True)


@pytest.mark.django_db
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(amount=MONEY, balance=MONEY, parent=IDS, seq=st.integers(min_value=1, max_value=2**53 - 1))
def test_the_spliced_bytes_are_pythons_canonical_bytes(tenant, amount, balance, parent, seq):
    """What billing_charge writes for a late figure (round(x, 8)::text, to_json(id)) joins the prepared
    cuts into exactly the reference RFC 8785 bytes of the event with that figure in its detail."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT '\"' || round(%s::numeric, 8)::text || '\"', '\"' || round(%s::numeric, 8)::text || '\"', "
            "to_json(%s::text)::text",
            [amount, balance, parent],
        )
        amount_json, balance_json, parent_json = cursor.fetchone()
    assert json.loads(amount_json) == money(amount)
    assert json.loads(balance_json) == money(balance)
    for late, values in (
        (("amount", "balance_after"), {"amount": amount_json, "balance_after": balance_json}),
        (
            ("amount", "balance_after", "counterparty"),
            {"amount": amount_json, "balance_after": balance_json, "counterparty": parent_json},
        ),
    ):
        detail = services.ledger_event_detail(
            entry_id="led_x",
            transaction_id="ltx_x",
            kind="charge",
            amount=charging._LATE,
            balance_after=charging._LATE,
            counterparty=charging._LATE if "counterparty" in late else "revenue",
            service_category="tooling",
            request_path='/a "quoted" \\ path\n',
        )
        event = charging.late_event_prepare(
            late=late,
            event="ledger.charge",
            ok=True,
            tenant_id=tenant.sponsor.wallet_id,
            wallet_id=tenant.agent.wallet_id,
            key_id="key_x",
            endpoint="/v1/billing/charge",
            request_id="req_x",
            detail=detail,
        )
        parts = event.parts
        spliced = parts[0]
        for index, key in enumerate(sorted(late)):
            spliced += values[key].encode() + parts[index + 1]
        spliced += str(seq).encode() + parts[-1]
        record = event.record
        record.seq = seq
        record.detail = {**event.detail, **{key: json.loads(values[key]) for key in late}}
        assert spliced == reference_bytes(record)


# --- through the API ---------------------------------------------------------------------------


def post_charge(client: Any, wallet_id: str, *, key: str | None = None, **params: str) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(f"/v1/billing/charge?{urlencode({'wallet_id': wallet_id, **params})}", **headers)


@pytest.mark.django_db(transaction=True)
def test_charges_refills_replays_and_a_velocity_freeze_leave_a_chain_that_verifies(tenant):
    factories.top_up(tenant.agent, 1500)
    refiller = factories.make_wallet(tenant.agent, "child", 3, refill_threshold=D("2"), refill_amount=D("4"))
    agent = tenant.agent_client

    first = post_charge(agent, tenant.agent.wallet_id, key="a", service_category="search", units="4")
    assert first.status_code == 200, first.content
    replay = post_charge(agent, tenant.agent.wallet_id, key="a", service_category="search", units="4.0")
    assert (replay.status_code, replay["Idempotent-Replayed"]) == (200, "true")
    assert replay.json() == first.json()
    # Both answers list the fields in the record's order, though jsonb stores keys in its own.
    assert list(first.json()) == list(replay.json()) == list(ChargeResponse().fields)
    assert ChargeIdempotency.objects.get(key="a").response_body == first.json()
    assert post_charge(agent, tenant.agent.wallet_id, key="a", units="5").json()["detail"][0]["type"] == (
        "idempotency_key_reused"
    )
    # A charge on a child that posts an auto-refill from the agent: ledger.refill then ledger.charge.
    r = post_charge(agent, refiller.wallet_id, key="child-1", service_category="compute", units="2")
    assert r.status_code == 200, r.content
    assert r.json()["refill"]["parent_wallet_id"] == tenant.agent.wallet_id
    assert list(r.json()["refill"]) == ["entry_id", "amount", "parent_wallet_id"]
    assert r.json()["balance"] == "5.00000000"
    assert [e.event for e in AuditEvent.objects.filter(wallet_id=refiller.wallet_id).order_by("seq")][-2:] == [
        "ledger.refill",
        "ledger.charge",
    ]
    # Spend up to the velocity limit, then a refusal that freezes the agent (its own transaction).
    assert post_charge(agent, tenant.agent.wallet_id, service_category="compute", units="990").status_code == 200
    r = post_charge(agent, tenant.agent.wallet_id, key="over", service_category="compute", units="8")
    assert (r.status_code, r.json()["detail"]["error"]) == (403, "wallet_frozen")
    assert not ChargeIdempotency.objects.filter(key="over").exists()
    assert Alert.objects.filter(wallet_id=tenant.agent.wallet_id, kind="wallet_frozen_velocity").count() == 1
    assert AuditEvent.objects.filter(event="wallet.frozen", wallet_id=tenant.agent.wallet_id).count() == 1

    checked = assert_chain_recomputes(tenant.sponsor.wallet_id)
    verdict = tenant.sponsor_client.post("/v1/audit/verify-chain", {}, format="json").json()
    assert verdict["valid"] is True
    assert verdict["checked_events"] == checked


@pytest.mark.django_db
def test_reach_through_the_api(tenant, other_tenant, operator_client):
    factories.top_up(tenant.agent, 10)
    child = factories.make_wallet(tenant.agent, "child", 5)
    # A wallet key charges its own wallet and those below it; a sponsor key its agents.
    assert post_charge(tenant.agent_client, child.wallet_id, units="1").status_code == 200
    assert post_charge(tenant.sponsor_client, tenant.agent.wallet_id, units="1").status_code == 200
    # Upwards, sideways, unknown: 403 for wallet keys (existence does not leak); 404 for operators.
    for client, wallet_id in (
        (tenant.agent_client, tenant.sponsor.wallet_id),
        (tenant.agent_client, other_tenant.agent.wallet_id),
        (tenant.agent_client, "agt_nosuchwallet"),
        (other_tenant.sponsor_client, tenant.agent.wallet_id),
    ):
        r = post_charge(client, wallet_id, units="1")
        assert (r.status_code, r.json()["detail"]["error"]) == (403, "wallet_access_denied"), wallet_id
    r = post_charge(operator_client, "agt_nosuchwallet", units="1")
    assert (r.status_code, r.json()["detail"]["error"]) == (404, "not_found")
    r = post_charge(operator_client, tenant.agent.wallet_id, key="op", units="1")
    assert r.status_code == 200
    assert AuditEvent.objects.get(event="ledger.charge", request_id=r["X-Request-Id"]).chain == (
        tenant.sponsor.wallet_id
    )
    assert LedgerEntry.objects.filter(kind="charge", wallet_id=other_tenant.agent.wallet_id).count() == 0
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@pytest.mark.django_db
def test_negotiation_outside_the_usual_case_is_drfs(tenant):
    factories.top_up(tenant.agent, 10)
    path = f"/v1/billing/charge?wallet_id={tenant.agent.wallet_id}&units=1"
    client = tenant.agent_client
    assert client.post(path, HTTP_ACCEPT="application/json").status_code == 200
    assert client.post(path, HTTP_ACCEPT="*/*").status_code == 200
    # Answers a view without the shortcut gives too (the price list).
    for accept in ("text/html", "application/xml"):
        expected = client.get("/v1/billing/pricing", HTTP_ACCEPT=accept).status_code
        assert client.post(path, HTTP_ACCEPT=accept).status_code == expected, accept
    expected = client.get("/v1/billing/pricing?format=xml").status_code
    assert client.post(path + "&format=xml").status_code == expected
    assert LedgerEntry.objects.filter(kind="charge", wallet=tenant.agent).count() == 2


QUERY_VALUES = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "1",
            "0",
            "0.00000001",
            "2.5",
            " 2",
            "1e3",
            "+1",
            "-1",
            "NaN",
            "1.000000001",
            "9" * 12 + ".5",
            "9" * 13,
            "compute",
            "tooling",
            "other",
            "teleport",
            "agt_x",
            " agt_x",
            "x" * 41,
            "x" * 301,
            "caf\u00e9",
            "a\x00b",
            "/p",
            "d" * 501,
        ]
    ),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
)
QUERY = st.dictionaries(
    st.sampled_from(["wallet_id", "service_category", "service", "units", "request_path", "description", "other"]),
    QUERY_VALUES,
)


@settings(max_examples=400, deadline=None)
@given(query=QUERY)
def test_the_plain_query_reader_answers_as_the_serializer(query):
    """charge_query gives what parse_query(ChargeQuery) gives: the same parameters or the same 422."""
    django_request = APIRequestFactory().post("/v1/billing/charge?" + urlencode(query))

    def outcome(read: Any) -> Any:
        try:
            return ("ok", read(Request(django_request)))
        except RequestValidationError as exc:
            return ("422", exc.errors)

    fast = outcome(charge_query)
    reference = outcome(lambda request: parse_query(request, ChargeQuery))
    assert fast == reference
    if fast[0] == "ok":  # same values, same exponent (units reach the request hash as money strings)
        assert str(fast[1]["units"]) == str(reference[1]["units"])


# --- races (real threads, real PostgreSQL) ------------------------------------------------------

races = pytest.mark.django_db(transaction=True)


def charge_thread(secret: str, wallet_id: str, key: str, units: str) -> tuple[int, str, dict[str, Any]]:
    r = post_charge(client_for(secret), wallet_id, key=key, service_category="compute", units=units)
    body = r.json()
    code = body["detail"]["error"] if isinstance(body.get("detail"), dict) else ""
    return r.status_code, code or r.get("Idempotent-Replayed", "first"), body


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the group-committed batches; the first charge of a wallet is slowed so others queue behind it."""
    sizes: list[int] = []
    together, single = charging._charge_rows_together, charging._charge_row
    first = threading.Event()

    def counted(calls: list[list[Any]]) -> list[dict[str, Any]]:
        sizes.append(len(calls))
        return together(calls)

    def slow_first(params: list[Any]) -> dict[str, Any]:
        if not first.is_set():
            first.set()
            time.sleep(0.3)
        return single(params)

    monkeypatch.setattr(charging, "_charge_rows_together", counted)
    monkeypatch.setattr(charging, "_charge_row", slow_first)
    return sizes


@races
def test_one_key_from_many_threads_is_one_debit(tenant, batches):
    factories.top_up(tenant.agent, 100)
    results = run_threads(24, lambda i: charge_thread(tenant.agent_secret, tenant.agent.wallet_id, "same", "1"))
    statuses = Counter((status, how) for status, how, _ in results)
    assert statuses[(200, "first")] == 1, statuses
    assert set(statuses) <= {(200, "first"), (200, "true")}, statuses
    bodies = {json.dumps(body, sort_keys=True) for _, _, body in results}
    assert len(bodies) == 1  # every answer is the first charge's
    assert max(batches) > 1  # the duplicates went in batches: the first of them did the work
    assert LedgerEntry.objects.filter(wallet=tenant.agent, kind="charge").count() == 1
    assert ChargeIdempotency.objects.filter(wallet=tenant.agent).count() == 1
    assert AuditEvent.objects.filter(event="ledger.charge").count() == 1
    tenant.agent.refresh_from_db()
    assert tenant.agent.balance == D("99")
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@races
def test_distinct_charges_over_the_balance_never_go_negative_and_refusals_write_nothing(tenant, batches):
    factories.top_up(tenant.agent, 10)
    results = run_threads(30, lambda i: charge_thread(tenant.agent_secret, tenant.agent.wallet_id, f"k{i}", "1"))
    accepted = [body["idempotency_key"] for status, _, body in results if status == 200]
    refused = [i for i, (status, how, _) in enumerate(results) if status != 200]
    assert len(accepted) == 10, results
    assert all(results[i][:2] == (402, "insufficient_funds") for i in refused), results
    assert max(batches) > 1
    tenant.agent.refresh_from_db()
    assert tenant.agent.balance == 0
    assert LedgerEntry.objects.filter(wallet=tenant.agent, kind="charge").count() == 10
    assert set(ChargeIdempotency.objects.values_list("key", flat=True)) == set(accepted)
    assert AuditEvent.objects.filter(event="ledger.charge").count() == 10
    # A refused key is free: it goes through once the wallet can pay.
    factories.top_up(Wallet.objects.get(pk=tenant.agent.pk), 1)
    assert charge_thread(tenant.agent_secret, tenant.agent.wallet_id, f"k{refused[0]}", "1")[:2] == (200, "first")
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@races
def test_a_replay_racing_the_first_request(tenant):
    factories.top_up(tenant.agent, 100)
    for round_ in range(8):

        def attempt(i: int, key: str = f"race-{round_}") -> tuple[int, str, dict[str, Any]]:
            return charge_thread(tenant.agent_secret, tenant.agent.wallet_id, key, "1")

        results = run_threads(2, attempt)
        assert sorted(how for _, how, _ in results) == ["first", "true"], results
        assert all(status == 200 for status, _, _ in results)
        assert results[0][2] == results[1][2]
    assert LedgerEntry.objects.filter(wallet=tenant.agent, kind="charge").count() == 8
    tenant.agent.refresh_from_db()
    assert tenant.agent.balance == D("92")
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@races
def test_a_batch_that_posts_refills_and_meets_the_velocity_limit(tenant, batches):
    """Refills make a batch roll back and its charges run one by one (each preparing its refill
    event when asked); a velocity refusal in a batch freezes the wallet once, after the batch."""
    factories.top_up(tenant.sponsor, 5000)
    bot = factories.make_wallet(tenant.sponsor, "bot", 10, refill_threshold=D("5"), refill_amount=D("20"))
    bot_key = factories.make_key(bot)
    results = run_threads(12, lambda i: charge_thread(bot_key.secret, bot.wallet_id, f"r{i}", "4"))
    assert [status for status, _, _ in results] == [200] * 12, results
    bot.refresh_from_db()
    refills = LedgerEntry.objects.filter(wallet=bot, kind="refill").count()
    assert refills >= 2
    assert bot.balance == D(10) + refills * D(20) - 12 * D(4)
    assert max(batches) > 1
    # A second charge of a wallet with an auto-refill is refused inside a batch (its parent's lock
    # would come after the chain head): the batch ran one by one and the wallet's charges now run alone.
    assert bot.wallet_id in charging._unbatched

    factories.top_up(tenant.agent, 2000)
    services.wallet_charge(wallet=Wallet.objects.get(pk=tenant.agent.pk), service_category="compute", units=994)
    results = run_threads(8, lambda i: charge_thread(tenant.agent_secret, tenant.agent.wallet_id, f"v{i}", "2"))
    assert sorted(status for status, _, _ in results) == [200] * 3 + [403] * 5, results
    assert all(how == "wallet_frozen" for status, how, _ in results if status == 403)
    tenant.agent.refresh_from_db()
    assert tenant.agent.status == "frozen"
    assert Alert.objects.filter(wallet_id=tenant.agent.wallet_id, kind="wallet_frozen_velocity").count() == 1
    assert not ChargeIdempotency.objects.filter(wallet=tenant.agent, response_status__isnull=True).exists()
    assert ChargeIdempotency.objects.filter(wallet=tenant.agent).count() == 3
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@pytest.mark.django_db
def test_the_charge_is_one_statement_after_the_key(tenant, operator_client):
    factories.top_up(tenant.agent, 10)
    client = tenant.agent_client
    assert post_charge(client, tenant.agent.wallet_id, units="1").status_code == 200  # warm the key lookup
    for key in ("q1", "q1", None):  # a charge, its replay, a charge without a key
        with CaptureQueriesContext(connection) as queries:
            r = post_charge(client, tenant.agent.wallet_id, key=key, units="1")
        assert r.status_code == 200
        statements = [q["sql"] for q in queries.captured_queries]
        charges = [sql for sql in statements if "billing_charge(" in sql]
        assert len(charges) == 1, statements
        others = [sql for sql in statements if sql not in charges]
        assert len(others) <= 1, others  # the API key's lookup (with the rate limit's window, in production)
    # An operator's charge reads the wallet's tenant first (the chain its events go to).
    with CaptureQueriesContext(connection) as queries:
        assert post_charge(operator_client, tenant.agent.wallet_id, units="1").status_code == 200
    assert sum("billing_charge(" in q["sql"] for q in queries.captured_queries) == 1
    assert len(queries.captured_queries) <= 3


def wait_for_a_lock_wait(timeout: float = 10.0, *, count: int = 1) -> None:
    """Return once ``count`` backends of this database wait for a lock (charges queued behind a held wallet)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0] >= count:
                return
            assert time.monotonic() < deadline, "no backend came to wait for a lock"
            time.sleep(0.01)


def waiting_for_a_lock(work: Callable[[], object]) -> threading.Thread:
    """``work`` in a thread of its own connection, returned once a backend waits for a lock (behind a held one)."""

    def run() -> None:
        try:
            work()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    wait_for_a_lock_wait()
    return thread


def held_open(work: Callable[[], object], release: threading.Event) -> threading.Thread:
    """``work`` in a transaction of another connection, held open (with the locks it took) until ``release``."""
    done = threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                work()
                done.set()
                assert release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    assert done.wait(30)
    return thread


def charge_held_open(wallet: Wallet, units: str, release: threading.Event) -> threading.Thread:
    """A charge of ``wallet`` in a transaction held open (its wallet lock with it) until ``release``."""

    def charge() -> None:
        assert billing_charge(prepared(wallet, units=units)[1])["code"] == "ok"

    return held_open(charge, release)


def refill_race_wallet(tenant: Any) -> Wallet:
    """A direct agent (its refill parent is the sponsor, no agent ancestor) at 10 credits: a charge of 6
    leaves 4, above its threshold of 1, and a second one of 6 needs the refill of 20."""
    factories.top_up(tenant.sponsor, 1000)
    return factories.make_wallet(tenant.sponsor, "bot", 10, refill_threshold=D("1"), refill_amount=D("20"))


@races
def test_a_refill_the_locks_did_not_foresee_rolls_the_debit_back_as_a_serialization_failure(tenant):
    """The debit chooses its locks from a read taken before the wallet's lock. A concurrent charge that
    brings the wallet near its threshold while this one waits leaves the parent unlocked when the refill
    becomes due: billing_debit then raises 40001, writing nothing, rather than charge without the refill
    (a false 402) or lock the parent out of order."""
    bot = refill_race_wallet(tenant)
    release = threading.Event()
    holder = charge_held_open(bot, "6", release)
    outcome: dict[str, Any] = {}

    def second() -> None:
        try:
            outcome["row"] = billing_charge(prepared(bot, units="6", key="late")[1])
        except DatabaseError as exc:
            outcome["error"] = exc

    waiter = waiting_for_a_lock(second)
    counts = written()
    release.set()
    holder.join(30)
    waiter.join(30)
    assert "row" not in outcome, outcome
    assert getattr(outcome["error"].__cause__, "sqlstate", None) == "40001"
    bot.refresh_from_db()
    assert bot.balance == D("4")  # the held charge only
    assert LedgerEntry.objects.filter(wallet=bot, kind="refill").count() == 0
    assert not ChargeIdempotency.objects.filter(wallet=bot, key="late").exists()
    assert written()[0] == counts[0] + 2  # the held charge's two entries, committed after the count

    # Run again, the debit foresees the refill: it locks the parent first and posts it.
    row = billing_charge(prepared(Wallet.objects.get(pk=bot.pk), units="6", key="late")[1])
    assert (row["code"], row["refilled"], row["new_balance"]) == ("ok", D("20"), D("18"))
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@races
def test_the_charge_endpoint_runs_a_charge_whose_refill_was_unforeseen_again(tenant):
    """Through the API the same race answers 200 with the refill posted, not 402."""
    bot = refill_race_wallet(tenant)
    bot_key = factories.make_key(bot)
    release = threading.Event()
    holder = charge_held_open(bot, "6", release)
    outcome: dict[str, Any] = {}

    waiter = waiting_for_a_lock(
        lambda: outcome.update(answer=charge_thread(bot_key.secret, bot.wallet_id, "late", "6"))
    )
    release.set()
    holder.join(30)
    waiter.join(30)
    status, how, body = outcome["answer"]
    assert (status, how) == (200, "first"), body
    assert body["refill"]["amount"] == "20.00000000"
    assert body["balance"] == "18.00000000"
    bot.refresh_from_db()
    assert bot.balance == D("18")
    assert LedgerEntry.objects.filter(wallet=bot, kind="refill").count() == 1
    assert LedgerEntry.objects.filter(wallet=bot, kind="charge").count() == 2
    assert_chain_recomputes(tenant.sponsor.wallet_id)


@races
@pytest.mark.parametrize(("units", "answer"), [("1", "replay"), ("2", "idempotency_key_reused")])
def test_a_record_that_commits_while_the_charge_waits_for_the_lock_answers_as_a_stored_one(tenant, units, answer):
    """A keyed charge finds no record before the locks, waits for the wallet's lock behind the first
    charge of its key, and finds that charge's record once it commits (billing_debit's 'replay'): it
    answers as a record found before the locks does (billing_charge_replay), with nothing written."""
    factories.top_up(tenant.agent, 100)
    release = threading.Event()
    first: dict[str, Any] = {}

    def charge() -> None:
        first.update(billing_charge(prepared(tenant.agent, units="1", key="dup")[1]))

    holder = held_open(charge, release)
    outcome: dict[str, Any] = {}

    waiter = waiting_for_a_lock(
        lambda: outcome.update(billing_charge(prepared(tenant.agent, units=units, key="dup")[1]))
    )
    release.set()
    holder.join(30)
    waiter.join(30)
    counts = written()
    assert first["code"] == "ok"
    assert (outcome["code"], outcome["response_status"]) == (answer, 200)
    assert json.loads(outcome["body"]) == json.loads(first["body"])
    again = billing_charge(prepared(tenant.agent, units=units, key="dup")[1])  # the record found before the locks
    assert (again["code"], again["response_status"], again["body"]) == (answer, 200, outcome["body"])
    assert written() == counts
    tenant.agent.refresh_from_db()
    assert tenant.agent.balance == D("99")


@races
def test_a_conflict_that_persists_is_409_with_nothing_written(tenant, monkeypatch):
    """Serialization failures of the charge's statement are retried a few times, then answered 409."""
    factories.top_up(tenant.agent, 10)
    single = charging._charge_row
    attempts: list[int] = []

    def conflicted(params: list[Any]) -> dict[str, Any]:
        attempts.append(1)
        with connection.cursor() as cursor:  # a real 40001, as billing_debit raises it
            cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = 'serialization_failure'; END $$")
        return single(params)

    monkeypatch.setattr(charging, "_charge_row", conflicted)
    counts = written()
    r = post_charge(tenant.agent_client, tenant.agent.wallet_id, key="k", units="1")
    assert r.status_code == 409, r.content
    assert r.json()["detail"]["error"] == "transaction_conflict"
    assert r["Retry-After"] == "1"
    assert len(attempts) == charging.dbretry.ATTEMPTS
    assert written() == counts
    monkeypatch.setattr(charging, "_charge_row", single)  # the key was not burnt
    assert post_charge(tenant.agent_client, tenant.agent.wallet_id, key="k", units="1").status_code == 200


@races
def test_an_error_of_one_charge_after_a_failed_batch_is_that_charge_s_alone(tenant, monkeypatch):
    """When a batch falls back to one statement per charge, an error of one of them (of any kind) goes to
    that charge only; the charges that committed keep their answers."""
    factories.top_up(tenant.agent, 10)
    single = charging._charge_row
    calls = [prepared(tenant.agent, units="1", key=f"b{n}")[1] for n in range(3)]
    params = [list(arguments.values()) for arguments in calls]

    def failing_batch(batch: list[list[Any]]) -> list[dict[str, Any]]:
        raise DatabaseError("the batch failed")

    def second_breaks(these: list[Any]) -> dict[str, Any]:
        if these is params[1]:
            raise RuntimeError("this charge's own failure")
        return single(these)

    monkeypatch.setattr(charging, "_charge_rows_together", failing_batch)
    monkeypatch.setattr(charging, "_charge_row", second_breaks)
    answers = charging._charge_rows(tenant.agent.wallet_id, params)
    assert [a["code"] if isinstance(a, dict) else type(a).__name__ for a in answers] == ["ok", "RuntimeError", "ok"]
    assert set(ChargeIdempotency.objects.filter(wallet=tenant.agent).values_list("key", flat=True)) == {"b0", "b2"}
