"""The rate-limit charge deferred to the claim (access/ratelimit.py, "deferred").

A governed ``tools/call`` in the stateless era whose key the process authenticated before is charged
by its claim (``gateway_claim`` checks the key and charges its window in the same statement), not by
a statement of its own at the request's start. These tests hold it to what the limiter promised
before: every request is charged exactly once, request 121 of a window is refused with nothing
written, a revoked key stops at once, and no other outcome (a replay, a bad argument, a denial, a
frozen wallet) escapes the charge or is written before it.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from access import ratelimit
from access.keys import hash_secret
from access.models import APIKey
from access.ratelimit import bucket_charge
from audit.models import AuditEvent
from billing.models import LedgerEntry, Wallet
from common import fastsql
from mcpgateway.models import Action
from mcpgateway.services import claim as claiming
from permits.models import Permit
from tests import factories
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import register_tools, setup_caller, tools_call_body
from tests.test_billing_api import charge
from tests.test_gateway_claim import claim_params
from tests.test_gateway_governance import assert_refused, balance, charges

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def database_windows(settings: Any) -> None:
    """The PostgreSQL windows (the default outside tests), and a process that has seen no key yet."""
    settings.RATE_LIMIT_BACKEND = "database"
    ratelimit._KEYS.clear()


def call(client: APIClient, permit_id: str, *, key: str | None = None, tool: str = "echo", **arguments: Any) -> Any:
    """``tools/call`` as ``POST /mcp`` in the stateless era (the headers a 2026-07-28 client sends)."""
    return client.post(
        "/mcp",
        json.dumps(tools_call_body(tool, arguments, permit_id=permit_id, key=key)),
        content_type="application/json",
        HTTP_MCP_PROTOCOL_VERSION="2026-07-28",
        HTTP_MCP_METHOD="tools/call",
        HTTP_MCP_NAME=tool,
        HTTP_ACCEPT="application/json, text/event-stream",
    )


def mismatched(client: APIClient) -> Any:
    """A request the deferral applies to (its headers say tools/call) that its body contradicts."""
    return client.post(
        "/mcp",
        json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {}}),
        content_type="application/json",
        HTTP_MCP_PROTOCOL_VERSION="2026-07-28",
        HTTP_MCP_METHOD="tools/call",
    )


def window(tenant: Tenant) -> int:
    """The agent key's count in the current window (a zero charge reads it)."""
    count, _ = bucket_charge(f"key:{tenant.agent_key_id}", 0, 60)
    return count


def _standalone_charges(queries: list[dict[str, Any]]) -> int:
    return sum("billing_rate_limit_key_charge(" in q["sql"] for q in queries)


def test_a_known_key_is_charged_by_the_claim_once_per_call(fault, tenant):
    caller = setup_caller(tenant, balance=10)
    client = tenant.agent_client
    with CaptureQueriesContext(connection) as first:
        r = call(client, caller.permit_id)
    assert "result" in r.json(), r.content
    with CaptureQueriesContext(connection) as second:
        r = call(client, caller.permit_id)
    assert "result" in r.json(), r.content
    assert _standalone_charges(first.captured_queries) == 1  # the key is new to the process: charged at the start
    assert _standalone_charges(second.captured_queries) == 0  # known: the claim charges it
    assert any("gateway_claim" in q["sql"] for q in second.captured_queries)
    statements = [
        q["sql"] for q in second.captured_queries if "SAVEPOINT" not in q["sql"]
    ]  # tests run in a transaction
    assert len(statements) == 2, statements  # the claim and the finish
    assert window(tenant) == 2
    assert r["X-RateLimit-Remaining"] == "118"
    assert balance(tenant) == 6


def test_the_call_past_the_limit_is_refused_with_nothing_written(fault, tenant, settings):
    settings.RATE_LIMIT_REQUESTS = 3
    caller = setup_caller(tenant, balance=100)
    client = tenant.agent_client
    assert [call(client, caller.permit_id).status_code for _ in range(3)] == [200, 200, 200]
    actions = Action.objects.count()
    r = call(client, caller.permit_id)
    assert r.status_code == 429
    assert r.json()["detail"]["error"] == "rate_limited"
    assert 1 <= int(r["Retry-After"]) <= 60
    assert r["X-RateLimit-Remaining"] == "0"
    assert Action.objects.count() == actions  # no action, no denial
    assert charges(tenant) == 3
    assert window(tenant) == 4  # counted, as a refusal at the request's start is
    assert fault.count("tools/call") == 3


