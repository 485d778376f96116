"""Shared fixtures: API clients authenticated as operator, sponsor and agent keys."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from billing.models import Wallet
from tests import factories
from tests.upstream_server import FaultUpstream


@pytest.fixture(autouse=True)
def _clear_rate_limits() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _rate_limit_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rate-limit windows are fixed: a burst that straddles a boundary is split between two windows.

    Requests served in this process (test clients, the live server thread) count at one moment
    in the middle of a minute, so a test's burst always lands in one window however slowly the
    machine runs it. Gunicorn instances started by tests keep the real clock (those tests wait
    for the start of a window); boundaries are tested with ``bucket_charge(now=...)``.
    """
    import time
    import types

    from access import ratelimit

    frozen = time.time() // 60 * 60 + 30
    monkeypatch.setattr(ratelimit, "time", types.SimpleNamespace(time=lambda: frozen))


@pytest.fixture(autouse=True)
def _clear_process_caches() -> Iterator[None]:
    """Tests flush and recreate rows (signing keys, permits, prices); no per-process cache may outlive them."""
    from common.cache import clear_all

    clear_all()
    yield
    clear_all()


def client_for(secret: str | None) -> APIClient:
    client = APIClient()
    if secret is not None:
        client.credentials(HTTP_X_API_KEY=secret)
    return client


@dataclass
class Tenant:
    sponsor: Wallet
    sponsor_secret: str
    sponsor_key_id: str
    agent: Wallet
    agent_secret: str
    agent_key_id: str

    @property
    def sponsor_client(self) -> APIClient:
        return client_for(self.sponsor_secret)

    @property
    def agent_client(self) -> APIClient:
        return client_for(self.agent_secret)


def make_tenant(name: str = "acme") -> Tenant:
    sponsor = factories.make_sponsor(name)
    agent = factories.make_wallet(sponsor, f"{name}-agent")
    sk = factories.make_key(sponsor)
    ak = factories.make_key(agent)
    return Tenant(sponsor, sk.secret, sk.key.key_id, agent, ak.secret, ak.key.key_id)


@pytest.fixture
def tenant(db: None) -> Tenant:
    return make_tenant("acme")


@pytest.fixture
def other_tenant(db: None) -> Tenant:
    return make_tenant("globex")


@pytest.fixture
def operator_secret(db: None) -> str:
    return factories.make_operator_key().secret


@pytest.fixture
def operator_client(operator_secret: str) -> APIClient:
    return client_for(operator_secret)


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()


@pytest.fixture(scope="module")
def fault_server() -> Iterator[FaultUpstream]:
    """One scripted upstream per test module (the gateway keeps one client, and session, per upstream URL).
    A module with an upstream of its own defines its own ``fault_server`` or ``fault``."""
    with FaultUpstream(hang_seconds=2) as upstream:
        yield upstream


@pytest.fixture
def fault(settings: Any, fault_server: FaultUpstream) -> FaultUpstream:
    """The module's upstream with fresh counters, its tools registered at 2 credits each."""
    from tests.gateway_helpers import fresh_upstream  # it imports this module

    return fresh_upstream(settings, fault_server, timeout=0.5)
