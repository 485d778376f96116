"""Phase 1's claim as one statement (mcpgateway/sql/gateway_claim.sql), directly and through the API.

The claim inserts the action already claimed, consumes the quote, debits, reserves and appends the
audit event in one statement, after Python decided the authorization on rows it read a moment before.
These tests call the function itself, then change rows between the read and the claim (as a
concurrent request, or someone with write access to one table, would) and check that the claim
refuses with nothing written: no action, no charge, no reservation, no quote spent, no event.
"""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import audit_event_prepare
from billing.services import debit_call
from common import fastsql
from common.ids import new_id
from mcpgateway import services
from mcpgateway.models import Action, ActionState
from mcpgateway.services import claim as claiming
from mcpgateway.services import finish as finishing
from mcpgateway.services import lookup
from mcpgateway.upstream.client import CallResult
from permits.models import Permit, Quote
from permits.services import (
    permit_reservation_record,
    permit_revoke,
    policy_create,
    policy_update,
    quote_consume,
    quote_create,
)
from receipts.models import Receipt
from tests.gateway_helpers import issue_permit, setup_caller
from tests.test_gateway_governance import assert_refused, balance, charges

pytestmark = pytest.mark.django_db


def claim_params(tenant: Any, permit: Permit, *, amount: str, key: str) -> tuple[Action, list[Any]]:
    """The arguments of ``gateway_claim`` for a call of ``echo`` at ``amount``, as ``claiming._claim`` builds them."""
    now = timezone.now()
    action = Action(
        action_id=new_id("act"),
        tenant_id=tenant.agent.tenant_id,
        wallet=tenant.agent,
        api_key_id=tenant.agent_key_id,
        idempotency_key=key,
        request_hash="0" * 64,
        tool="echo",
        arguments={},
        transport="test",
        state=ActionState.DISPATCH_CLAIMED,
        permit=permit,
        price=Decimal(amount),
        created_at=now,
        claimed_at=now,
    )
    debit = debit_call(
        tenant_id=tenant.agent.tenant_id,
        wallet_id=tenant.agent.wallet_id,
        amount=Decimal(amount),
        correlation_id=action.action_id,
    )
    action.ledger_entry_id = debit.entry_id
    event = audit_event_prepare(
        event="tool_call.dispatch_claimed",
        ok=True,
        tenant_id=tenant.agent.tenant_id,
        wallet_id=tenant.agent.wallet_id,
        detail={"action_id": action.action_id},
    )
    params = [
        tenant.agent.tenant_id,
        json.dumps(fastsql.json_row(action)),
        None,  # no quote
        debit.record(),
        permit_reservation_record(permit=permit, amount=Decimal(amount), now=now),
        event.record_in(),
        "{}",  # nothing from the process's cache to compare
        None,  # no deferred rate-limit charge
        None,  # no policy's daily cap
    ]
    return action, params


def test_the_function_claims_in_one_statement(fault, tenant):
    caller = setup_caller(tenant, balance=10)
    permit = Permit.objects.get(pk=caller.permit_id)
    action, params = claim_params(tenant, permit, amount="3", key="direct-1")
    with connection.cursor() as cursor:
        cursor.execute(claiming._CLAIM_SQL, params)
        code, *_rest = cursor.fetchone()
    assert code == "ok"
    stored = Action.objects.get(pk=action.action_id)
    assert stored.state == "dispatch_claimed"
    assert stored.ledger_entry_id == action.ledger_entry_id
    assert balance(tenant) == 7
    permit.refresh_from_db()
    assert (permit.spent_credits, permit.calls_used) == (3, 1)
    assert AuditEvent.objects.filter(event="tool_call.dispatch_claimed", detail__action_id=action.action_id).exists()