def test_a_key_revoked_after_the_process_cached_it_stops_at_once(fault, tenant):
    caller = setup_caller(tenant, balance=10)
    client = tenant.agent_client
    assert "result" in call(client, caller.permit_id).json()
    assert hash_secret(tenant.agent_secret) in ratelimit._KEYS
    r = tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/{tenant.agent_key_id}")
    assert r.status_code in (200, 204), r.content
    r = call(client, caller.permit_id)
    assert r.status_code == 401, r.content
    assert balance(tenant) == 8
    assert charges(tenant) == 1
    assert hash_secret(tenant.agent_secret) not in ratelimit._KEYS
    event = AuditEvent.objects.filter(event="auth.credential_rejected").latest("created_at")
    assert event.key_id == tenant.agent_key_id


def test_a_key_revoked_in_the_table_alone_is_refused_by_the_claim(fault, tenant):
    """Someone with write access to the key table revokes it: the claim itself reads the key."""
    caller = setup_caller(tenant, balance=10)
    client = tenant.agent_client
    assert "result" in call(client, caller.permit_id).json()
    APIKey.objects.filter(pk=tenant.agent_key_id).update(status="revoked", revoked_at=tenant.agent.created_at)
    r = call(client, caller.permit_id)
    assert r.status_code == 401, r.content
    assert charges(tenant) == 1
    assert fault.count("tools/call") == 1


def test_a_wrong_secret_for_a_cached_key_is_rejected(fault, tenant):
    caller = setup_caller(tenant, balance=10)
    assert "result" in call(tenant.agent_client, caller.permit_id).json()
    forged = tenant.agent_secret[:-4] + ("AAAA" if not tenant.agent_secret.endswith("AAAA") else "BBBB")
    r = call(client_for(forged), caller.permit_id)
    assert r.status_code == 401
    assert charges(tenant) == 1
    assert window(tenant) == 1  # the key's window is not the guesser's to spend


def test_answers_that_reach_no_claim_are_charged_once(fault, tenant, settings):
    """A replay, a bad argument and a header mismatch write nothing; each is charged once, and past the
    limit each is answered 429 as a request charged at its start would be."""
    settings.RATE_LIMIT_REQUESTS = 5
    caller = setup_caller(tenant, balance=10)
    client = tenant.agent_client
    first = call(client, caller.permit_id, key="same")
    assert "result" in first.json()
    replay = call(client, caller.permit_id, key="same")
    assert replay.json()["result"]["_meta"]["io.tollgate/replayed"] is True
    assert window(tenant) == 2
    bad = call(client, caller.permit_id, tool="no.such.tool")  # Mcp-Name agrees: an unknown tool
    assert "error" in bad.json()
    assert window(tenant) == 3
    assert mismatched(client).json()["error"]["data"]["error"] == "header_mismatch"
    assert window(tenant) == 4
    assert call(client, caller.permit_id, key="same").status_code == 200  # request 5
    late = call(client, caller.permit_id, key="same")  # request 6: the claim refuses the replay's charge
    assert late.status_code == 429
    assert late.json()["detail"]["error"] == "rate_limited"
    later = mismatched(client)  # request 7: answered without a claim, then refused by the settled charge
    assert later.status_code == 429
    assert later.json()["detail"]["error"] == "rate_limited"
    assert window(tenant) == 7
    assert charges(tenant) == 1


