"""``make test`` (devtools.check) checks the migrations and leaves the embedded PostgreSQL server as it found it."""

from __future__ import annotations

from typing import Any

import pytest

from devtools import check


class FakeServer:
    """devtools.pg's calls, with a server that mypy's step starts (the Django plugin loads the settings)."""

    def __init__(self, running: bool) -> None:
        self.running, self.stopped = running, False
        self.commands: dict[str, tuple[list[str], str | None, bool]] = {}  # step -> command, DATABASE_URL, up

    def running_url(self) -> str | None:
        return "postgresql://embedded" if self.running else None

    def start(self) -> str:
        self.running = True
        return "postgresql://embedded"

    def stop(self) -> bool:
        was, self.running, self.stopped = self.running, False, True
        return was


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(*, running: bool, failing: str | None = None) -> tuple[FakeServer, list[str]]:
        fake, steps = FakeServer(running), []

        def step(title: str, cmd: list[str], env: dict[str, str]) -> None:
            steps.append(title)
            fake.commands[title] = (cmd, env.get("DATABASE_URL"), fake.running)
            if title == "mypy":
                fake.start()
            if title == failing:
                raise SystemExit(1)

        monkeypatch.delenv("DATABASE_URL", raising=False)
        monkeypatch.setattr(check, "pg", fake)
        monkeypatch.setattr(check, "step", step)
        return fake, steps

    return make


def test_a_server_the_run_started_is_stopped_even_when_mypy_started_it(server):
    fake, steps = server(running=False)
    assert check.main([]) == 0
    assert steps == ["ruff check", "ruff format", "mypy", "makemigrations", "pytest"]
    assert fake.stopped
    assert not fake.running


def test_a_server_running_before_the_run_keeps_running(server):
    fake, _ = server(running=True)
    assert check.main([]) == 0
    assert not fake.stopped
    assert fake.running


def test_a_failing_step_still_stops_the_server_the_run_started(server):
    fake, steps = server(running=False, failing="pytest")
    with pytest.raises(SystemExit):
        check.main([])
    assert steps[-1] == "pytest"
    assert fake.stopped
    assert not fake.running


def test_with_database_url_the_embedded_server_is_left_alone(server, monkeypatch):
    fake, _ = server(running=False)
    monkeypatch.setenv("DATABASE_URL", "postgresql://elsewhere/db")
    assert check.main([]) == 0
    assert not fake.stopped


def test_makemigrations_check_runs_before_pytest_against_the_running_server(server):
    fake, steps = server(running=False)
    assert check.main([]) == 0
    assert steps.index("makemigrations") < steps.index("pytest")
    cmd, database_url, server_running = fake.commands["makemigrations"]
    assert cmd[1:] == ["manage.py", "makemigrations", "--check", "--dry-run"]
    assert database_url == "postgresql://embedded"
    assert server_running


def test_models_without_a_migration_fail_the_run_before_pytest(server):
    fake, steps = server(running=False, failing="makemigrations")
    with pytest.raises(SystemExit):
        check.main([])
    assert "pytest" not in steps
    assert fake.stopped
