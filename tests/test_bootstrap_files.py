"""A bootstrap command's credentials file from an earlier run (access.selectors.api_key_file_active)."""

import json
from pathlib import Path

from access.selectors import api_key_file_active
from access.services import api_key_revoke
from tests.conftest import Tenant


def test_a_file_counts_only_while_its_key_is_active(tenant: Tenant, tmp_path: Path):
    path = tmp_path / "credentials.json"
    assert not api_key_file_active(path=path, field="agent_api_key")  # no file
    path.write_text("{not json")
    assert not api_key_file_active(path=path, field="agent_api_key")
    path.write_text(json.dumps({"agent_api_key": tenant.agent_secret}))
    assert not api_key_file_active(path=path, field="operator_api_key")  # another field
    assert api_key_file_active(path=path, field="agent_api_key")

    api_key_revoke(wallet=tenant.agent, key_id=tenant.agent_key_id, reason="test")

    assert not api_key_file_active(path=path, field="agent_api_key")