def test_a_denial_is_written_only_after_the_request_was_charged(fault, tenant, settings):
    settings.RATE_LIMIT_REQUESTS = 3
    caller = setup_caller(tenant, balance=3)
    client = tenant.agent_client
    assert "result" in call(client, caller.permit_id).json()  # 3 -> 1 credit
    with CaptureQueriesContext(connection) as denial:
        body = call(client, caller.permit_id).json()
    assert_refused(body, outcome="insufficient_funds", reason="insufficient_funds", code=-32002)
    assert window(tenant) == 2
    statements = [q["sql"] for q in denial.captured_queries]
    charged = next(i for i, sql in enumerate(statements) if "billing_rate_limit_key_charge(" in sql)
    written = next(i for i, sql in enumerate(statements) if sql.startswith('INSERT INTO "mcpgateway_action"'))
    assert charged < written  # charged (and able to refuse) before the denial is written
    denied = Action.objects.filter(state="denied").count()
    assert call(client, caller.permit_id).status_code == 200  # request 3: refused again, and recorded
    assert Action.objects.filter(state="denied").count() == denied + 1
    r = call(client, caller.permit_id)  # request 4: over the limit, so no denial is written
    assert r.status_code == 429
    assert Action.objects.filter(state="denied").count() == denied + 1
    assert balance(tenant) == 1


def test_a_wallet_frozen_after_its_key_was_cached_is_refused(fault, tenant):
    caller = setup_caller(tenant, balance=10)
    client = tenant.agent_client
    assert "result" in call(client, caller.permit_id).json()
    Wallet.objects.filter(pk=tenant.agent.pk).update(status="frozen", frozen_reason="operator")
    assert_refused(call(client, caller.permit_id).json(), outcome="denied", reason="wallet_frozen")
    assert balance(tenant) == 8
    assert window(tenant) == 2


def test_a_free_call_on_a_cached_key_reads_the_wallet_afresh(fault, tenant):
    """A free call has no debit to re-check the wallet: its status is read from the table, not from the
    wallet the cached key carries."""
    caller = setup_caller(tenant, balance=10)
    client = tenant.agent_client
    assert "result" in call(client, caller.permit_id).json()
    register_tools(fault.tools(), price="0")
    assert "result" in call(client, caller.permit_id).json()  # free, and the tool and price were read afresh
    Wallet.objects.filter(pk=tenant.agent.pk).update(status="frozen", frozen_reason="operator")
    assert_refused(call(client, caller.permit_id).json(), outcome="denied", reason="wallet_frozen")
    assert window(tenant) == 3
    assert fault.count("tools/call") == 2


