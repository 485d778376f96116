"""The verify requests' one rule (common.schema.SignedDocumentVerifyRequest), through both endpoints:
an id, or a signed document with its signature; anything else is a 422 naming what is missing."""

import pytest


@pytest.mark.parametrize(
    ("path", "id_field", "document"), [("permits", "permit_id", "permit"), ("receipts", "receipt_id", "receipt")]
)
def test_neither_id_nor_document_is_refused(tenant, path, id_field, document):
    r = tenant.agent_client.post(f"/v1/{path}/verify", {"signature": "x"}, format="json")
    assert r.status_code == 422
    assert [item["msg"] for item in r.json()["detail"]] == [f"Give {id_field}, or {document} with signature."]


@pytest.mark.parametrize(("path", "document"), [("permits", "permit"), ("receipts", "receipt")])
def test_a_document_without_its_signature_is_refused(tenant, path, document):
    r = tenant.agent_client.post(f"/v1/{path}/verify", {document: {"v": 1}}, format="json")
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert [(item["loc"][-1], item["msg"]) for item in detail] == [("signature", f"Required with {document}.")]
