"""Several upstream servers: real MCP SDK servers on their own ports (one open, one requiring a bearer token,
one requiring an OAuth client-credentials token from a token endpoint the test starts, one that hangs on
demand), their credentials, the evidence naming each server, and their isolation."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from billing.models import Wallet
from billing.services import tool_price_set
from mcpgateway.models import Action, Tool, UpstreamCredential, UpstreamServer, UpstreamServerState
from mcpgateway.services import action_sweep
from mcpgateway.services.upstreams import (
    upstream_credential_clear,
    upstream_credential_set,
    upstream_server_create,
    upstream_server_sync,
    upstream_server_update,
)
from mcpgateway.upstream.client import UpstreamError
from receipts.models import Receipt
from receipts.services import receipt_statement_problem
from tests.conftest import Tenant, make_tenant
from tests.gateway_helpers import setup_caller, tools_call_body
from tests.upstream_server import (
    IssuedTokenVerifier,
    SdkUpstream,
    TokenEndpoint,
    running_demo_upstream,
    running_sdk_upstream,
    running_token_endpoint,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

T = TypeVar("T")
PAY_TOKEN = "pay-server-token-1"
TENANT_TOKEN = "acme-own-token-2"
OPS_CLIENT, OPS_SECRET = "ops-gateway", "ops-client-secret-3"
ACME_CLIENT, ACME_SECRET = "acme-gateway", "acme-client-secret-4"


def wait_for(probe: Callable[[], T]) -> T:
    """Poll until ``probe`` answers something truthy (the test's own timeout bounds the wait)."""
    event = threading.Event()
    while True:
        value = probe()
        if value:
            return value
        event.wait(0.02)


def _sync_and_price(server: UpstreamServer, price: str = "2") -> Any:
    report = upstream_server_sync(server=server, actor="test")
    for name in report.created:
        tool_price_set(tool=name, credits=Decimal(price))
    return report


def _balance(tenant: Tenant) -> Decimal:
    return Wallet.objects.get(pk=tenant.agent.pk).balance


class Fleet:
    def __init__(
        self,
        demo: Any,
        pay: SdkUpstream,
        slow: SdkUpstream,
        ops: SdkUpstream,
        tokens: TokenEndpoint,
        acme: Tenant,
        globex: Tenant,
    ) -> None:
        self.demo, self.pay, self.slow, self.acme, self.globex = demo, pay, slow, acme, globex
        self.ops, self.tokens = ops, tokens
        self.default = UpstreamServer.objects.get(slug="default")
        self.pay_server = UpstreamServer.objects.get(slug="pay")
        self.slow_server = UpstreamServer.objects.get(slug="slow")
        self.ops_server = UpstreamServer.objects.get(slug="ops")


def _ops_credentials(client_id: str = OPS_CLIENT, secret: str = OPS_SECRET, **more: Any) -> dict[str, Any]:
    return {"token_url": "", "client_id": client_id, "client_secret": secret, "scope": "tools:call", **more}


@pytest.fixture
def fleet(settings: Any) -> Iterator[Fleet]:
    """Four SDK servers as records: ``default`` (the demo, open, no prefix), ``pay`` (bearer token, open to
    acme only), ``ops`` (an OAuth client-credentials token from the test's token endpoint, for the RFC 8707
    resource of its URL), ``slow`` (open, its ``slow.wait`` hangs until released); their tools synced and
    priced at 2."""
    settings.ENABLE_DOGFOOD_TOOL = False
    with (
        running_demo_upstream() as demo,
        running_sdk_upstream("pay", tokens={PAY_TOKEN, TENANT_TOKEN}) as pay,
        running_sdk_upstream("slow", hang="wait") as slow,
        running_token_endpoint({OPS_CLIENT: OPS_SECRET, ACME_CLIENT: ACME_SECRET}) as tokens,
        running_sdk_upstream("ops", verifier=(ops_verifier := IssuedTokenVerifier(tokens))) as ops,
    ):
        ops_verifier.resource = ops.url  # RFC 8707: only tokens issued for this server's URL are accepted
        acme, globex = make_tenant("acme"), make_tenant("globex")
        default = upstream_server_create(slug="default", name="Demo", url=demo.url, actor="test")
        pay_server = upstream_server_create(
            slug="pay",
            name="Payments",
            url=pay.url,
            tool_prefix="pay",
            default_category="payments",
            credentials_required=True,
            tenant_ids=[acme.agent.tenant_id],
            actor="test",
        )
        slow_server = upstream_server_create(
            slug="slow", name="Slow", url=slow.url, tool_prefix="slow", read_timeout=60.0, actor="test"
        )
        upstream_credential_set(
            server_id=pay_server.server_id, tenant_id=None, kind="bearer", secret={"token": PAY_TOKEN}, actor="test"
        )
        ops_server = upstream_server_create(
            slug="ops", name="Operations", url=ops.url, tool_prefix="ops", credentials_required=True, actor="test"
        )
        upstream_credential_set(
            server_id=ops_server.server_id,
            tenant_id=None,
            kind="oauth_client_credentials",
            secret=_ops_credentials(token_url=tokens.url, resource=ops.url),
            actor="test",
        )
        for server in (default, pay_server, slow_server, ops_server):
            _sync_and_price(UpstreamServer.objects.get(pk=server.pk))
        yield Fleet(demo, pay, slow, ops, tokens, acme, globex)


def _mcp(tenant: Tenant, body: dict[str, Any]) -> Any:
    """POST one JSON-RPC message to ``/mcp`` (Streamable HTTP, served without a session)."""
    return tenant.agent_client.post(
        "/mcp",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_ACCEPT="application/json, text/event-stream",
    )


def _receipt(answer: Any) -> Receipt:
    body = answer.json()
    receipt_id = body.get("receipt_id") or body.get("result", {}).get("_meta", {}).get("io.tollgate/receipt-id")
    if receipt_id is None:
        receipt_id = body["error"]["data"]["receipt_id"]
    return Receipt.objects.get(receipt_id=receipt_id)


def test_tools_of_three_servers_are_called_through_mcp_and_rest_and_receipts_name_each(fleet: Fleet) -> None:
    names = set(Tool.objects.filter(enabled=True).values_list("service_id", flat=True))
    assert {"notes.append", "pay.charge", "pay.append", "slow.quick", "slow.wait"} <= names
    charge = Tool.objects.get(service_id="pay.charge")
    assert (charge.server_id, charge.remote_name, charge.category) == (fleet.pay_server.server_id, "charge", "payments")

    caller = setup_caller(fleet.acme, balance=100)
    start = _balance(fleet.acme)
    listed = _mcp(fleet.acme, {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    assert {"notes.append", "pay.charge", "slow.quick"} <= {t["name"] for t in listed.json()["result"]["tools"]}
    answers = {
        "pay": _mcp(fleet.acme, tools_call_body("pay.charge", {"amount": 7}, permit_id=caller.permit_id)),
        "default": caller.invoke("notes.append", {"text": "hi"}),
        "slow": caller.invoke("slow.quick", {}),
    }
    for slug, answer in answers.items():
        assert answer.status_code == 200, answer.content
        server = UpstreamServer.objects.get(slug=slug)
        receipt = _receipt(answer)
        assert receipt.outcome == "success"
        assert (receipt.upstream_server_id, receipt.upstream_url) == (server.server_id, server.url)
        statement = receipt.signed_statement
        assert (statement["upstream_server_id"], statement["upstream_url"]) == (server.server_id, server.url)
        assert receipt_statement_problem(receipt) is None
        action = Action.objects.get(receipt=receipt)
        assert (action.upstream_server_id, action.upstream_url) == (server.server_id, server.url)
        claimed = AuditEvent.objects.get(event="tool_call.dispatch_claimed", detail__action_id=action.action_id)
        assert claimed.detail["upstream_server_id"] == server.server_id
        shown = fleet.acme.agent_client.get(f"/v1/receipts/{receipt.receipt_id}").json()
        assert (shown["upstream_server_id"], shown["upstream_url"]) == (server.server_id, server.url)
    assert fleet.pay.calls["charge"] == 1
    assert fleet.slow.calls["quick"] == 1
    assert _balance(fleet.acme) == start - 6

    # The pay server's token went to the pay server only; the agent's key went to none of them.
    pay_auth = {r.headers.get("authorization") for r in fleet.pay.requests}
    assert pay_auth == {f"Bearer {PAY_TOKEN}"}
    for request in [*fleet.demo.requests, *fleet.slow.requests]:
        assert "authorization" not in request.headers
    for request in [*fleet.demo.requests, *fleet.slow.requests, *fleet.pay.requests]:
        assert fleet.acme.agent_secret not in str(request.headers)
        assert "x-api-key" not in request.headers

    # The evidence keeps naming where the call went after the server's URL changes.
    receipt = _receipt(answers["pay"])
    upstream_server_update(server_id=fleet.pay_server.server_id, url="http://127.0.0.1:9/mcp", actor="test")
    receipt.refresh_from_db()
    assert receipt.upstream_url == fleet.pay.url
    assert receipt_statement_problem(receipt) is None


def test_a_tenant_not_allowed_on_a_server_is_refused_before_the_debit(fleet: Fleet) -> None:
    caller = setup_caller(fleet.globex, balance=100)
    start = _balance(fleet.globex)
    answer = caller.invoke("pay.charge", {"amount": 1})
    assert answer.status_code == 403, answer.content
    assert answer.json()["error"]["data"]["error"] == "upstream_server_not_allowed"
    assert _balance(fleet.globex) == start
    assert fleet.pay.calls["charge"] == 0
    assert _receipt(answer).outcome == "denied"
    # Its other servers' tools still work for it.
    assert caller.invoke("notes.append", {"text": "x"}).status_code == 200


def test_a_disabled_server_stops_its_permits_before_the_debit(fleet: Fleet) -> None:
    caller = setup_caller(fleet.acme, balance=100)
    assert caller.invoke("slow.quick", {}).status_code == 200  # cached on this server row now
    upstream_server_update(server_id=fleet.slow_server.server_id, enabled=False, actor="admin:ops")
    start = _balance(fleet.acme)
    answer = caller.invoke("slow.quick", {})
    assert answer.status_code == 403, answer.content
    assert answer.json()["error"]["data"]["error"] == "upstream_server_disabled"
    assert _balance(fleet.acme) == start
    assert fleet.slow.calls["quick"] == 1
    listed = _mcp(fleet.acme, {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).json()
    names = {t["name"] for t in listed["result"]["tools"]}
    assert "slow.quick" not in names
    assert "notes.append" in names
    # Closed to the tenant instead of disabled: the same, from the cache as from fresh rows.
    upstream_server_update(
        server_id=fleet.slow_server.server_id, enabled=True, tenant_ids=["someone-else"], actor="admin:ops"
    )
    answer = caller.invoke("slow.quick", {})
    assert answer.json()["error"]["data"]["error"] == "upstream_server_not_allowed"
    assert _balance(fleet.acme) == start


def test_a_wrong_credential_is_a_definite_refusal_refunded_and_a_tenants_own_replaces_the_servers(
    fleet: Fleet,
) -> None:
    caller = setup_caller(fleet.acme, balance=100)
    upstream_credential_set(
        server_id=fleet.pay_server.server_id, tenant_id=None, kind="bearer", secret={"token": "wrong"}, actor="test"
    )
    start = _balance(fleet.acme)
    answer = caller.invoke("pay.charge", {"amount": 1})
    receipt = _receipt(answer)
    assert (receipt.outcome, receipt.reason_code) == ("failed_refunded", "upstream_auth_refused")
    assert receipt.credits_charged == 0
    assert _balance(fleet.acme) == start
    assert fleet.pay.calls["charge"] == 0
    # Never re-sent on its own: the same key answers the stored refusal.
    key = Action.objects.get(receipt=receipt).idempotency_key
    again = caller.invoke("pay.charge", {"amount": 1}, key=key)
    assert _receipt(again).receipt_id == receipt.receipt_id
    assert fleet.pay.calls["charge"] == 0

    # The tenant's own credential replaces the server's for its calls.
    upstream_credential_set(
        server_id=fleet.pay_server.server_id,
        tenant_id=fleet.acme.agent.tenant_id,
        kind="headers",
        secret={"headers": {"Authorization": f"Bearer {TENANT_TOKEN}"}},
        actor="test",
    )
    answer = caller.invoke("pay.charge", {"amount": 1})
    assert _receipt(answer).outcome == "success", answer.content
    assert fleet.pay.requests[-1].headers["authorization"] == f"Bearer {TENANT_TOKEN}"
    # Stored encrypted: the token is not in the row.
    for row in UpstreamCredential.objects.all():
        assert TENANT_TOKEN.encode() not in bytes(row.secret)
        assert PAY_TOKEN.encode() not in bytes(row.secret)


def test_a_server_requiring_credentials_refuses_a_tenant_without_any_before_the_debit(fleet: Fleet) -> None:
    assert upstream_credential_clear(server_id=fleet.pay_server.server_id, tenant_id=None, actor="test")
    caller = setup_caller(fleet.acme, balance=100)
    start = _balance(fleet.acme)
    answer = caller.invoke("pay.charge", {"amount": 1})
    assert answer.status_code == 403, answer.content
    assert answer.json()["error"]["data"]["error"] == "upstream_credentials_missing"
    assert _balance(fleet.acme) == start


def test_sync_refuses_a_colliding_name_and_disables_what_vanished(fleet: Fleet) -> None:
    # A server exposing "notes.*" collides with the default server's notes.append.
    notes = upstream_server_create(slug="notes", name="Notes", url=fleet.pay.url, tool_prefix="notes", actor="test")
    upstream_credential_set(
        server_id=notes.server_id, tenant_id=None, kind="bearer", secret={"token": PAY_TOKEN}, actor="test"
    )
    out, err = StringIO(), StringIO()
    call_command("sync_tools", "--server", "notes", stdout=out, stderr=err)
    assert "refused: notes.append is already a tool of server default" in err.getvalue()
    assert "new: notes.charge" in out.getvalue()
    assert Tool.objects.get(service_id="notes.append").server_id == fleet.default.server_id  # nothing renamed
    event = AuditEvent.objects.filter(event="tools.synced").order_by("-seq").first()
    assert event is not None
    assert "notes.append" in event.detail["refused"]

    # Without credentials the sync fails with the server's refusal and changes nothing.
    assert upstream_credential_clear(server_id=notes.server_id, tenant_id=None, actor="test")
    with pytest.raises(UpstreamError):
        upstream_server_sync(server=UpstreamServer.objects.get(pk=notes.pk), actor="test")


def test_one_hanging_server_does_not_hold_the_others(fleet: Fleet) -> None:
    caller = setup_caller(fleet.acme, balance=100)
    hung: dict[str, Any] = {}

    def in_flight() -> None:
        try:
            hung["answer"] = caller.invoke("slow.wait", {})
        finally:
            connection.close()

    thread = threading.Thread(target=in_flight)
    thread.start()
    try:
        wait_for(lambda: fleet.slow.calls["wait"] == 1)
        # While slow.wait hangs, the other servers answer (their own clients and connection pools).
        for i in range(5):
            assert caller.invoke("notes.append", {"text": f"n{i}"}).status_code == 200
            assert caller.rpc("pay.charge", {"amount": i}).status_code == 200
        assert thread.is_alive()
        assert "answer" not in hung
    finally:
        fleet.slow.release.set()
        thread.join(30)
    assert hung["answer"].status_code == 200
    assert _receipt(hung["answer"]).upstream_server_id == fleet.slow_server.server_id


def test_the_sweep_waits_the_timeouts_of_the_server_the_call_was_claimed_on(fleet: Fleet, settings: Any) -> None:
    settings.SWEEP_MARGIN_SECONDS = 30
    caller = setup_caller(fleet.acme, balance=100)

    def in_flight() -> None:
        try:
            caller.invoke("slow.wait", {}, key="sweep-me")
        finally:
            connection.close()

    thread = threading.Thread(target=in_flight)
    thread.start()
    try:
        action = wait_for(lambda: Action.objects.filter(idempotency_key="sweep-me", state="dispatch_claimed").first())
        assert action is not None
        assert action.upstream_read_timeout == 60.0
        forty_ago = timezone.now() - timedelta(seconds=40)
        # Claimed 40 s ago on a server with a 60 s read timeout: 2 + 120 + 30 s not yet passed.
        Action.objects.filter(pk=action.pk).update(claimed_at=forty_ago)
        assert action_sweep() == []
        # The same claim on a server with 1 s timeouts (1 + 2 + 30 s): lost.
        Action.objects.filter(pk=action.pk).update(upstream_connect_timeout=1, upstream_read_timeout=1)
        assert action_sweep() == [action.action_id]
    finally:
        fleet.slow.release.set()
        thread.join(30)
    assert Action.objects.get(pk=action.pk).state == "delivery_uncertain"


# --- The operator API (/v1/upstreams) -------------------------------------------------------------------


@pytest.mark.django_db
def test_operator_api_manages_servers_and_write_only_credentials(operator_client: Any, tenant: Tenant) -> None:
    with running_sdk_upstream("pay", tokens={PAY_TOKEN}) as pay:
        body = {"slug": "pay", "url": pay.url, "tool_prefix": "pay", "credentials_required": True}
        r = operator_client.post("/v1/upstreams", body, format="json")
        assert r.status_code == 201, r.content
        assert r.json()["credentials"] == []
        assert operator_client.post("/v1/upstreams", {**body, "slug": "pay2"}, format="json").status_code == 409

        # A failed sync (no credentials yet: the server answers 401) changes nothing and says why, in a word
        # (it keeps the server's last state for the console, as every probe does).
        r = operator_client.post("/v1/upstreams/pay/sync")
        assert r.status_code == 502, r.content
        assert r.json()["detail"]["error_class"] == "auth_refused"
        state = UpstreamServerState.objects.get(server__slug="pay")
        assert (state.reachable, state.error_class, state.checked_by) == (False, "auth_refused", "sync")
        assert operator_client.post("/v1/upstreams/pay/test").json() == {
            "reachable": False,
            "protocol_version": None,
            "error": "auth_refused",
        }

        r = operator_client.put("/v1/upstreams/pay/credentials", {"kind": "bearer", "token": PAY_TOKEN}, format="json")
        assert r.status_code == 204, r.content
        detail = operator_client.get("/v1/upstreams/pay")
        assert detail.json()["credentials"] == [None]
        assert PAY_TOKEN not in detail.content.decode()
        assert PAY_TOKEN not in str(AuditEvent.objects.filter(event="upstream_credential.set").values("detail"))
        probe = operator_client.post("/v1/upstreams/pay/test").json()
        assert probe["reachable"] is True
        assert probe["protocol_version"]
        state = UpstreamServerState.objects.get(server__slug="pay")
        assert (state.reachable, state.protocol_version, state.checked_by) == (True, probe["protocol_version"], "api")

        r = operator_client.post("/v1/upstreams/pay/sync")
        assert r.status_code == 200, r.content
        assert sorted(r.json()["created"]) == ["pay.append", "pay.charge", "pay.quick"]

        r = operator_client.patch("/v1/upstreams/pay", {"enabled": False, "tenant_ids": ["t1"]}, format="json")
        assert (r.json()["enabled"], r.json()["tenant_ids"]) == (False, ["t1"])
        event = AuditEvent.objects.filter(event="upstream_server.updated").order_by("-seq").first()
        assert event is not None
        assert event.detail["before"]["enabled"] is True
        assert event.detail["actor"].startswith("key:")
        assert operator_client.delete("/v1/upstreams/pay/credentials").status_code == 204
        assert operator_client.get("/v1/upstreams/pay").json()["credentials"] == []

    for secret in ({"kind": "bearer", "token": "two\nlines"}, {"kind": "headers", "headers": {"Host": "evil"}}):
        r = operator_client.put("/v1/upstreams/pay/credentials", secret, format="json")
        assert r.status_code == 422, r.content
        assert r.json()["detail"][0]["type"] == "upstream_server_invalid"
    bad = operator_client.patch("/v1/upstreams/pay", {"read_timeout": 0, "tool_prefix": "a.b"}, format="json")
    assert bad.status_code == 422
    assert {tuple(e["loc"]) for e in bad.json()["detail"]} == {("body", "read_timeout"), ("body", "tool_prefix")}
    # At most 1,000 tenant ids (null opens a server to all): a body the schema allows stays under the 1 MiB limit.
    many = operator_client.patch("/v1/upstreams/pay", {"tenant_ids": [f"t{i}" for i in range(1001)]}, format="json")
    assert many.status_code == 422, many.content
    assert operator_client.get("/v1/upstreams/nope").status_code == 404
    # An agent's or a sponsor's key may not read or change servers.
    for client in (tenant.agent_client, tenant.sponsor_client):
        assert client.get("/v1/upstreams").status_code == 403
        assert (
            client.put("/v1/upstreams/pay/credentials", {"kind": "bearer", "token": "x"}, format="json").status_code
            == 403
        )


# --- UPSTREAM_MCP_URL as the server "default"; the secrets' key -------------------------------------------


@pytest.mark.django_db
def test_upstream_mcp_url_becomes_the_server_default_and_its_tools_keep_their_names(settings: Any) -> None:
    from mcpgateway import services
    from mcpgateway.services.upstreams import upstream_default_ensure

    settings.ENABLE_DOGFOOD_TOOL = False
    with running_demo_upstream() as demo:
        # Tools registered before servers were records (no server) ...
        settings.UPSTREAM_MCP_URL = demo.url
        call_command("sync_tools", "--url", demo.url, stdout=StringIO())
        assert Tool.objects.get(service_id="notes.append").server_id is None
        # ... are the server default's after the next sync, under the same names.
        out = StringIO()
        call_command("sync_tools", stdout=out)
        default = UpstreamServer.objects.get(slug="default")
        assert (default.url, default.tool_prefix, default.tenant_ids) == (demo.url, "", None)
        assert Tool.objects.get(service_id="notes.append").server_id == default.server_id
        assert Tool.objects.get(service_id="notes.append").remote_name == "notes.append"
        assert f"from server default ({demo.url})" in out.getvalue()
        assert services.tool_get("notes.append") is not None
    # A restart with another URL or timeouts updates it; what the operator set stays.
    upstream_server_update(server_id=default.server_id, tenant_ids=["t1"], actor="admin:ops")
    settings.UPSTREAM_MCP_URL = "http://127.0.0.1:9/mcp"
    settings.UPSTREAM_READ_TIMEOUT = 7
    upstream_default_ensure()
    default.refresh_from_db()
    assert (default.url, default.read_timeout, default.tenant_ids) == ("http://127.0.0.1:9/mcp", 7.0, ["t1"])
    assert upstream_default_ensure() is not None
    assert AuditEvent.objects.filter(event="upstream_server.updated", detail__actor="UPSTREAM_MCP_URL").count() == 1


@pytest.mark.django_db
def test_upstream_mcp_url_cannot_take_the_empty_prefix_another_server_has(settings: Any) -> None:
    settings.ENABLE_DOGFOOD_TOOL = False
    upstream_server_create(slug="main", name="Main", url="http://127.0.0.1:9/mcp", actor="admin:ops")
    settings.UPSTREAM_MCP_URL = "http://127.0.0.1:10/mcp"
    with pytest.raises(CommandError, match="another server has the empty tool prefix"):
        call_command("sync_tools", stdout=StringIO())
    assert not UpstreamServer.objects.filter(slug="default").exists()


def test_secrets_are_encrypted_under_a_key_file_created_0600(settings: Any, tmp_path: Any) -> None:
    from cryptography.fernet import Fernet

    from mcpgateway.upstream import secrets

    settings.UPSTREAM_SECRETS_KEY = ""
    settings.UPSTREAM_SECRETS_KEY_FILE = str(tmp_path / "keys" / "upstream.key")
    blob = secrets.secret_encrypt({"token": "s3cret"})
    assert b"s3cret" not in blob
    key_file = tmp_path / "keys" / "upstream.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert secrets.secret_decrypt(blob) == {"token": "s3cret"}
    # Another key (from the environment) cannot read it.
    settings.UPSTREAM_SECRETS_KEY = Fernet.generate_key().decode()
    with pytest.raises(secrets.SecretUnreadable):
        secrets.secret_decrypt(blob)


# --- OAuth 2.0 client credentials (the server ops) -----------------------------------------------------------


def _bearers(upstream: SdkUpstream) -> list[str]:
    return [r.headers["authorization"].removeprefix("Bearer ") for r in upstream.requests]


def _no_secret_anywhere(*secrets: str) -> None:
    """Neither the client secret nor a token is in the audit log, the receipts, the actions or the credentials."""
    stored = [
        str(list(AuditEvent.objects.values_list("detail", flat=True))),
        str(list(Receipt.objects.values_list("signed_statement", "reason_code"))),
        str(list(Action.objects.values_list("response", flat=True))),
        str([bytes(row) for row in UpstreamCredential.objects.values_list("secret", flat=True)]),
    ]
    for secret in secrets:
        for text in stored:
            assert secret not in text


def test_an_oauth_servers_tool_is_called_through_mcp_and_rest_with_one_token_for_both(fleet: Fleet) -> None:
    caller = setup_caller(fleet.acme, balance=100)
    start = _balance(fleet.acme)
    answers = [
        _mcp(fleet.acme, tools_call_body("ops.charge", {"amount": 3}, permit_id=caller.permit_id)),
        caller.invoke("ops.charge", {"amount": 4}),
    ]
    for answer in answers:
        assert answer.status_code == 200, answer.content
        receipt = _receipt(answer)
        assert receipt.outcome == "success"
        assert (receipt.upstream_server_id, receipt.upstream_url) == (fleet.ops_server.server_id, fleet.ops.url)
        assert receipt.signed_statement["upstream_server_id"] == fleet.ops_server.server_id
        assert receipt_statement_problem(receipt) is None
    assert fleet.ops.calls["charge"] == 2
    assert _balance(fleet.acme) == start - 4

    # The sync fetched the first token; the calls reused it (cached until near its expiry).
    issued = fleet.tokens.issued_to(OPS_CLIENT)
    assert len(issued) == 1
    assert set(_bearers(fleet.ops)) == set(issued)
    # The token request: client_secret_basic, client_credentials, the scope and the RFC 8707 resource.
    assert fleet.tokens.forms == [
        {"grant_type": "client_credentials", "scope": "tools:call", "resource": fleet.ops.url}
    ]
    basic = fleet.tokens.authorization[0]
    assert basic is not None
    assert basic.startswith("Basic ")
    assert base64.b64decode(basic.removeprefix("Basic ")).decode() == f"{OPS_CLIENT}:{OPS_SECRET}"
    # The token went to the ops server only; the secret went to the token endpoint only.
    for request in [*fleet.demo.requests, *fleet.slow.requests, *fleet.pay.requests]:
        assert issued[0] not in str(request.headers)
    for request in fleet.ops.requests:
        assert OPS_SECRET not in str(request.headers)
    _no_secret_anywhere(OPS_SECRET, issued[0])


def test_a_wrong_client_secret_is_refused_before_the_debit_and_the_key_stays_free(
    fleet: Fleet, operator_client: Any
) -> None:
    caller = setup_caller(fleet.acme, balance=100)
    fleet.tokens.clients[OPS_CLIENT] = "rotated-at-the-provider"
    upstream_credential_set(
        server_id=fleet.ops_server.server_id,
        tenant_id=None,
        kind="oauth_client_credentials",
        secret=_ops_credentials(token_url=fleet.tokens.url, resource=fleet.ops.url),
        actor="test",
    )
    start = _balance(fleet.acme)
    answer = caller.invoke("ops.charge", {"amount": 1}, key="ops-1")
    assert answer.status_code == 502, answer.content
    detail = answer.json()["detail"]
    assert (detail["error"], detail["failure"], detail["oauth_error"]) == (
        "upstream_credentials_unavailable",
        "refused",
        "invalid_client",
    )
    assert OPS_SECRET not in answer.content.decode()
    assert _balance(fleet.acme) == start
    assert not Action.objects.filter(idempotency_key="ops-1").exists()
    assert fleet.ops.calls["charge"] == 0
    over_mcp = _mcp(fleet.acme, tools_call_body("ops.charge", {"amount": 1}, permit_id=caller.permit_id))
    assert over_mcp.json()["error"]["data"]["error"] == "upstream_credentials_unavailable"
    # The connection test says why in a word; the sync fails and changes nothing.
    assert operator_client.post("/v1/upstreams/ops/test").json()["error"] == "credentials_unavailable"
    assert operator_client.post("/v1/upstreams/ops/sync").json()["detail"]["error_class"] == "credentials_unavailable"

    # Once the operator sets the right secret, the same idempotency key is accepted and charged once.
    r = operator_client.put(
        "/v1/upstreams/ops/credentials",
        {
            "kind": "oauth_client_credentials",
            **_ops_credentials(secret="rotated-at-the-provider", token_url=fleet.tokens.url, resource=fleet.ops.url),
        },
        format="json",
    )
    assert r.status_code == 204, r.content
    answer = caller.invoke("ops.charge", {"amount": 1}, key="ops-1")
    assert _receipt(answer).outcome == "success", answer.content
    assert _balance(fleet.acme) == start - 2
    _no_secret_anywhere(OPS_SECRET, "rotated-at-the-provider")


def test_an_unreachable_token_endpoint_is_503_before_the_debit(fleet: Fleet) -> None:
    from tests.upstream_server import free_port

    caller = setup_caller(fleet.acme, balance=100)
    upstream_credential_set(
        server_id=fleet.ops_server.server_id,
        tenant_id=None,
        kind="oauth_client_credentials",
        secret=_ops_credentials(token_url=f"http://127.0.0.1:{free_port()}/token"),
        actor="test",
    )
    start = _balance(fleet.acme)
    answer = caller.invoke("ops.charge", {"amount": 1}, key="ops-down")
    assert answer.status_code == 503, answer.content
    assert answer.json()["detail"]["failure"] == "unreachable"
    assert answer["Retry-After"]
    assert _balance(fleet.acme) == start
    assert not Action.objects.filter(idempotency_key="ops-down").exists()


def test_a_token_the_upstream_refuses_is_a_refund_and_the_next_call_fetches_a_fresh_one(fleet: Fleet) -> None:
    caller = setup_caller(fleet.acme, balance=100)
    assert _receipt(caller.invoke("ops.quick", {})).outcome == "success"
    first = fleet.tokens.issued_to(OPS_CLIENT)
    fleet.tokens.revoke_all()  # revoked (or expired early) at the provider: the gateway still holds it
    start = _balance(fleet.acme)
    answer = caller.invoke("ops.charge", {"amount": 1})
    receipt = _receipt(answer)
    assert (receipt.outcome, receipt.reason_code) == ("failed_refunded", "upstream_auth_refused")
    assert _balance(fleet.acme) == start
    assert fleet.ops.calls["charge"] == 0
    # Not re-sent on its own: the key answers the stored refusal.
    key = Action.objects.get(receipt=receipt).idempotency_key
    assert _receipt(caller.invoke("ops.charge", {"amount": 1}, key=key)).receipt_id == receipt.receipt_id
    assert fleet.ops.calls["charge"] == 0
    # The refused token was dropped: the next call fetches a fresh one and succeeds.
    answer = caller.invoke("ops.charge", {"amount": 1})
    assert _receipt(answer).outcome == "success", answer.content
    fresh = [t for t in fleet.tokens.issued_to(OPS_CLIENT) if t not in first]
    assert len(fresh) == 1
    assert _bearers(fleet.ops)[-1] == fresh[0]

    # An expired token (the upstream honours expiry) is the same.
    fleet.tokens.tokens[fresh[0]].expires_at = 0
    assert _receipt(caller.invoke("ops.charge", {"amount": 1})).reason_code == "upstream_auth_refused"
    assert _receipt(caller.invoke("ops.charge", {"amount": 1})).outcome == "success"
    assert len(fleet.tokens.issued_to(OPS_CLIENT)) == 3


def test_a_token_near_its_expiry_is_fetched_again_before_the_call(
    fleet: Fleet, monkeypatch: Any, settings: Any
) -> None:
    from mcpgateway.upstream import oauth

    settings.UPSTREAM_OAUTH_EXPIRY_MARGIN = 60
    caller = setup_caller(fleet.acme, balance=100)
    assert _receipt(caller.invoke("ops.quick", {})).outcome == "success"
    assert len(fleet.tokens.forms) == 1  # the sync's token serves the call
    real = oauth.now
    monkeypatch.setattr(oauth, "now", lambda: real() + 3600 - 120)  # two minutes left: outside the margin
    assert _receipt(caller.invoke("ops.quick", {})).outcome == "success"
    assert len(fleet.tokens.forms) == 1
    monkeypatch.setattr(oauth, "now", lambda: real() + 3600 - 30)  # thirty seconds left: inside it
    assert _receipt(caller.invoke("ops.quick", {})).outcome == "success"
    assert len(fleet.tokens.forms) == 2
    assert _bearers(fleet.ops)[-1] == fleet.tokens.issued_to(OPS_CLIENT)[-1]


def _burst_without_a_token(fleet: Fleet, callers: list[Any]) -> list[Any]:
    """Each caller calls ``ops.quick`` at once, with no token in the process, while the token endpoint holds its
    answers until the calls have piled up; their answers."""
    from common.cache import clear_all

    clear_all()
    fleet.tokens.gate.clear()
    answers: list[Any] = []

    def call(caller: Any) -> None:
        try:
            answers.append(caller.invoke("ops.quick", {}))
        finally:
            connection.close()

    threads = [threading.Thread(target=call, args=(caller,)) for caller in callers]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(fleet.tokens.forms) == 2)  # the sync's request, then the calls' first
    threading.Event().wait(0.5)  # room for more requests to arrive, if the calls did not wait for the first
    fleet.tokens.gate.set()
    for thread in threads:
        thread.join(60)
    return answers


def test_many_concurrent_calls_fetch_the_token_once(fleet: Fleet) -> None:
    callers = [setup_caller(fleet.acme, balance=100) for _ in range(6)]
    answers = _burst_without_a_token(fleet, callers)
    assert [_receipt(a).outcome for a in answers] == ["success"] * 6
    assert len(fleet.tokens.forms) == 2
    assert fleet.ops.calls["quick"] == 6


def test_the_token_is_fetched_outside_any_transaction(fleet: Fleet, monkeypatch: Any) -> None:
    from common.cache import clear_all
    from mcpgateway.services import upstreams

    seen: list[bool] = []
    real = upstreams.token_fetch

    def fetch(*args: Any, **kwargs: Any) -> Any:
        seen.append(connection.in_atomic_block)
        return real(*args, **kwargs)

    monkeypatch.setattr(upstreams, "token_fetch", fetch)
    caller = setup_caller(fleet.acme, balance=100)
    clear_all()
    assert _receipt(caller.invoke("ops.quick", {})).outcome == "success"
    fleet.tokens.revoke_all()
    assert _receipt(caller.invoke("ops.quick", {})).reason_code == "upstream_auth_refused"
    assert _receipt(caller.invoke("ops.quick", {})).outcome == "success"
    assert seen == [False, False]


def test_concurrent_calls_share_one_failed_fetch(fleet: Fleet) -> None:
    callers = [setup_caller(fleet.acme, balance=100) for _ in range(4)]
    start = _balance(fleet.acme)
    fleet.tokens.clients[OPS_CLIENT] = "rotated-at-the-provider"
    answers = _burst_without_a_token(fleet, callers)
    assert [a.json()["detail"]["oauth_error"] for a in answers] == ["invalid_client"] * 4
    assert len(fleet.tokens.forms) == 2  # the callers that waited for the failed fetch did not fetch again
    assert _balance(fleet.acme) == start
    # The next call, after that fetch, asks again (nothing is remembered past it).
    assert callers[0].invoke("ops.quick", {}).status_code == 502
    assert len(fleet.tokens.forms) == 3


def test_the_client_secret_and_tokens_are_in_no_log_metric_or_health_answer(
    fleet: Fleet, caplog: Any, operator_client: Any, anon_client: Any
) -> None:
    import logging

    caplog.set_level(logging.DEBUG)
    caller = setup_caller(fleet.acme, balance=100)
    assert _receipt(caller.invoke("ops.quick", {})).outcome == "success"
    fleet.tokens.revoke_all()
    assert _receipt(caller.invoke("ops.quick", {})).reason_code == "upstream_auth_refused"
    fleet.tokens.clients[OPS_CLIENT] = "rotated-at-the-provider"
    assert caller.invoke("ops.quick", {}).status_code == 502
    shown = [
        caplog.text,
        operator_client.get("/metrics").content.decode(),
        anon_client.get("/health/ready").content.decode(),
        operator_client.post("/v1/upstreams/ops/test").content.decode(),
    ]
    for secret in [OPS_SECRET, *fleet.tokens.tokens]:
        for text in shown:
            assert secret not in text
    _no_secret_anywhere(OPS_SECRET, *fleet.tokens.tokens)


def test_a_tenants_own_client_credentials_replace_the_servers_for_its_calls(fleet: Fleet) -> None:
    acme, globex = setup_caller(fleet.acme, balance=100), setup_caller(fleet.globex, balance=100)
    upstream_credential_set(
        server_id=fleet.ops_server.server_id,
        tenant_id=fleet.acme.agent.tenant_id,
        kind="oauth_client_credentials",
        secret=_ops_credentials(ACME_CLIENT, ACME_SECRET, token_url=fleet.tokens.url, resource=fleet.ops.url),
        actor="test",
    )
    assert _receipt(acme.invoke("ops.quick", {})).outcome == "success"
    assert fleet.tokens.tokens[_bearers(fleet.ops)[-1]].client_id == ACME_CLIENT
    assert _receipt(globex.invoke("ops.quick", {})).outcome == "success"
    assert fleet.tokens.tokens[_bearers(fleet.ops)[-1]].client_id == OPS_CLIENT
    # Each holder's token is its own: acme's next call reuses acme's, not the server's.
    assert _receipt(acme.invoke("ops.quick", {})).outcome == "success"
    assert fleet.tokens.tokens[_bearers(fleet.ops)[-1]].client_id == ACME_CLIENT
    assert len(fleet.tokens.issued_to(ACME_CLIENT)) == 1
    _no_secret_anywhere(ACME_SECRET, OPS_SECRET)


@pytest.mark.django_db
def test_operator_api_sets_oauth_client_credentials_write_only_and_refuses_bad_ones(operator_client: Any) -> None:
    r = operator_client.post("/v1/upstreams", {"slug": "ops", "url": "http://127.0.0.1:9/mcp"}, format="json")
    assert r.status_code == 201, r.content
    body = {
        "kind": "oauth_client_credentials",
        "token_url": "https://auth.example/token",
        "client_id": "gw",
        "client_secret": "s3cret-value",
        "scope": "a b",
        "resource": "https://tools.example/mcp",
    }
    assert operator_client.put("/v1/upstreams/ops/credentials", body, format="json").status_code == 204
    shown = operator_client.get("/v1/upstreams/ops")
    assert "s3cret-value" not in shown.content.decode()
    assert [(c["tenant_id"], c["kind"]) for c in shown.json()["credentials_set"]] == [
        (None, "oauth_client_credentials")
    ]
    assert shown.json()["credentials_set"][0]["set_at"]
    event = AuditEvent.objects.filter(event="upstream_credential.set").get()
    assert event.detail["kind"] == "oauth_client_credentials"
    assert "s3cret-value" not in str(event.detail)
    stored = UpstreamCredential.objects.get()
    assert b"s3cret-value" not in bytes(stored.secret)
    for bad, field in [
        ({**body, "token_url": "ftp://auth.example/token"}, "token_url"),
        ({k: v for k, v in body.items() if k != "client_secret"}, "client_secret"),
        ({**body, "client_id": ""}, "client_id"),
        ({**body, "resource": "https://tools.example/mcp#frag"}, "resource"),
        ({**body, "scope": 'a "b"'}, "scope"),
        ({"kind": "oauth_client_credentials"}, "token_url"),
        ({**body, "client_secret": "a\x00b"}, "client_secret"),
        ({**body, "token_url": 5}, "token_url"),
        ({**body, "client_id": ["gw"]}, "client_id"),
        ({**body, "resource": "x" * 3000}, "resource"),
    ]:
        r = operator_client.put("/v1/upstreams/ops/credentials", bad, format="json")
        assert r.status_code == 422, (field, r.content)
        assert field in {e["loc"][-1] for e in r.json()["detail"]}


def test_token_endpoint_answers_that_are_not_a_bearer_token_are_malformed() -> None:
    from mcpgateway.upstream.oauth import TokenUnavailable, _token_of

    good = {"access_token": "abc", "token_type": "Bearer", "expires_in": 60}
    token = _token_of(200, json.dumps(good).encode(), obtained_at=100.0)
    assert (token.value, token.expires_at) == ("abc", 160.0)
    assert "abc" not in repr(token)
    assert _token_of(200, json.dumps({**good, "expires_in": None}).encode(), obtained_at=0).expires_at == 300.0
    for status, answer, failure in [
        (200, {**good, "token_type": "mac"}, "malformed"),
        (200, {**good, "expires_in": -1}, "malformed"),
        (200, {**good, "expires_in": True}, "malformed"),
        (200, {**good, "access_token": "a b"}, "malformed"),
        (200, {**good, "access_token": "é"}, "malformed"),
        (200, ["not", "an", "object"], "malformed"),
        (400, {"error": "invalid_scope", "error_description": "secret-ish text"}, "refused"),
        (401, {"error": "<script>"}, "refused"),
        (503, {}, "unavailable"),
    ]:
        with pytest.raises(TokenUnavailable) as caught:
            _token_of(status, json.dumps(answer).encode(), obtained_at=0)
        assert caught.value.failure == failure
        assert "secret-ish" not in caught.value.reason
        assert "<script>" not in caught.value.reason


# --- The legacy HTTP+SSE transport ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_server_speaking_http_sse_is_synced_called_governed_and_probed(
    operator_client: Any, anon_client: Any, settings: Any
) -> None:
    settings.ENABLE_DOGFOOD_TOOL = False
    settings.UPSTREAM_STATE_READINESS_INTERVAL = 0  # each readiness call probes (bounded otherwise)
    acme = make_tenant("acme")
    with running_sdk_upstream("legacy", sse=True, tokens={"legacy-token"}) as legacy:
        body = {"slug": "legacy", "url": legacy.url, "transport": "http_sse", "tool_prefix": "old"}
        bad = operator_client.post("/v1/upstreams", {**body, "transport": "websocket"}, format="json")
        assert bad.status_code == 422, bad.content
        r = operator_client.post("/v1/upstreams", body, format="json")
        assert r.status_code == 201, r.content
        assert r.json()["transport"] == "http_sse"
        assert AuditEvent.objects.get(event="upstream_server.created").detail["transport"] == "http_sse"
        r = operator_client.put(
            "/v1/upstreams/legacy/credentials", {"kind": "bearer", "token": "legacy-token"}, format="json"
        )
        assert r.status_code == 204, r.content

        r = operator_client.post("/v1/upstreams/legacy/sync")
        assert r.status_code == 200, r.content
        assert sorted(r.json()["created"]) == ["old.append", "old.charge", "old.quick"]
        for name in r.json()["created"]:
            tool_price_set(tool=name, credits=Decimal("2"))
        probe = operator_client.post("/v1/upstreams/legacy/test").json()
        assert (probe["reachable"], probe["protocol_version"]) == (True, "2024-11-05")
        ready = anon_client.get("/health/ready").json()
        assert [(s["slug"], s["reachable"], s["protocol_version"]) for s in ready["upstream_servers"]] == [
            ("legacy", True, "2024-11-05")
        ]

        caller = setup_caller(acme, balance=100)
        start = _balance(acme)
        answers = [
            caller.invoke("old.charge", {"amount": 5}),
            _mcp(acme, tools_call_body("old.charge", {"amount": 6}, permit_id=caller.permit_id)),
        ]
        server = UpstreamServer.objects.get(slug="legacy")
        for answer in answers:
            assert answer.status_code == 200, answer.content
            receipt = _receipt(answer)
            assert receipt.outcome == "success"
            assert (receipt.upstream_server_id, receipt.upstream_url) == (server.server_id, legacy.url)
            assert receipt_statement_problem(receipt) is None
        assert legacy.calls["charge"] == 2
        assert _balance(acme) == start - 4
        assert {r.headers.get("authorization") for r in legacy.requests} == {"Bearer legacy-token"}

        # Its 401 is the same definite refusal as over Streamable HTTP: refunded, never re-sent.
        upstream_credential_set(
            server_id=server.server_id, tenant_id=None, kind="bearer", secret={"token": "wrong"}, actor="test"
        )
        receipt = _receipt(caller.invoke("old.charge", {"amount": 1}))
        assert (receipt.outcome, receipt.reason_code) == ("failed_refunded", "upstream_auth_refused")
        assert _balance(acme) == start - 4
        assert legacy.calls["charge"] == 2

    # The server gone: a call is not sent (refunded), and readiness says unreachable.
    upstream_credential_set(
        server_id=server.server_id, tenant_id=None, kind="bearer", secret={"token": "legacy-token"}, actor="test"
    )
    receipt = _receipt(caller.invoke("old.charge", {"amount": 1}))
    assert (receipt.outcome, receipt.reason_code) == ("failed_refunded", "upstream_not_sent")
    assert _balance(acme) == start - 4
    ready = anon_client.get("/health/ready").json()
    assert [(s["reachable"], s["error"]) for s in ready["upstream_servers"]] == [(False, "unreachable")]


# --- Rotating the key that encrypts credentials -----------------------------------------------------------------


def test_rotating_the_secrets_key_keeps_calls_working_and_leaves_nothing_under_the_old_key(
    fleet: Fleet, settings: Any
) -> None:
    from cryptography.fernet import Fernet

    from common.cache import clear_all
    from mcpgateway.upstream import secrets

    old_key, new_key = settings.UPSTREAM_SECRETS_KEY, Fernet.generate_key().decode()
    if not old_key:  # the key file's key, named as a previous key the way an operator would paste it
        old_key = Path(settings.UPSTREAM_SECRETS_KEY_FILE).read_text().strip()
    caller = setup_caller(fleet.acme, balance=100)
    settings.UPSTREAM_SECRETS_KEY, settings.UPSTREAM_SECRETS_PREVIOUS_KEYS = new_key, [old_key]
    clear_all()  # every process reads the credential again, now under the new configuration
    assert _receipt(caller.invoke("pay.charge", {"amount": 1})).outcome == "success"  # read under the previous key
    stored = bytes(UpstreamCredential.objects.get(server=fleet.pay_server, tenant_id=None).secret)
    assert not secrets.secret_is_current(stored)

    stored_count = UpstreamCredential.objects.count()  # the fleet's servers' credentials, all under the old key
    out = StringIO()
    call_command("rotate_upstream_secrets", stdout=out)
    assert f"re-encrypted {stored_count} credential(s) under the current key; 0 already were" in out.getvalue()
    assert PAY_TOKEN not in out.getvalue()
    event = AuditEvent.objects.filter(event="upstream_credential.secrets_rotated").latest("created_at")
    assert (event.detail["reencrypted"], event.detail["current"]) == (stored_count, 0)
    assert all(secrets.secret_is_current(bytes(c.secret)) for c in UpstreamCredential.objects.all())

    settings.UPSTREAM_SECRETS_PREVIOUS_KEYS = []  # the old key is gone from every instance
    clear_all()
    assert _receipt(caller.invoke("pay.charge", {"amount": 1})).outcome == "success"
    assert fleet.pay.requests[-1].headers["authorization"] == f"Bearer {PAY_TOKEN}"
    out = StringIO()
    call_command("rotate_upstream_secrets", stdout=out)  # a second run finds nothing to do
    assert f"re-encrypted 0 credential(s) under the current key; {stored_count} already were" in out.getvalue()


def test_a_rotation_that_cannot_read_one_credential_changes_nothing(settings: Any) -> None:
    from cryptography.fernet import Fernet

    key_a, key_b, key_c = (Fernet.generate_key().decode() for _ in range(3))
    settings.UPSTREAM_SECRETS_KEY, settings.UPSTREAM_SECRETS_PREVIOUS_KEYS = key_a, []
    server = upstream_server_create(slug="pay", name="Payments", url="http://127.0.0.1:9/mcp", actor="test")
    tenant = make_tenant("acme")
    upstream_credential_set(server_id=server.server_id, tenant_id=None, kind="bearer", secret={"token": "a"}, actor="t")
    settings.UPSTREAM_SECRETS_KEY = key_b
    upstream_credential_set(
        server_id=server.server_id, tenant_id=tenant.agent.tenant_id, kind="bearer", secret={"token": "b"}, actor="t"
    )
    before = {c.credential_id: bytes(c.secret) for c in UpstreamCredential.objects.all()}
    # Key a is forgotten: the server's credential is unreadable, so neither is re-encrypted under key c.
    settings.UPSTREAM_SECRETS_KEY, settings.UPSTREAM_SECRETS_PREVIOUS_KEYS = key_c, [key_b]
    with pytest.raises(CommandError, match="Nothing changed: no configured key decrypts the credentials ucr_"):
        call_command("rotate_upstream_secrets", stdout=StringIO())
    assert {c.credential_id: bytes(c.secret) for c in UpstreamCredential.objects.all()} == before
    assert not AuditEvent.objects.filter(event="upstream_credential.secrets_rotated").exists()