def test_a_refusal_raises_and_writes_nothing(fault, tenant):
    caller = setup_caller(tenant, balance=2)
    permit = Permit.objects.get(pk=caller.permit_id)
    action, params = claim_params(tenant, permit, amount="3", key="direct-2")
    events = AuditEvent.objects.count()
    with pytest.raises(DatabaseError) as caught, fastsql.own_transaction(), connection.cursor() as cursor:
        cursor.execute(claiming._CLAIM_SQL, params)
    assert getattr(caught.value.__cause__, "sqlstate", None) == services.CLAIM_REFUSED
    refusal = claiming._claim_refusal(caught.value)
    assert refusal is not None
    assert refusal["code"] == "insufficient_funds"
    assert not Action.objects.filter(pk=action.action_id).exists()
    assert balance(tenant) == 2
    assert charges(tenant) == 0
    assert AuditEvent.objects.count() == events


def test_a_reservation_refused_after_the_debit_rolls_the_debit_back(fault, tenant, monkeypatch):
    """The permit is spent by someone else between the read and the claim: the debit inside the
    same statement is undone with it."""
    caller = setup_caller(tenant, balance=10, max_credits="4")
    real = claiming._claim

    def exhausted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        Permit.objects.filter(pk=caller.permit_id).update(spent_credits=Decimal("3"))
        return real(*args, **kwargs)

    monkeypatch.setattr(claiming, "_claim", exhausted_meanwhile)
    body = caller.rpc("echo", {}).json()
    assert_refused(body, outcome="denied", reason="permit_exhausted")
    assert balance(tenant) == 10
    assert charges(tenant) == 0
    assert Permit.objects.get(pk=caller.permit_id).calls_used == 0
    assert fault.count("tools/call") == 0


@pytest.mark.parametrize(
    ("column", "value"),
    [("max_credits", Decimal("1000")), ("max_calls", 1000), ("expires_at", None)],
)
def test_a_permit_limit_edited_after_the_check_is_refused(fault, tenant, monkeypatch, column, value):
    """Someone with write access to the permits table widens a limit between authorization and the
    reservation: the reservation requires the signed limits, so the call is denied as tampered."""
    caller = setup_caller(tenant, balance=10, max_credits="4", max_calls=5)
    real = claiming._claim

    def edited_meanwhile(*args: Any, **kwargs: Any) -> Any:
        new = value if value is not None else timezone.now() + timedelta(days=400)
        Permit.objects.filter(pk=caller.permit_id).update(**{column: new})
        return real(*args, **kwargs)

    monkeypatch.setattr(claiming, "_claim", edited_meanwhile)
    body = caller.rpc("echo", {}).json()
    receipt = assert_refused(body, outcome="denied", reason="permit_signature_invalid")
    assert body["error"]["data"]["reason"] == f"statement_mismatch:{column}"
    assert receipt.credits_charged == 0
    assert balance(tenant) == 10
    assert charges(tenant) == 0
    assert fault.count("tools/call") == 0


def test_a_quote_spent_or_edited_after_the_check_is_refused(fault, tenant, monkeypatch):
    caller = setup_caller(tenant, balance=10)
    spent = quote_create(wallet=tenant.agent, tool="echo")
    edited = quote_create(wallet=tenant.agent, tool="echo")
    meanwhile = [
        lambda: quote_consume(quote_id=spent.quote_id, wallet=tenant.agent, tool="echo", action_id="act_other"),
        lambda: Quote.objects.filter(pk=edited.pk).update(quoted_credits=Decimal("0.00000001")),
    ]
    real = claiming._claim

    def changed_meanwhile(*args: Any, **kwargs: Any) -> Any:
        meanwhile.pop(0)()
        return real(*args, **kwargs)

    monkeypatch.setattr(claiming, "_claim", changed_meanwhile)
    for quote in (spent, edited):
        body = caller.rpc("echo", {}, quote_id=quote.quote_id).json()
        assert_refused(body, outcome="denied", reason="quote_unavailable")
    assert Quote.objects.get(pk=edited.pk).status == "active"  # an edited price is never charged or spent
    assert balance(tenant) == 10
    assert charges(tenant) == 0
    assert fault.count("tools/call") == 0


