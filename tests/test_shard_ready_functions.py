"""The hot database functions are ready for a database sharded by tenant (docs/decisions.md, "Records between apps").

Each hot function takes the tenant as a named argument, ``p_tenant_id``, and touches only that
tenant's rows: every statement of its body that reads, updates or deletes rows of a tenant's table
filters on ``tenant_id = p_tenant_id``. The first tests read the catalogue (``pg_proc``), so a hot
function that loses its argument or gains a statement on a tenant's table without the filter fails
here; the last ones call each function with another tenant's id against this tenant's rows and see
that nothing is touched.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import audit_event_prepare
from billing.models import LedgerEntry, SpendBucket, Wallet
from billing.services import debit_call, ledger_debit
from common.ids import new_id
from common.shardkeys import TENANT_TABLES
from mcpgateway.models import Action, ActionState
from mcpgateway.services import claim as claiming
from permits.models import Permit, Quote
from permits.services import permit_reservation_record
from tests import factories
from tests.gateway_helpers import issue_permit, setup_caller
from tests.test_gateway_claim import claim_params

pytestmark = pytest.mark.django_db


# The functions of the governed call's and the charge's statements, and of every money movement.
HOT_FUNCTIONS = (
    "gateway_claim",
    "gateway_finish",
    "billing_charge",
    "billing_debit",
    "billing_debit_in",
    "billing_post",
    "billing_refund",
    "billing_wallet_may_spend",
    "billing_daily_cap_over",
    "permits_policy_verdict",
    "audit_append",
    "audit_append_in",
    "permits_reserve",
    "permits_reserve_in",
    "permits_quote_consume",
    "permits_quote_consume_in",
)
# The tables whose rows belong to one tenant (common.shardkeys, the shard inventory), by their distribution
# column: tenant_id, or the audit chain (which audit_append requires to be the tenant's).
_BY_TENANT = [table for table, column in TENANT_TABLES.items() if column == "tenant_id"]
_BY_CHAIN = [table for table, column in TENANT_TABLES.items() if column == "chain"]
_ACCESS_BY_TENANT = re.compile(r"\b(?:FROM|JOIN|UPDATE)\s+(" + "|".join(_BY_TENANT) + r")\b", re.IGNORECASE)
_ACCESS_BY_CHAIN = re.compile(r"\b(?:FROM|JOIN|UPDATE)\s+(" + "|".join(_BY_CHAIN) + r")\b", re.IGNORECASE)
_FILTER = re.compile(r"\btenant_id\s*=\s*p_tenant_id\b", re.IGNORECASE)
_CHAIN_FILTER = re.compile(r"\bchain\s*=\s*p_chain\b", re.IGNORECASE)


def functions() -> dict[str, tuple[list[str], str]]:
    """Each hot function in the database: its argument names and its body."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, coalesce(p.proargnames, '{}'), p.proargmodes, p.prosrc FROM pg_proc p "
            "WHERE p.proname = ANY(%s) AND p.pronamespace = current_schema()::regnamespace",
            [list(HOT_FUNCTIONS)],
        )
        found = {}
        for name, arg_names, modes, body in cursor.fetchall():
            inputs = [n for n, mode in zip(arg_names, modes or ["i"] * len(arg_names), strict=True) if mode in "ib"]
            found[name] = (inputs, body)
    return found


def unfiltered_statements(body: str) -> list[str]:
    """The statements of ``body`` that reach a tenant's table without ``tenant_id = p_tenant_id`` (``chain =
    p_chain`` for the audit chain's tables)."""
    text = re.sub(r"--[^\n]*", "", body)
    return [
        " ".join(s.split())
        for s in text.split(";")
        if (_ACCESS_BY_TENANT.search(s) and not _FILTER.search(s))
        or (_ACCESS_BY_CHAIN.search(s) and not _CHAIN_FILTER.search(s))
    ]


def test_every_hot_function_takes_the_tenant_by_name():
    found = functions()
    assert sorted(found) == sorted(HOT_FUNCTIONS)
    for name, (inputs, _body) in found.items():
        assert "p_tenant_id" in inputs, f"{name} takes no p_tenant_id"


def test_every_statement_of_a_hot_function_on_a_tenant_table_filters_on_the_tenant():
    for name, (_inputs, body) in functions().items():
        assert unfiltered_statements(body) == [], name


def test_the_check_sees_a_statement_without_the_filter():
    body = "BEGIN UPDATE billing_wallet SET balance = 0 WHERE wallet_id = p_wallet_id; END"
    assert unfiltered_statements(body) == ["BEGIN UPDATE billing_wallet SET balance = 0 WHERE wallet_id = p_wallet_id"]
    assert unfiltered_statements(body.replace("p_wallet_id;", "p_wallet_id AND tenant_id = p_tenant_id;")) == []


# Called with another tenant's id: nothing is touched


def snapshot() -> tuple[Any, ...]:
    return (
        sorted(Wallet.objects.values_list("wallet_id", "balance", "total_spent", "status")),
        LedgerEntry.objects.count(),
        sorted(SpendBucket.objects.values_list("wallet_id", "amount")),
        sorted(Permit.objects.values_list("permit_id", "spent_credits", "calls_used")),
        sorted(Quote.objects.values_list("quote_id", "status")),
        AuditEvent.objects.count(),
    )


