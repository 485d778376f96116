"""OpenAPI: 3.1.0, version 1.3.0, generated with no warnings; docs pages serve local assets."""

from __future__ import annotations

import json
import re

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_schema_generates_without_warnings(tmp_path):
    out = tmp_path / "schema.json"
    # --fail-on-warn turns every drf-spectacular warning into an error; --validate checks the document.
    call_command("spectacular", "--fail-on-warn", "--validate", "--format", "openapi-json", "--file", str(out))
    schema = json.loads(out.read_text())
    assert schema["openapi"] == "3.1.0"
    assert schema["info"]["version"] == "1.3.0"


def test_openapi_json_is_served(anon_client):
    r = anon_client.get("/openapi.json")
    assert r.status_code == 200
    schema = r.json()
    assert schema["openapi"] == "3.1.0"
    for path in (
        "/v1/api-keys",
        "/v1/api-keys/{wallet_id}",
        "/v1/api-keys/rotate",
        "/v1/api-keys/{wallet_id}/{key_id}",
        "/v1/api-keys/emergency-revoke",
        "/v1/api-keys/{wallet_id}/logs",
    ):
        assert path in schema["paths"], path
    assert schema["paths"]["/v1/api-keys/{wallet_id}/{key_id}"]["delete"]["responses"].keys() >= {"204", "401", "403"}
    assert "HTTPValidationError" in schema["components"]["schemas"]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_use_local_assets(anon_client, page):
    r = anon_client.get(page)
    assert r.status_code == 200
    html = r.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources
    assert all(s.startswith("/") or s.startswith("#") for s in sources), sources
    first_asset = next(s for s in sources if s.startswith("/static/"))
    assert anon_client.get(first_asset).status_code == 200


def test_policy_categories_are_listed_in_the_schema(anon_client):
    """The server refuses an unknown category, so the schema names the categories it takes (a fuzzer
    sending a schema-valid string found the 422 otherwise)."""
    from billing.models import ServiceCategory

    schemas = anon_client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("PolicyBundleCreate", "PatchedPolicyBundlePatch"):
        items = schemas[name]["properties"]["allowed_categories"]["items"]
        assert items.get("enum") == list(ServiceCategory.values), (name, items)