def test_permits_reserve_requires_every_signed_column(tenant):
    permit = Permit.objects.get(pk=issue_permit(tenant, max_credits="5", max_calls=2))
    now = timezone.now()
    verified = json.loads(permit_reservation_record(permit=permit, amount=Decimal(1), now=now))

    def reserve(tenant_id: str = tenant.sponsor.tenant_id, **changed: Any) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT permits_reserve_in(%s, %s::jsonb)", [tenant_id, json.dumps({**verified, **changed})])
            return bool(cursor.fetchone()[0])

    assert reserve()
    # What the caller verified is not what the row says: each signed column, and the signature.
    assert not reserve(signature="forged")
    assert not reserve(wallet_id=tenant.sponsor.wallet_id)
    assert not reserve(subject_key_id=tenant.agent_key_id)
    assert not reserve(allowed_tools=["other.*"])
    assert not reserve(max_credits="6")
    assert not reserve(max_calls=3)
    assert not reserve(expires_at=(permit.expires_at + timedelta(seconds=1)).isoformat())
    # Another tenant's permit is never touched, whatever else matches.
    assert not reserve("spn_other")
    with connection.cursor() as cursor:  # no verified statement: the allowance rules alone
        cursor.execute("SELECT permits_reserve(%s, %s, %s, %s)", [permit.tenant_id, permit.permit_id, 1, now])
        assert cursor.fetchone()[0]
    assert not reserve()  # the call limit (2) is used up
    permit.refresh_from_db()
    assert (permit.spent_credits, permit.calls_used) == (2, 2)


def test_permits_quote_consume_spends_once_at_the_signed_price(fault, tenant):
    quote = quote_create(wallet=tenant.agent, tool="echo")
    now = timezone.now()

    def consume(
        credits: Decimal,
        signature: str,
        wallet_id: str = tenant.agent.wallet_id,
        tenant_id: str = tenant.agent.tenant_id,
    ) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT permits_quote_consume(%s, %s, %s, %s, %s, %s, %s, %s)",
                [tenant_id, quote.quote_id, wallet_id, "echo", credits, signature, "act_x", now],
            )
            return bool(cursor.fetchone()[0])

    assert not consume(quote.quoted_credits, quote.signature, tenant_id="spn_other")  # another tenant's: untouched
    assert not consume(quote.quoted_credits + 1, quote.signature)
    assert not consume(quote.quoted_credits, "forged")
    assert not consume(quote.quoted_credits, quote.signature, wallet_id=tenant.sponsor.wallet_id)
    assert consume(quote.quoted_credits, quote.signature)
    assert not consume(quote.quoted_credits, quote.signature)
    quote.refresh_from_db()
    assert (quote.status, quote.consumed_by) == ("consumed", "act_x")


# --- The process cache of tools (read again when the row's version changes) ------------------------


def test_a_tool_changed_in_the_table_is_read_again_on_the_next_call(fault, tenant):
    """Tools are cached per process by the row's version (xmin); a change made behind the ORM's back,
    here a raw UPDATE of the inputSchema, is seen by the very next call."""
    caller = setup_caller(tenant, balance=10)
    assert "result" in caller.rpc("echo", {"n": 1}).json()
    strict = {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]}
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mcpgateway_tool SET input_schema = %s WHERE service_id = 'echo'", [json.dumps(strict)])
    r = caller.invoke("echo", {"n": 1})
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["type"] == "invalid_arguments"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mcpgateway_tool SET enabled = false WHERE service_id = 'echo'")
    assert caller.rpc("echo", {"n": "1"}).json()["error"]["data"]["error"] == "unknown_tool"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mcpgateway_tool SET enabled = true WHERE service_id = 'echo'")
    assert "result" in caller.rpc("echo", {"n": "1"}).json()


def test_a_price_change_applies_to_the_next_call(fault, tenant):
    caller = setup_caller(tenant, balance=10)
    caller.rpc("echo", {})
    assert balance(tenant) == 8
    with connection.cursor() as cursor:
        cursor.execute("UPDATE billing_tool_price SET credits = 3 WHERE tool = 'echo'")
    caller.rpc("echo", {})
    assert balance(tenant) == 5