def one(sql: str, params: list[Any]) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def test_a_call_with_another_tenants_id_touches_nothing(tenant, other_tenant):
    factories.top_up(tenant.agent, 10)
    charge = ledger_debit(wallet=tenant.agent, amount=Decimal(2), service_category="tooling").entry
    permit = Permit.objects.get(pk=issue_permit(tenant, max_credits="5"))
    wrong = other_tenant.sponsor.tenant_id
    now = timezone.now()
    before = snapshot()

    # The debit: the wallet is not found in the other tenant.
    debit = debit_call(tenant_id=wrong, wallet_id=tenant.agent.wallet_id, amount=Decimal(1))
    assert one("SELECT code FROM billing_debit_in(%s, %s::jsonb)", [wrong, debit.record()])[0] == "not_found"
    # The status rule reads nothing of another tenant.
    assert one("SELECT code FROM billing_wallet_may_spend(%s, %s, %s)", [wrong, tenant.agent.wallet_id, now]) == (
        "not_found",
    )
    # A refund of this tenant's charge, or to its wallet, asked as the other tenant.
    refund = [wrong, charge.entry_id, None, Decimal(1), new_id("ltx"), new_id("led"), new_id("led"), "", "", "", now]
    assert one("SELECT code FROM billing_refund(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", refund)[0] == (
        "not_refundable"
    )
    refund[1:3] = [None, tenant.agent.wallet_id]
    assert one("SELECT code FROM billing_refund(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", refund)[0] == "not_found"
    # A posting to or from this tenant's wallet, as the other tenant.
    for source, target in ((tenant.agent.wallet_id, "revenue"), ("mint", tenant.agent.wallet_id)):
        with pytest.raises(DatabaseError, match="is not an account of tenant"), transaction.atomic():
            one(
                "SELECT * FROM billing_post(%s, %s, 'fund', %s, %s, 1, %s, %s, 0, '', NULL, '', '', '', NULL, %s)",
                [wrong, new_id("ltx"), source, target, new_id("led"), new_id("led"), now],
            )
    # The daily cap's spend: none of this tenant's buckets is read.
    over = one(
        "SELECT policy_id, spent FROM billing_daily_cap_over(%s, %s, %s, %s, %s)",
        [wrong, ["pol_x"], [tenant.agent.wallet_id], [Decimal("0.5")], now],
    )
    assert over == (None, None)
    assert one(
        "SELECT policy_id FROM billing_daily_cap_over(%s, %s, %s, %s, %s)",
        [tenant.agent.tenant_id, ["pol_x"], [tenant.agent.wallet_id], [Decimal("0.5")], now],
    ) == ("pol_x",)  # the same call with the right tenant sees the spend
    # The reservation on this tenant's permit.
    record = permit_reservation_record(permit=permit, amount=Decimal(1), now=now)
    assert one("SELECT permits_reserve_in(%s, %s::jsonb)", [wrong, record]) == (False,)
    # An audit event of this tenant appended as the other tenant's, and the other way round.
    event = audit_event_prepare(event="test.event", ok=True, tenant_id=tenant.agent.tenant_id, detail={})
    with pytest.raises(DatabaseError, match="not of tenant"), transaction.atomic():
        one("SELECT * FROM audit_append_in(%s, %s::jsonb)", [wrong, event.record_in()])
    params = event.params()  # audit's own positional call: the chain must be the event's tenant's
    params[0] = wrong
    with pytest.raises(DatabaseError, match="is not the chain of tenant"), transaction.atomic():
        one("SELECT * FROM audit_append(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s)", params)
    assert snapshot() == before


def test_the_governed_calls_functions_refuse_another_tenants_rows(fault, tenant, other_tenant):
    """gateway_claim refuses to claim an action for another tenant than its own, writing nothing; gateway_finish
    called for another tenant leaves a claimed action alone."""
    caller = setup_caller(tenant, balance=10)
    permit = Permit.objects.get(pk=caller.permit_id)
    wrong = other_tenant.sponsor.tenant_id
    action, params = claim_params(tenant, permit, amount="3", key="shard-1")
    before = snapshot()
    with pytest.raises(DatabaseError, match="the action is not of tenant"), transaction.atomic():
        one(claiming._CLAIM_SQL, [wrong, *params[1:]])
    assert not Action.objects.filter(pk=action.action_id).exists()
    assert snapshot() == before

    one(claiming._CLAIM_SQL, params)  # claimed for its own tenant
    claimed = snapshot()
    receipt = {"receipt_id": new_id("rcp"), "tenant_id": wrong}
    answer = one(
        "SELECT gateway_finish(%s, %s, %s::jsonb, 'succeeded', 'success', '', %s, '{}'::jsonb, now(), '{}'::jsonb)",
        [wrong, action.action_id, json.dumps(receipt), receipt["receipt_id"]],
    )
    assert answer == ("not_claimed",)
    assert Action.objects.get(pk=action.action_id).state == ActionState.DISPATCH_CLAIMED
    assert snapshot() == claimed
