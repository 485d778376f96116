"""The first hour: the example finds the gateway where `make run` put it, the demo bootstrap is truthful,
and the client package alone verifies receipts offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from tests import factories
from tests.conftest import make_tenant
from tests.gateway_helpers import register_upstream
from tests.live import running_gateway
from tests.upstream_server import running_demo_upstream

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "portable"


def _run(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, **kwargs)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_the_example_uses_the_gateway_address_of_the_credentials_file(tmp_path: Path) -> None:
    with running_demo_upstream() as demo:
        register_upstream(demo.url, price="0.5")
        tenant = make_tenant("first-hour")
        factories.top_up(tenant.agent, 10)
        from tests.gateway_helpers import issue_permit

        permit_id = issue_permit(tenant, tools=["notes.append"])
        with running_gateway(tmp_path, UPSTREAM_MCP_URL=demo.url) as gw:
            assert not gw.url.endswith(":8000")  # a port other than the default, as with PORT=8400
            creds = tmp_path / "demo-credentials.json"
            creds.write_text(
                json.dumps({"gateway": gw.url, "agent_api_key": tenant.agent_secret, "permit_id": permit_id})
            )
            done = _run("examples/sdk_call.py", "--credentials", str(creds))
            assert done.returncode == 0, done.stdout + done.stderr
            assert "outcome: success" in done.stdout
            assert "'receipt_signature': 'ok'" in done.stdout
        # The gateway is gone: one clear line, no traceback.
        done = _run("examples/sdk_call.py", "--credentials", str(creds))
        assert done.returncode == 1
        assert "no gateway answers at" in done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.django_db
def test_demo_bootstrap_writes_an_approver_and_keeps_the_address_current(tmp_path: Path, settings: Any) -> None:
    from io import StringIO

    from mcpgateway.services import tools_sync
    from permits.models import TenantApprover

    tools_sync(remote_tools=[{"name": n, "inputSchema": {"type": "object"}} for n in ("notes.append", "clock.now")])
    path = tmp_path / "demo-credentials.json"
    settings.PUBLIC_BASE_URL = "http://127.0.0.1:8400"
    out = StringIO()
    call_command("demo_bootstrap", credentials_file=str(path), stdout=out)
    printed = out.getvalue()
    assert "tool notes.append: 0.5 credits per call" in printed
    assert "tool clock.now: 0.05 credits per call" in printed
    creds = json.loads(path.read_text())
    assert creds["gateway"] == "http://127.0.0.1:8400"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    approver = TenantApprover.objects.get(user__username=creds["approver_username"])
    assert approver.tenant_id == creds["sponsor_wallet_id"]
    assert approver.user.check_password(creds["approver_password"])
    # A later run on another port keeps the same tenant and key, with the new address.
    settings.PUBLIC_BASE_URL = "http://127.0.0.1:8500"
    call_command("demo_bootstrap", credentials_file=str(path), stdout=StringIO())
    again = json.loads(path.read_text())
    assert again["gateway"] == "http://127.0.0.1:8500"
    assert again["agent_api_key"] == creds["agent_api_key"]


@pytest.mark.timeout(300)
def test_the_client_package_alone_verifies_receipts(tmp_path: Path) -> None:
    """`pip install ./client` into a fresh environment gives `tollgate-verify` (no Django, no source tree)."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # Its dependencies come from this environment's wheels cache when offline; the index otherwise.
    # A copy, so that building the package writes nothing into the source tree.
    import shutil

    source = tmp_path / "client"
    shutil.copytree(ROOT / "client", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(source)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    if install.returncode != 0:
        message = f"could not install the client package here: {install.stderr[-300:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    verify = env_dir / "bin" / "tollgate-verify"
    done = subprocess.run([str(verify), str(GOLDEN / "valid.json")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "own key snapshot only" in done.stdout
    no_django = subprocess.run([str(python), "-c", "import django"], capture_output=True, text=True)
    assert no_django.returncode != 0  # verified without the gateway's code or Django
