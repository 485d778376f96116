"""The worker commands' loop (common.worker.rounds_run): once, or rounds until SIGTERM."""

import os
import signal

import pytest

from common.worker import rounds_run

# Each round starts with close_old_connections, which reads the connection's state: after a database
# test in the same run the connection is open, and a test without database access would be refused it.
pytestmark = pytest.mark.django_db


@pytest.fixture
def sigterm_restored():
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_without_loop_one_round(sigterm_restored):
    rounds: list[int] = []
    rounds_run(lambda: rounds.append(1), loop=False, interval=0)
    assert rounds == [1]


def test_a_sigterm_during_a_round_lets_it_finish_then_ends_the_loop(sigterm_restored):
    rounds: list[str] = []

    def one_round() -> None:
        rounds.append("started")
        if len(rounds) == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only records it: this round goes on
        rounds.append("finished")

    rounds_run(one_round, loop=True, interval=0)
    assert rounds == ["started", "finished"] * 3