def test_the_claim_checks_the_key_and_charges_its_window(fault, tenant, settings):
    """``gateway_claim`` called directly: a wrong digest or another wallet's key is 'stale', a full window
    'rate_limited', and either writes nothing, not even the window's charge."""
    caller = setup_caller(tenant, balance=10)
    permit = Permit.objects.get(pk=caller.permit_id)
    window_index = 42

    def claim(key_id: str, digest: str, limit: int, idem: str) -> tuple[str, Any]:
        action, params = claim_params(tenant, permit, amount="1", key=idem)
        params[7] = json.dumps({"key_id": key_id, "secret_hash": digest, "window_index": window_index, "limit": limit})
        try:
            with fastsql.own_transaction(), connection.cursor() as cursor:
                cursor.execute(claiming._CLAIM_SQL, params)
                row = cursor.fetchone()
        except DatabaseError as err:
            refusal = claiming._claim_refusal(err)
            assert refusal is not None
            assert not Action.objects.filter(pk=action.action_id).exists()
            return refusal["code"], None
        return row[0], row[-1]

    def count() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count FROM billing_rate_limit_window WHERE bucket = %s AND window_index = %s",
                [f"key:{tenant.agent_key_id}", window_index],
            )
            row = cursor.fetchone()
        return int(row[0]) if row else 0

    digest = hash_secret(tenant.agent_secret)
    assert claim(tenant.agent_key_id, "0" * 64, 5, "d1") == ("stale", None)
    assert claim(tenant.sponsor_key_id, hash_secret(tenant.sponsor_secret), 5, "d2") == ("stale", None)
    assert count() == 0
    assert claim(tenant.agent_key_id, digest, 2, "d3") == ("ok", 1)
    assert claim(tenant.agent_key_id, digest, 2, "d4") == ("ok", 2)
    assert claim(tenant.agent_key_id, digest, 2, "d5") == ("rate_limited", None)
    assert count() == 2
    assert balance(tenant) == Decimal(8)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_limit_holds_for_concurrent_calls_across_workers(tmp_path) -> None:
    """gunicorn, 2 workers x 4 threads, 8 clients: of 40 calls of one key in a window of 20, exactly 20 are
    claimed, charged and dispatched; the other 20 are refused with nothing written; all 40 are counted."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from billing.models import LedgerEntry
    from tests.conftest import make_tenant
    from tests.gateway_helpers import register_upstream
    from tests.live import running_gateway
    from tests.upstream_server import FaultUpstream

    with FaultUpstream() as upstream:
        register_upstream(upstream.url, price="1")
        tenant = make_tenant("deferred-live")
        caller = setup_caller(tenant, balance=100)
        env = {"UPSTREAM_MCP_URL": upstream.url, "RATE_LIMIT_BACKEND": "database", "RATE_LIMIT_REQUESTS": "20"}
        if 60 - time.time() % 60 < 25:  # all 40 calls in one window
            time.sleep(60 - time.time() % 60 + 0.5)
        headers = {
            "X-API-Key": tenant.agent_secret,
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": "echo",
            "Accept": "application/json, text/event-stream",
        }
        with running_gateway(tmp_path, workers=2, threads=4, extra_env=env) as gw:

            def calls(worker: int) -> list[int]:
                statuses = []
                with httpx.Client(base_url=gw.url, headers=headers, timeout=30) as client:  # kept alive
                    for i in range(5):
                        body = tools_call_body("echo", {"n": i}, permit_id=caller.permit_id, key=f"w{worker}-{i}")
                        r = client.post("/mcp", json=body)
                        assert r.status_code == 429 or "result" in r.json(), r.text
                        statuses.append(r.status_code)
                return statuses

            with ThreadPoolExecutor(8) as pool:
                statuses = [s for batch in pool.map(calls, range(8)) for s in batch]
        assert statuses.count(200) == 20, statuses
        assert statuses.count(429) == 20
        assert LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count() == 20
        assert Action.objects.filter(wallet_id=tenant.agent.wallet_id).count() == 20
        assert Wallet.objects.get(pk=tenant.agent.pk).balance == 80
        assert sum(upstream.received.values()) == 20
    count, _ = bucket_charge(f"key:{tenant.agent_key_id}", 0, 60, now=time.time())
    assert count == 40


# --- POST /v1/billing/charge: the charge is carried by billing_charge --------------------------------------


def test_a_known_keys_charge_is_one_statement(tenant):
    factories.top_up(tenant.agent, 100)
    client = tenant.agent_client
    assert charge(client, tenant.agent.wallet_id).status_code == 200
    with CaptureQueriesContext(connection) as second:
        r = charge(client, tenant.agent.wallet_id)
    assert r.status_code == 200, r.content
    statements = [q["sql"] for q in second.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 1, statements
    assert "billing_charge" in statements[0]
    assert r["X-RateLimit-Remaining"] == "118"
    assert window(tenant) == 2
    assert ledger_charges(tenant) == 2


def test_charges_past_the_limit_are_refused_and_every_answer_is_counted_once(tenant, settings):
    settings.RATE_LIMIT_REQUESTS = 6
    factories.top_up(tenant.agent, 100)
    client = tenant.agent_client
    assert charge(client, tenant.agent.wallet_id, key="c1").status_code == 200  # 1 (the key becomes known)
    replay = charge(client, tenant.agent.wallet_id, key="c1")  # 2: a replay
    assert replay["Idempotent-Replayed"] == "true"
    assert charge(client, tenant.agent.wallet_id, units="0.000000001").status_code == 422  # 3: refused by the statement
    assert charge(client, tenant.agent.wallet_id, units="abc").status_code == 422  # 4: refused before it
    assert charge(client, tenant.agent.wallet_id, units="1000").status_code == 402  # 5: more than the balance
    assert window(tenant) == 5
    assert charge(client, tenant.agent.wallet_id).status_code == 200  # 6
    r = charge(client, tenant.agent.wallet_id)  # 7
    assert r.status_code == 429, r.content
    assert r.json()["detail"]["error"] == "rate_limited"
    assert r["X-RateLimit-Remaining"] == "0"
    late = charge(client, tenant.agent.wallet_id, units="abc")  # 8: answered without the statement, then refused
    assert late.status_code == 429
    assert window(tenant) == 8
    assert ledger_charges(tenant) == 2


def test_a_revoked_key_cannot_charge_from_the_cache(tenant):
    factories.top_up(tenant.agent, 100)
    assert charge(tenant.agent_client, tenant.agent.wallet_id).status_code == 200
    APIKey.objects.filter(pk=tenant.agent_key_id).update(status="revoked", revoked_at=tenant.agent.created_at)
    r = charge(tenant.agent_client, tenant.agent.wallet_id)
    assert r.status_code == 401, r.content
    assert ledger_charges(tenant) == 1
    assert hash_secret(tenant.agent_secret) not in ratelimit._KEYS


def test_billing_charge_checks_the_key_and_keeps_the_unit_of_a_refusal(tenant):
    """``billing_charge`` called directly: a wrong digest is 'key_stale' with nothing written; past the limit
    'rate_limited' with the unit kept (a refused request counts); a refused charge keeps its unit too."""
    from tests.test_billing_charge_fn import billing_charge, prepared

    factories.top_up(tenant.agent, 5)
    digest = hash_secret(tenant.agent_secret)

    def run(secret_hash: str, limit: int, units: str = "1") -> dict[str, Any]:
        _, arguments = prepared(tenant.agent, units=units)
        arguments.update(k_key_id=tenant.agent_key_id, k_secret_hash=secret_hash, k_window_index=7, k_limit=limit)
        return billing_charge(arguments)

    assert run("0" * 64, 5)["code"] == "key_stale"
    assert ledger_charges(tenant) == 0
    assert (run(digest, 3)["code"], run(digest, 3)["rate_count"]) == ("ok", 2)
    refused = run(digest, 3, units="1000")
    assert (refused["code"], refused["rate_count"]) == ("insufficient_funds", 3)
    assert (run(digest, 3)["code"], run(digest, 3)["rate_count"]) == ("rate_limited", 5)
    assert ledger_charges(tenant) == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_limit_holds_for_concurrent_charges_in_batches(tmp_path) -> None:
    """gunicorn, 2 workers x 4 threads, 8 clients on one wallet (its charges go in batches): of 40 charges of
    one key in a window of 20, exactly 20 are posted; all 40 are counted."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from tests.conftest import make_tenant
    from tests.live import running_gateway

    tenant = make_tenant("deferred-charge-live")
    factories.top_up(tenant.agent, 100)
    env = {"RATE_LIMIT_BACKEND": "database", "RATE_LIMIT_REQUESTS": "20"}
    if 60 - time.time() % 60 < 25:  # all 40 charges in one window
        time.sleep(60 - time.time() % 60 + 0.5)
    with running_gateway(tmp_path, workers=2, threads=4, extra_env=env) as gw:

        def charges(worker: int) -> list[int]:
            with httpx.Client(base_url=gw.url, headers={"X-API-Key": tenant.agent_secret}, timeout=30) as client:
                return [
                    client.post(f"/v1/billing/charge?wallet_id={tenant.agent.wallet_id}").status_code for _ in range(5)
                ]

        with ThreadPoolExecutor(8) as pool:
            statuses = [s for batch in pool.map(charges, range(8)) for s in batch]
    assert statuses.count(200) == 20, statuses
    assert statuses.count(429) == 20
    assert ledger_charges(tenant) == 20
    count, _ = bucket_charge(f"key:{tenant.agent_key_id}", 0, 60, now=time.time())
    assert count == 40


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_batches_of_concurrent_charges_stay_within_a_window(tmp_path) -> None:
    """gunicorn, 2 workers x 4 threads, 8 clients on one wallet for 6 s with windows of 1 s: every window
    boundary falls among batches. No batch meets a deadlock (one that crossed into the next window would
    lock its row after the chain head; the retry one by one would hide most), and every charge is posted."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from tests.conftest import make_tenant
    from tests.live import database_deadlocks, running_gateway

    tenant = make_tenant("deferred-charge-windows")
    factories.top_up(tenant.agent, 100)
    env = {"RATE_LIMIT_BACKEND": "database", "RATE_LIMIT_REQUESTS": "100000", "RATE_LIMIT_WINDOW_SECONDS": "1"}
    first, deadlocks = int(time.time()), database_deadlocks()
    with running_gateway(tmp_path, workers=2, threads=4, extra_env=env) as gw:

        def charges(worker: int) -> list[int]:
            statuses = []
            with httpx.Client(base_url=gw.url, headers={"X-API-Key": tenant.agent_secret}, timeout=30) as client:
                end = time.monotonic() + 6
                while time.monotonic() < end:
                    response = client.post(f"/v1/billing/charge?wallet_id={tenant.agent.wallet_id}&units=0.001")
                    statuses.append(response.status_code)
            return statuses

        with ThreadPoolExecutor(8) as pool:
            statuses = [s for batch in pool.map(charges, range(8)) for s in batch]
    assert int(time.time()) - first >= 6  # the charges spanned at least six window boundaries
    assert set(statuses) == {200}, Counter(statuses)
    assert ledger_charges(tenant) == len(statuses)
    assert database_deadlocks() == deadlocks  # not even one retried out of sight


def ledger_charges(tenant: Tenant) -> int:
    return LedgerEntry.objects.filter(wallet_id=tenant.agent.wallet_id, kind="charge").count()


# -- the wallet line's window rides in the same statements (issue 27, item 3) -----------------------


def test_the_claim_charges_the_wallet_line_so_a_second_key_adds_nothing(fault, tenant, settings):
    """Two keys of one wallet, both known to the process (the claim charges them): 4 calls in all, not 4 each."""
    settings.RATE_LIMIT_REQUESTS = 4
    caller = setup_caller(tenant, balance=100)
    twin = client_for(factories.make_key(tenant.agent).secret)
    first, second = tenant.agent_client, twin
    assert [call(c, caller.permit_id).status_code for c in (first, second, first, second)] == [200] * 4
    actions = Action.objects.count()
    r = call(first, caller.permit_id)  # its own window holds 2; the wallet's 4
    assert r.status_code == 429, r.content
    assert r.json()["detail"]["error"] == "rate_limited"
    assert Action.objects.count() == actions
    assert fault.count("tools/call") == 4
    assert bucket_charge(f"wallet:{tenant.agent.wallet_id}", 0, 60)[0] == 5


def test_billing_charge_counts_the_wallet_line(tenant, settings):
    """``POST /v1/billing/charge`` with two keys of a wallet and of its child: one allowance for the line."""
    settings.RATE_LIMIT_REQUESTS = 4
    factories.top_up(tenant.agent, 100)
    child = factories.make_wallet(tenant.agent, "child", balance=0)
    twin = client_for(factories.make_key(tenant.agent).secret)
    child_client = client_for(factories.make_key(child).secret)
    wallet_id = tenant.agent.wallet_id
    assert [charge(c, wallet_id).status_code for c in (tenant.agent_client, twin)] == [200, 200]  # each known now
    assert charge(tenant.agent_client, wallet_id).status_code == 200  # deferred: billing_charge charges it
    assert child_client.get("/v1/me/permits").status_code == 200  # 4: the child's key is in the agent's line
    r = charge(twin, wallet_id)  # deferred, the twin's window holds 1
    assert r.status_code == 429, r.content
    assert ledger_charges(tenant) == 3


def test_billing_charge_called_directly_answers_the_larger_window(tenant):
    """The function's count is the larger of the key's and the line's windows (``billing_charge`` compares it)."""
    from tests.test_billing_charge_fn import billing_charge, prepared

    factories.top_up(tenant.agent, 5)
    twin = factories.make_key(tenant.agent)

    def run(key_id: str, secret: str, limit: int) -> dict[str, Any]:
        _, arguments = prepared(tenant.agent)
        arguments.update(k_key_id=key_id, k_secret_hash=hash_secret(secret), k_window_index=7, k_limit=limit)
        return billing_charge(arguments)

    assert run(tenant.agent_key_id, tenant.agent_secret, 2)["rate_count"] == 1
    assert run(twin.key.key_id, twin.secret, 2)["rate_count"] == 2
    refused = run(twin.key.key_id, twin.secret, 2)
    assert (refused["code"], refused["rate_count"]) == ("rate_limited", 3)
    assert ledger_charges(tenant) == 2
