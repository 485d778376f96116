"""The audit API through HTTP: lists, filters, summary, verify-chain, /v1/me/*, isolation, 422s."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.utils import timezone

from audit.evidence_core import chain_hash
from audit.models import AuditEvent, ChainHead
from audit.services import alert_raise, audit_record
from common.canonical import event_bytes
from tests.conftest import client_for
from tests.test_audit_chain import fields, tampering

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _signing_key_file(tmp_path, settings):
    settings.SIGNING_KEY_FILE = str(tmp_path / "signing-keys.json")
    settings.SIGNING_KEY_PRIVATE = ""


def _events(client, **params):
    r = client.get("/v1/audit/events", params)
    assert r.status_code == 200, r.content
    return r.json()


def _record(tenant, **kwargs):
    # About the tenant's agent wallet unless said otherwise: the sponsor's and the agent's keys both reach it.
    defaults = {
        "event": "tool.called",
        "ok": True,
        "tenant_id": tenant.sponsor.tenant_id,
        "wallet_id": tenant.agent.wallet_id,
    }
    return audit_record(**{**defaults, **kwargs})


# --- /v1/audit/events --------------------------------------------------------------


def test_requires_a_key(anon_client):
    r = anon_client.get("/v1/audit/events")
    assert r.status_code == 401
    assert r.json()["detail"]["error"] == "not_authenticated"


def test_tenant_isolation(tenant, other_tenant, operator_client):
    mine = _record(tenant, event="test.mine")
    theirs = _record(other_tenant, event="test.theirs")
    for client in (tenant.sponsor_client, tenant.agent_client):
        body = _events(client, limit=200)
        assert {item["tenant_id"] for item in body["items"]} == {tenant.sponsor.tenant_id}
        ids = {item["event_id"] for item in body["items"]}
        assert mine.event_id in ids
        assert theirs.event_id not in ids
        assert _events(client, event="test.theirs")["total"] == 0
        assert _events(client, wallet_id=other_tenant.agent.wallet_id)["total"] == 0
    everything = {item["event_id"] for item in _events(operator_client, limit=200)["items"]}
    assert {mine.event_id, theirs.event_id} <= everything


def test_filters(tenant):
    wallet = tenant.agent.wallet_id
    a = _record(tenant, event="test.a", wallet_id=wallet, key_id="key_a", tool="search.web", endpoint="/mcp",
                policy_decision_id="pol_1", request_id="req_filter_a", ok=True)  # fmt: skip
    b = _record(tenant, event="test.b", wallet_id=wallet, key_id="key_b", tool="notes.write", endpoint="/v1/x",
                policy_decision_id="pol_2", request_id="req_filter_b", ok=False)  # fmt: skip
    client = tenant.sponsor_client
    cases = {
        "event": ("test.a", a),
        "key_id": ("key_b", b),
        "tool": ("search.web", a),
        "endpoint": ("/v1/x", b),
        "policy_decision_id": ("pol_1", a),
        "request_id": ("req_filter_b", b),
    }
    for name, (value, expected) in cases.items():
        body = _events(client, **{name: value})
        assert [item["event_id"] for item in body["items"]] == [expected.event_id], name
    assert {i["event_id"] for i in _events(client, wallet_id=wallet, event="test.b", ok="false")["items"]} == {
        b.event_id
    }
    assert _events(client, event="test.b", ok="true")["total"] == 0
    assert _events(client, event="test.a", ok="true")["total"] == 1


def test_time_range_and_order(tenant):
    first = _record(tenant, event="test.t")
    second = _record(tenant, event="test.t")
    body = _events(tenant.sponsor_client, event="test.t")
    assert [i["event_id"] for i in body["items"]] == [second.event_id, first.event_id]  # newest first
    after = (second.created_at).isoformat()
    assert [i["event_id"] for i in _events(tenant.sponsor_client, event="test.t", created_after=after)["items"]] == [
        second.event_id
    ]
    before = second.created_at.isoformat()
    assert [i["event_id"] for i in _events(tenant.sponsor_client, event="test.t", created_before=before)["items"]] == [
        first.event_id
    ]
    future = (timezone.now() + timedelta(days=1)).isoformat()
    assert _events(tenant.sponsor_client, created_after=future)["total"] == 0


def test_full_and_summary_forms(tenant):
    event = _record(tenant, event="test.form", wallet_id=tenant.agent.wallet_id, detail={"k": "v"})
    full = _events(tenant.sponsor_client, event="test.form")["items"][0]
    assert full["event_id"] == event.event_id
    assert full["hash"] == event.hash
    assert full["prev_hash"] == event.prev_hash
    assert full["detail"] == {"k": "v"}
    assert full["chain"] == tenant.sponsor.tenant_id
    assert set(full) == {
        "event_id", "chain", "seq", "event", "ok", "wallet_id", "tool", "request_id", "created_at",
        "tenant_id", "key_id", "endpoint", "policy_decision_id", "detail", "prev_hash", "hash",
    }  # fmt: skip
    compact = _events(tenant.sponsor_client, event="test.form", summary="true")["items"][0]
    assert set(compact) == {"event_id", "chain", "seq", "event", "ok", "wallet_id", "tool", "request_id", "created_at"}


def test_pagination(tenant):
    for _ in range(5):
        _record(tenant, event="test.page")
    body = _events(tenant.sponsor_client, event="test.page", limit=2, offset=2)
    assert (body["total"], body["limit"], body["offset"], len(body["items"])) == (5, 2, 2, 2)
    assert len(_events(tenant.sponsor_client, event="test.page", limit=200)["items"]) == 5


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"limit": 0}, ["query", "limit"]),
        ({"limit": 201}, ["query", "limit"]),
        ({"limit": "x"}, ["query", "limit"]),
        ({"offset": -1}, ["query", "offset"]),
        ({"created_after": "yesterday"}, ["query", "created_after"]),
        ({"created_before": "2026-13-45T00:00:00Z"}, ["query", "created_before"]),
        ({"ok": "maybe"}, ["query", "ok"]),
        ({"summary": "perhaps"}, ["query", "summary"]),
    ],
)
def test_bad_parameters_are_422(tenant, params, loc):
    for path in ("/v1/audit/events", "/v1/me/audit/events", "/v1/me/alerts", "/v1/audit/summary"):
        if path == "/v1/me/alerts" and "limit" not in params and "offset" not in params:
            continue
        if path == "/v1/audit/summary" and not any(k.startswith("created") for k in params):
            continue
        if path == "/v1/me/audit/events" and "summary" in params:
            continue
        r = tenant.agent_client.get(path, params)
        assert r.status_code == 422, (path, r.content)
        assert r.json()["detail"][0]["loc"] == loc


# --- /v1/audit/summary ------------------------------------------------------------


def test_summary_counts(tenant, other_tenant):
    start = timezone.now()
    for ok in (True, True, False):
        _record(tenant, event="test.sum", ok=ok)
    _record(tenant, event="test.other", ok=False)
    _record(other_tenant, event="test.sum", ok=True)
    r = tenant.sponsor_client.get("/v1/audit/summary", {"created_after": start.isoformat()})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["by_event"] == [
        {"event": "test.other", "total": 1, "ok": 0, "failed": 1},
        {"event": "test.sum", "total": 3, "ok": 2, "failed": 1},
    ]
    assert (body["total"], body["ok"], body["failed"]) == (4, 2, 2)
    r = tenant.sponsor_client.get("/v1/audit/summary", {"created_before": start.isoformat()})
    assert "test.sum" not in {row["event"] for row in r.json()["by_event"]}


# --- /v1/audit/verify-chain ----------------------------------------------------------


def test_verify_chain_round_trip_with_checkpoint(tenant):
    for i in range(10):
        _record(tenant, detail={"i": i})
    r = tenant.sponsor_client.post("/v1/audit/verify-chain", {}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    chain = tenant.sponsor.tenant_id
    assert body["valid"] is True
    assert body["chain"] == chain
    assert body["checked_events"] == body["head_seq"] == AuditEvent.objects.filter(chain=chain).count()
    assert body["first_broken_seq"] is None
    assert body["reason"] is None
    assert body["checkpoint_verified"] is None
    checkpoint = body["checkpoint"]
    assert checkpoint["type"] == "audit_checkpoint"
    assert checkpoint["size"] == body["head_seq"]
    assert checkpoint["kid"].startswith("sig_")
    assert checkpoint["signature"]
    # The kid resolves through the public endpoint.
    assert client_for(None).get(f"/v1/signing-keys/{checkpoint['kid']}").status_code == 200

    _record(tenant, event="test.later")
    r = tenant.sponsor_client.post("/v1/audit/verify-chain", {"checkpoint": checkpoint}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["valid"] is True
    assert r.json()["checkpoint_verified"] is True

    forged = {**checkpoint, "size": checkpoint["size"] - 1}
    r = tenant.sponsor_client.post("/v1/audit/verify-chain", {"checkpoint": forged}, format="json")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "checkpoint"]
    assert r.json()["detail"][0]["type"] == "checkpoint_invalid"
    r = tenant.sponsor_client.post("/v1/audit/verify-chain", {"checkpoint": checkpoint, "from_seq": 2}, format="json")
    assert r.status_code == 422


def test_verify_chain_reports_tampering_over_http(tenant):
    events = [_record(tenant, detail={"i": i}) for i in range(5)]
    target = events[2]
    with tampering() as cursor:
        cursor.execute("UPDATE audit_event SET detail = '{}'::jsonb WHERE event_id = %s", [target.event_id])
    body = tenant.sponsor_client.post("/v1/audit/verify-chain", {}, format="json").json()
    assert body["valid"] is False
    assert (body["first_broken_seq"], body["first_broken_event_id"], body["reason"]) == (
        target.seq,
        target.event_id,
        "hash_mismatch",
    )
    assert body["checkpoint"] is None


def test_a_partial_verify_chain_over_a_rewritten_event_is_invalid_and_signs_nothing(tenant):
    """An event rewritten with its own hash recomputed: the events up to it agree, the link above it does not."""
    events = [_record(tenant, detail={"i": i}) for i in range(6)]
    chain = tenant.sponsor.tenant_id
    honest = tenant.sponsor_client.post("/v1/audit/verify-chain", {"to_seq": events[2].seq}, format="json").json()
    assert honest["valid"] is True
    assert honest["checked_events"] == events[2].seq
    assert (honest["checkpoint"]["last_seq"], honest["checkpoint"]["head_hash"]) == (events[2].seq, events[2].hash)
    target = AuditEvent.objects.get(event_id=events[2].event_id)
    target.detail = {"i": 99}
    forged_hash = chain_hash(target.prev_hash, event_bytes(*fields(target)))
    with tampering() as cursor:
        cursor.execute(
            "UPDATE audit_event SET detail = '{\"i\": 99}'::jsonb, hash = %s WHERE event_id = %s",
            [forged_hash, target.event_id],
        )
    r = tenant.sponsor_client.post("/v1/audit/verify-chain", {"to_seq": target.seq}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["valid"], body["to_seq"], body["checked_events"]) == (False, target.seq, target.seq)
    assert (body["first_broken_seq"], body["first_broken_event_id"], body["reason"]) == (
        events[3].seq,
        events[3].event_id,
        "prev_hash_mismatch",
    )
    assert body["checkpoint"] is None
    assert body["head_seq"] == ChainHead.objects.get(chain=chain).seq
    # A range starting above the rewrite is still anchored by the links above it: intact, but signs nothing.
    later = tenant.sponsor_client.post(
        "/v1/audit/verify-chain", {"from_seq": events[4].seq, "to_seq": events[4].seq}, format="json"
    ).json()
    assert (later["valid"], later["checkpoint"]) == (True, None)


def test_verify_chain_scope(tenant, other_tenant, operator_client):
    other_chain = other_tenant.sponsor.tenant_id
    for client, own_status in ((tenant.sponsor_client, 200), (tenant.agent_client, 403)):
        for chain in (other_chain, "system", "nope"):
            r = client.post("/v1/audit/verify-chain", {"chain": chain}, format="json")
            assert r.status_code == 404, (chain, r.content)
            assert r.json()["detail"]["error"] == "not_found"
        own = client.post("/v1/audit/verify-chain", {"chain": tenant.sponsor.tenant_id}, format="json")
        # The tenant chain holds every wallet's events: the sponsor's key verifies it, an agent's may not.
        assert own.status_code == own_status, own.content
    assert operator_client.post("/v1/audit/verify-chain", {}, format="json").json()["chain"] == "system"
    r = operator_client.post("/v1/audit/verify-chain", {"chain": other_chain}, format="json")
    assert r.status_code == 200
    assert r.json()["valid"] is True
    assert r.json()["chain"] == other_chain
    assert operator_client.post("/v1/audit/verify-chain", {"chain": "spn_nope"}, format="json").status_code == 404


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"from_seq": 0}, ["body", "from_seq"]),
        ({"from_seq": 5, "to_seq": 4}, ["body", "to_seq"]),
        ({"to_seq": "x"}, ["body", "to_seq"]),
        ({"checkpoint": {"type": "audit_checkpoint"}}, ["body", "checkpoint", "chain"]),
    ],
)
def test_verify_chain_bad_body(tenant, body, loc):
    r = tenant.sponsor_client.post("/v1/audit/verify-chain", body, format="json")
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["loc"] == loc


def test_verify_chain_body_must_be_an_object(tenant):
    r = tenant.sponsor_client.post("/v1/audit/verify-chain", [1], format="json")
    assert r.status_code == 422


# --- /v1/me/audit/events and /v1/me/alerts ------------------------------------------


def test_me_audit_events(tenant, operator_client):
    own = _record(tenant, event="test.me", wallet_id=tenant.agent.wallet_id, ok=False)
    sponsor_event = _record(tenant, event="test.me", wallet_id=tenant.sponsor.wallet_id)
    r = tenant.agent_client.get("/v1/me/audit/events", {"event": "test.me"})
    assert r.status_code == 200, r.content
    assert [i["event_id"] for i in r.json()["items"]] == [own.event_id]
    items = tenant.agent_client.get("/v1/me/audit/events", {"limit": 200}).json()["items"]
    assert {i["wallet_id"] for i in items} == {tenant.agent.wallet_id}
    assert tenant.agent_client.get("/v1/me/audit/events", {"event": "test.me", "ok": "true"}).json()["total"] == 0
    # wallet_id cannot widen the scope.
    r = tenant.agent_client.get("/v1/me/audit/events", {"wallet_id": tenant.sponsor.wallet_id, "event": "test.me"})
    assert [i["event_id"] for i in r.json()["items"]] == [own.event_id]
    sponsor_items = tenant.sponsor_client.get("/v1/me/audit/events", {"event": "test.me"}).json()["items"]
    assert [i["event_id"] for i in sponsor_items] == [sponsor_event.event_id]
    r = operator_client.get("/v1/me/audit/events")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "wallet_key_required"


def test_me_alerts(tenant, other_tenant, operator_client):
    r = tenant.agent_client.get("/v1/me/alerts")
    assert r.status_code == 200
    assert r.json() == {"items": [], "total": 0, "limit": 50, "offset": 0}
    for i in range(3):
        alert_raise(tenant_id=tenant.sponsor.tenant_id, wallet_id=tenant.agent.wallet_id, kind=f"test.{i}",
                    message=f"alert {i}", detail={"i": i})  # fmt: skip
    alert_raise(tenant_id=tenant.sponsor.tenant_id, wallet_id=tenant.sponsor.wallet_id, kind="test.s", message="s")
    alert_raise(tenant_id=other_tenant.sponsor.tenant_id, wallet_id=other_tenant.agent.wallet_id, kind="x", message="x")
    body = tenant.agent_client.get("/v1/me/alerts", {"limit": 2}).json()
    assert body["total"] == 3
    assert len(body["items"]) == 2
    assert body["items"][0]["kind"] == "test.2"  # newest first
    assert set(body["items"][0]) == {"alert_id", "wallet_id", "kind", "severity", "message", "detail", "created_at"}
    assert {i["wallet_id"] for i in body["items"]} == {tenant.agent.wallet_id}
    assert tenant.agent_client.get("/v1/me/alerts", {"offset": 2}).json()["items"][0]["kind"] == "test.0"
    r = operator_client.get("/v1/me/alerts")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "wallet_key_required"


def test_key_revocation_raises_an_alert_for_the_wallet(tenant):
    from tests import factories

    extra = factories.make_key(tenant.agent, name="spare")
    r = tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/{extra.key.key_id}")
    assert r.status_code == 204
    alerts = tenant.agent_client.get("/v1/me/alerts").json()["items"]
    assert [a["kind"] for a in alerts] == ["api_key_revoked"]
    assert alerts[0]["detail"]["key_id"] == extra.key.key_id


# --- request ids and the audit trail of API-key operations ---------------------------


def test_request_id_is_returned_and_recorded(tenant):
    r = tenant.sponsor_client.post(
        "/v1/api-keys", {"wallet_id": tenant.agent.wallet_id, "name": "ci"}, format="json",
        HTTP_X_REQUEST_ID="req-from-client-42",
    )  # fmt: skip
    assert r.status_code == 201, r.content
    assert r["X-Request-Id"] == "req-from-client-42"
    event = AuditEvent.objects.get(event="api_key.created", detail__new_key_id=r.json()["key_id"])
    assert event.request_id == "req-from-client-42"

    r = tenant.sponsor_client.post("/v1/api-keys", {"wallet_id": tenant.agent.wallet_id}, format="json")
    generated = r["X-Request-Id"]
    assert generated.startswith("req_")
    event = AuditEvent.objects.get(event="api_key.created", detail__new_key_id=r.json()["key_id"])
    assert event.request_id == generated
    listed = _events(tenant.sponsor_client, request_id=generated)["items"]
    assert [i["event_id"] for i in listed] == [event.event_id]

    # An insane incoming id is replaced.
    r = tenant.sponsor_client.get("/v1/audit/events", HTTP_X_REQUEST_ID="bad id with spaces")
    assert r["X-Request-Id"].startswith("req_")


def test_every_api_key_operation_is_audited(tenant):
    client, wallet = tenant.sponsor_client, tenant.agent.wallet_id
    created = client.post("/v1/api-keys", {"wallet_id": wallet, "name": "a"}, format="json").json()
    rotated = client.post(
        "/v1/api-keys/rotate", {"wallet_id": wallet, "key_id": created["key_id"]}, format="json"
    ).json()
    new_id = rotated["new_key"]["key_id"]
    assert client.delete(f"/v1/api-keys/{wallet}/{new_id}", {"reason": "test"}).status_code == 204
    assert client.post("/v1/api-keys/emergency-revoke", {"wallet_id": wallet}, format="json").status_code == 200

    items = _events(client, wallet_id=wallet, limit=200)["items"]
    by_event: dict[str, list] = {}
    for item in items:
        by_event.setdefault(item["event"], []).append(item)
    assert {"api_key.created", "api_key.rotated", "api_key.revoked", "api_key.emergency_revoked"} <= set(by_event)
    for name in ("api_key.created", "api_key.rotated", "api_key.revoked", "api_key.emergency_revoked"):
        latest = by_event[name][0]
        assert latest["ok"] is True
        assert latest["tenant_id"] == tenant.sponsor.tenant_id
        assert latest["request_id"]
    assert any(i["key_id"] == tenant.sponsor_key_id for i in by_event["api_key.created"])
    assert by_event["api_key.rotated"][0]["detail"]["new_key_id"] == new_id
    assert by_event["api_key.revoked"][0]["detail"]["revoked_key_id"] == new_id
    assert tenant.agent_key_id in by_event["api_key.emergency_revoked"][0]["detail"]["revoked_key_ids"]
    assert client.post("/v1/audit/verify-chain", {}, format="json").json()["valid"] is True


def test_rejected_credentials_are_audited_on_the_system_chain(tenant, operator_client):
    bogus = "tg_key_" + "A" * 22 + "_" + "B" * 40
    r = client_for(bogus).get("/v1/audit/events", HTTP_X_REQUEST_ID="req-bad-key-1")
    assert r.status_code == 401
    event = AuditEvent.objects.get(event="auth.credential_rejected", request_id="req-bad-key-1")
    assert event.ok is False
    assert event.chain == "system"
    assert event.tenant_id is None
    assert event.endpoint == "/v1/audit/events"
    listed = _events(operator_client, event="auth.credential_rejected", request_id="req-bad-key-1")["items"]
    assert [i["event_id"] for i in listed] == [event.event_id]
    assert _events(tenant.sponsor_client, event="auth.credential_rejected")["total"] == 0
    assert operator_client.post("/v1/audit/verify-chain", {"chain": "system"}, format="json").json()["valid"]


def test_revoked_key_rejection_names_the_key(tenant):
    from tests import factories

    spare = factories.make_key(tenant.agent, name="spare")
    tenant.sponsor_client.delete(f"/v1/api-keys/{tenant.agent.wallet_id}/{spare.key.key_id}")
    assert client_for(spare.secret).get("/v1/me/alerts", HTTP_X_REQUEST_ID="req-revoked-1").status_code == 401
    event = AuditEvent.objects.get(event="auth.credential_rejected", request_id="req-revoked-1")
    assert event.key_id == spare.key.key_id


def test_list_query_count_does_not_grow_with_the_page(tenant, django_assert_max_num_queries):
    for i in range(30):
        _record(tenant, event="test.q", detail={"i": i})
    client = tenant.sponsor_client
    client.get("/v1/audit/events", {"limit": 1})  # warm the key lookup path
    with django_assert_max_num_queries(4):
        assert len(client.get("/v1/audit/events", {"event": "test.q", "limit": 2}).json()["items"]) == 2
    with django_assert_max_num_queries(4):
        assert len(client.get("/v1/audit/events", {"event": "test.q", "limit": 200}).json()["items"]) == 30


def test_admin_is_read_only(tenant, admin_client):
    event = _record(tenant, event="test.admin")
    assert admin_client.get("/admin/audit/auditevent/").status_code == 200
    page = admin_client.get(f"/admin/audit/auditevent/{quote(event.event_id)}/change/")
    assert page.status_code == 200
    assert event.hash.encode() in page.content
    assert admin_client.get("/admin/audit/auditevent/add/").status_code == 403
    assert admin_client.get(f"/admin/audit/auditevent/{quote(event.event_id)}/delete/").status_code == 403
    r = admin_client.post(f"/admin/audit/auditevent/{quote(event.event_id)}/change/", {"event": "rewritten"})
    assert r.status_code == 403
    assert AuditEvent.objects.get(event_id=event.event_id).event == "test.admin"
    for model in ("alert", "chainhead", "signingkey"):
        assert admin_client.get(f"/admin/audit/{model}/").status_code == 200
        assert admin_client.get(f"/admin/audit/{model}/add/").status_code == 403
