"""Production settings refuse unsafe configurations at import, and start with a sound one.

Each case imports the settings in a fresh interpreter with ``DJANGO_ENV=production``.
``DATABASE_URL`` points at a server that is never contacted: settings only parse it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOUND = {
    "DJANGO_ENV": "production",
    "DJANGO_SETTINGS_MODULE": "config.settings",
    "DATABASE_URL": "postgres://tollgate:unused@127.0.0.1:1/tollgate",
    "SECRET_KEY": "Vq9-production-secret-4KfT2mLw8ZpR6sYc1NbH7xJd3GuE5aQo0iWvXyTz",
    "DEBUG": "false",
    "ENABLE_DOGFOOD_TOOL": "false",
    "ALLOWED_ORIGINS": "https://agents.tollgate-launch.dev",
    "ALLOWED_HOSTS": "gateway.tollgate-launch.dev",
    "PUBLIC_BASE_URL": "https://gateway.tollgate-launch.dev",
}
PROBE = (
    "import django; django.setup(); from django.conf import settings as s; "
    "print(s.TOOL_CATALOG_REQUIRES_KEY, s.ENABLE_MCP_STREAMABLE_HTTP, s.DEBUG, s.ENABLE_DOGFOOD_TOOL)"
)


def run_settings(**overrides: str | None) -> subprocess.CompletedProcess[str]:
    merged: dict[str, str | None] = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
    merged.update(SOUND)
    merged.update(overrides)
    env = {k: v for k, v in merged.items() if v is not None}
    return subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_sound_production_config_starts():
    result = run_settings()
    assert result.returncode == 0, result.stderr
    # Tool catalogs need a key and the standard transport is off unless enabled, by default.
    assert result.stdout.split() == ["True", "False", "False", "False"]


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"DEBUG": "true"}, "DEBUG is on"),
        ({"SECRET_KEY": "dev-insecure-tollgate-secret-key-change-me-0123456789"}, "SECRET_KEY is the default"),
        ({"SECRET_KEY": "short-secret"}, "SECRET_KEY is the default or too short"),
        ({"ENABLE_DOGFOOD_TOOL": "true"}, "ENABLE_DOGFOOD_TOOL is on"),
        ({"ALLOWED_ORIGINS": ""}, "ALLOWED_ORIGINS is empty"),
    ],
)
def test_unsafe_production_config_refuses_to_start(overrides, problem):
    result = run_settings(**overrides)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "refusing to start in production" in result.stderr
    assert problem in result.stderr


def test_unset_secret_key_falls_back_to_the_default_and_is_refused():
    env_without_secret = {"SECRET_KEY": None}
    result = run_settings(**env_without_secret)
    assert result.returncode != 0
    assert "SECRET_KEY is the default" in result.stderr


def test_catalog_key_requirement_can_be_set_explicitly():
    result = run_settings(TOOL_CATALOG_REQUIRES_KEY="false")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "False"


def test_witnesses_are_named_once():
    """Two TLOG_WITNESSES entries of one name would share one standing (back-off) row: refused at start."""
    witness = {"name": "w.example/1", "key": "w.example/1+00000000+AQ", "url": "http://127.0.0.1:9/"}
    twice = run_settings(TLOG_WITNESSES=json.dumps([witness, {**witness, "url": "http://127.0.0.1:10/"}]))
    assert twice.returncode != 0
    assert "TLOG_WITNESSES names each witness once" in twice.stderr
    once = run_settings(TLOG_WITNESSES=json.dumps([witness]))
    assert once.returncode == 0, once.stderr
