"""Bad input is a 4xx, never a 500 (adversarial review item 10): size, nesting and numbers."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from common.ids import new_id
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db

DEEP = "[" * 100_000 + "]" * 100_000


def _post_raw(client: APIClient, path: str, body: str, **headers: Any) -> Any:
    return client.generic("POST", path, body, content_type="application/json", **headers)


def test_deep_nesting_on_the_public_mcp_endpoint_is_422() -> None:
    r = _post_raw(APIClient(), "/mcp/public", DEEP)
    assert r.status_code == 422, r.content[:300]
    assert r.json()["error"]["data"]["error"] == "json_too_deep"
    # Nesting past the bound but within the parser's recursion is refused the same way.
    r = _post_raw(
        APIClient(),
        "/mcp/public",
        '{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": ' + "[" * 70 + "]" * 70 + "}",
    )
    assert r.status_code == 422


def test_deep_nesting_on_rest_bodies_is_422(tenant: Tenant) -> None:
    r = _post_raw(tenant.sponsor_client, "/v1/policies", DEEP)
    assert r.status_code == 422, r.content[:300]
    assert r.json()["detail"][0]["type"] == "json_too_deep"


@pytest.mark.parametrize("path", ["/v1/policies", "/v1/launch/preflight", "/mcp/messages", "/mcp/public"])
def test_a_30_mb_body_is_413_before_it_is_read(tenant: Tenant, path: str) -> None:
    body = '{"name": "' + "x" * (30 * 1024 * 1024) + '"}'
    r = _post_raw(tenant.sponsor_client, path, body)
    assert r.status_code == 413, r.content[:300]
    assert r.json()["detail"]["error"] == "payload_too_large"


@pytest.mark.parametrize(
    ("literal", "reason"),
    [("9007199254740993", "2**53+1"), ("1e400", "overflow"), ("NaN", "nan"), ("-Infinity", "inf")],
)
def test_out_of_range_numbers_in_tool_arguments_are_422(tenant: Tenant, literal: str, reason: str) -> None:
    from decimal import Decimal

    from billing.services import tool_price_set
    from mcpgateway.services import tools_sync

    del reason
    schema = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}
    tools_sync(remote_tools=[{"name": "math.add", "description": "add", "inputSchema": schema}])
    tool_price_set(tool="math.add", credits=Decimal("1"))
    body = (
        '{"arguments": {"a": ' + literal + ', "b": 1}, "permit_id": "pmt_x", "idempotency_key": "' + new_id("k") + '"}'
    )
    r = _post_raw(tenant.agent_client, "/mcp/tools/math.add/invoke", body)
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["type"] == "number_out_of_range"
    rpc = (
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "math.add", "arguments": {"a": '
        + literal
        + ', "b": 1}, "_meta": {"permit_id": "pmt_x", "idempotency_key": "k1"}}}'
    )
    r = _post_raw(tenant.agent_client, "/mcp/messages", rpc)
    assert r.status_code == 422, r.content
    assert r.json()["error"]["data"]["error"] == "number_out_of_range"


def test_numbers_in_range_still_pass_the_reader() -> None:
    from common.jsonbody import loads_bounded

    assert loads_bounded('{"a": 9007199254740991, "b": -9007199254740991, "c": 1.5e300, "d": [[[1]]]}') == {
        "a": 2**53 - 1,
        "b": -(2**53 - 1),
        "c": 1.5e300,
        "d": [[[1]]],
    }