def test_an_answer_after_the_sweep_writes_nothing(fault, tenant):
    """gateway_finish updates the action only while it is still claimed: the sweeper's
    delivery_uncertain receipt stands when the upstream's success arrives afterwards."""
    caller = setup_caller(tenant, balance=10)
    permit = Permit.objects.get(pk=caller.permit_id)
    action, params = claim_params(tenant, permit, amount="3", key="late-1")
    with connection.cursor() as cursor:
        cursor.execute(claiming._CLAIM_SQL, params)
    assert services.action_sweep(older_than=timedelta(0)) == [action.action_id]
    late = CallResult(kind="success", reason="ok", request_id=action.action_id, status_code=200, result={"content": []})
    settled = finishing._phase3(action, late)
    assert settled.state == "delivery_uncertain"
    assert Receipt.objects.filter(action_id=action.action_id).count() == 1
    assert Receipt.objects.get(action_id=action.action_id).outcome == "delivery_uncertain"
    assert balance(tenant) == 7  # the charge is kept pending reconciliation, once


# --- Calls decided from the process's cache ----------------------------------------------------------


def _lookups(queries: list[dict[str, Any]]) -> int:
    return sum("FROM (SELECT 1) AS one" in q["sql"] for q in queries)


def test_a_second_call_is_decided_from_the_cache_without_the_lookup(fault, tenant):
    caller = setup_caller(tenant, balance=10)
    with CaptureQueriesContext(connection) as first:
        assert "result" in caller.rpc("echo", {}).json()
    with CaptureQueriesContext(connection) as second:
        assert "result" in caller.rpc("echo", {}).json()
    assert _lookups(first.captured_queries) == 1
    assert _lookups(second.captured_queries) == 0
    assert any("gateway_claim" in q["sql"] for q in second.captured_queries)
    assert balance(tenant) == 6
    assert fault.count("tools/call") == 2


def test_the_policies_cost_no_statement_of_their_own(fault, tenant):
    """The policy verdict (permits_policy_verdict) is read in the lookup's round trip, or taken from the
    cache, and its daily caps are checked inside the claim: a line whose bundles have tool rules, limits
    and daily caps costs the same statements per call as a line without any, fresh or cached."""
    from common.cache import clear_all

    caller = setup_caller(tenant, balance=20)

    def statements() -> tuple[int, int]:
        clear_all()
        with CaptureQueriesContext(connection) as fresh:
            assert "result" in caller.rpc("echo", {}).json()
        with CaptureQueriesContext(connection) as cached:
            assert "result" in caller.rpc("echo", {}).json()
        assert _lookups(fresh.captured_queries) == 1
        assert _lookups(cached.captured_queries) == 0
        return len(fresh.captured_queries), len(cached.captured_queries)

    statements()  # the first calls of the test read what the process keeps beyond the caches
    bare = statements()
    policy_create(
        wallet=tenant.sponsor,
        allowed_tools=["echo", "other.*"],
        max_credits_per_call=Decimal(5),
        allowed_categories=["tooling"],
        max_daily_credits=Decimal(50),
    )
    policy_create(wallet=tenant.agent, denied_tools=["danger.*"], max_daily_credits=Decimal(49))
    assert statements() == bare
    assert balance(tenant) == 8
    assert fault.count("tools/call") == 6


def test_a_policy_set_after_the_cache_was_filled_applies_to_the_next_call(fault, tenant):
    caller = setup_caller(tenant, balance=10)
    assert "result" in caller.rpc("echo", {}).json()
    policy_create(wallet=tenant.sponsor, denied_tools=["echo"])
    assert_refused(caller.rpc("echo", {}).json(), outcome="denied", reason="policy_denied")
    assert balance(tenant) == 8
    assert fault.count("tools/call") == 1


