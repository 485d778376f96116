"""``make run``'s ports (issue 30, item 14): a port another program holds is never taken for the
gateway or the demo upstream; the run says what is wrong before it writes anything, or picks a free
port for the demo upstream when its default is taken."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from devtools import run


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_taken_demo_default_gives_way_to_a_free_port(taken_port, monkeypatch, capsys):
    monkeypatch.setattr(run, "DEFAULT_DEMO_UPSTREAM_PORT", taken_port)
    gateway = run.free_port()
    port, demo_port = run.choose_ports({"PORT": str(gateway)}, demo=True)
    assert port == gateway
    assert demo_port not in (None, taken_port, gateway)
    assert run.port_free(demo_port)
    assert f"Port {taken_port} (the demo upstream's default) is in use" in capsys.readouterr().out


def test_a_taken_port_that_was_asked_for_stops_the_run_before_anything_is_written(taken_port, monkeypatch):
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(run, "_manage", lambda *args, env: calls.append(args))
    monkeypatch.setattr(run.pg, "start", lambda: pytest.fail("PostgreSQL was started"))
    monkeypatch.setattr(run.subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))
    for variable in ("UPSTREAM_MCP_URL", "DATABASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PORT", str(run.free_port()))
    monkeypatch.setenv("DEMO_UPSTREAM_PORT", str(taken_port))
    with pytest.raises(SystemExit) as stopped:
        run.main()
    assert f"DEMO_UPSTREAM_PORT={taken_port} is already in use" in str(stopped.value)
    assert "Nothing was changed" in str(stopped.value)
    assert calls == []
    monkeypatch.delenv("DEMO_UPSTREAM_PORT")
    monkeypatch.setenv("PORT", str(taken_port))
    with pytest.raises(SystemExit) as stopped:
        run.main()
    assert f"port {taken_port} on 127.0.0.1 is already in use" in str(stopped.value)
    assert calls == []


def test_ports_must_be_numbers():
    with pytest.raises(SystemExit, match="DEMO_UPSTREAM_PORT='http' is not a port number"):
        run.choose_ports({"PORT": str(run.free_port()), "DEMO_UPSTREAM_PORT": "http"}, demo=True)
    assert run.choose_ports({"PORT": str(run.free_port()), "DEMO_UPSTREAM_PORT": "x"}, demo=False)[1] is None