def test_a_policy_set_between_a_fresh_lookup_and_its_claim_applies_to_that_call(fault, tenant, monkeypatch):
    """A call decided on rows read for it (no cache yet) is claimed only if the policies, the tool and its
    price are still what it read: a deny rule committed in between sends it back to decide again."""
    from mcpgateway.services import governed, lookup

    caller = setup_caller(tenant, balance=10)
    real_lookup = lookup._lookup
    changed: list[str] = []

    def lookup_then_policy(req: Any) -> Any:
        found = real_lookup(req)
        if not changed:
            changed.append(policy_create(wallet=tenant.sponsor, denied_tools=["echo"]).policy_id)
        return found

    monkeypatch.setattr(governed, "_lookup", lookup_then_policy)
    assert_refused(caller.rpc("echo", {}).json(), outcome="denied", reason="policy_denied")
    assert balance(tenant) == 10
    assert fault.count("tools/call") == 0

    # Rows that keep changing under every fresh decision: after a few, 409 with nothing written.
    policy_update(policy_id=changed[0], enabled=False)

    def lookup_then_another_policy(req: Any) -> Any:
        found = real_lookup(req)
        policy_create(wallet=tenant.sponsor, max_credits_per_call=Decimal("100"))
        return found

    monkeypatch.setattr(governed, "_lookup", lookup_then_another_policy)
    r = caller.invoke("echo", {}, key="churn")
    assert r.status_code == 409, r.content
    assert r.json()["detail"]["error"] == "transaction_conflict"
    assert not Action.objects.filter(idempotency_key="churn").exists()


def test_a_permit_revoked_or_edited_after_the_cache_was_filled_is_refused(fault, tenant):
    caller = setup_caller(tenant, balance=10, max_credits="20")
    assert "result" in caller.rpc("echo", {}).json()
    Permit.objects.filter(pk=caller.permit_id).update(max_credits=Decimal("1000"))  # a column edited in the table
    body = caller.rpc("echo", {}).json()
    assert_refused(body, outcome="denied", reason="permit_signature_invalid")
    assert body["error"]["data"]["reason"] == "statement_mismatch:max_credits"
    Permit.objects.filter(pk=caller.permit_id).update(max_credits=Decimal("20"))
    assert "result" in caller.rpc("echo", {}).json()
    permit_revoke(permit_id=caller.permit_id)
    assert_refused(caller.rpc("echo", {}).json(), outcome="denied", reason="permit_revoked")
    assert balance(tenant) == 6
    assert fault.count("tools/call") == 2


def test_a_refusal_decided_on_cached_rows_is_never_recorded(fault, tenant):
    """The cache holds a permit as it was read; a refusal its stale state would give (here a revocation
    that the table does not show) is decided again on fresh rows, and the call goes through."""
    caller = setup_caller(tenant, balance=10)
    assert "result" in caller.rpc("echo", {}).json()
    cached = lookup._permits.get(caller.permit_id)
    assert cached is not None
    stale = Permit.from_db(
        "default",
        [f.attname for f in Permit._meta.concrete_fields],
        [getattr(cached, f.attname) for f in Permit._meta.concrete_fields],
    )
    stale.status = "revoked"
    lookup._permits.set(caller.permit_id, stale)
    assert "result" in caller.rpc("echo", {}).json()
    assert getattr(lookup._permits.get(caller.permit_id), "status", None) == "active"  # read again, and cached again
    assert balance(tenant) == 6


def test_a_replay_decided_from_the_cache_returns_the_stored_answer(fault, tenant):
    caller = setup_caller(tenant, balance=10)
    first = caller.rpc("echo", {"n": 1}, key="again").json()["result"]["_meta"]
    replay = caller.rpc("echo", {"n": 1}, key="again").json()["result"]["_meta"]
    assert replay["io.tollgate/receipt-id"] == first["io.tollgate/receipt-id"]
    assert (first["io.tollgate/replayed"], replay["io.tollgate/replayed"]) == (False, True)
    assert caller.rpc("echo", {"n": 2}, key="again").json()["error"]["data"]["error"] == "idempotency_key_reused"
    assert balance(tenant) == 8
    assert fault.count("tools/call") == 1


def test_the_claim_statement_is_parsed_once_per_process():
    """psycopg caches its parsing of a statement of at most MAX_CACHED_STATEMENT_PARAMS parameters and
    parses any longer one again on every execution; the claim runs on every governed call."""
    from psycopg import _queries

    assert claiming._CLAIM_SQL.count("%s") <= _queries.MAX_CACHED_STATEMENT_PARAMS
    assert len(claiming._CLAIM_SQL.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH
