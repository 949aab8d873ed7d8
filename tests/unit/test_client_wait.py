"""``Client.wait``'s polls: a short workflow is seen within one poll of its end, a long one
is polled ever less often, never less often than every ``WAIT_CAP_S``."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vibey.client import (
    WAIT_CAP_S,
    WAIT_FLAT,
    Client,
    WaitTimeout,
    WorkflowFailed,
    wait_delays,
)
from workflows.engine import Status

polls = st.floats(min_value=0.0005, max_value=0.5, allow_nan=False)


@given(polls)
def test_the_first_polls_are_flat_then_grow_to_the_cap(poll: float) -> None:
    delays = list(itertools.islice(wait_delays(poll), WAIT_FLAT + 60))
    assert delays[:WAIT_FLAT] == [poll] * WAIT_FLAT
    grown = delays[WAIT_FLAT:]
    assert all(a <= b for a, b in itertools.pairwise(delays))
    assert all(d <= max(WAIT_CAP_S, poll) for d in grown)
    assert grown[-1] == max(WAIT_CAP_S, poll)  # 60 growths reach the cap from any poll


@given(polls, st.floats(min_value=0.0, max_value=0.99, allow_nan=False))
def test_a_workflow_that_ends_within_the_flat_polls_is_seen_within_one_poll(
    poll: float, fraction: float
) -> None:
    ends = fraction * WAIT_FLAT * poll  # seconds after the wait began
    elapsed = 0.0
    for delay in wait_delays(poll):  # each poll reads the status, then sleeps
        if elapsed >= ends:
            break
        elapsed += delay
    assert elapsed - ends <= poll + 1e-9


class Ticking:
    """A clock the wait's sleeps move, and the statuses its polls read."""

    def __init__(self, statuses: list[Status]) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.statuses = statuses

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def status(self, _workflow: Any) -> Any:
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return SimpleNamespace(status=status, id=uuid4(), project_id="p", reason="", phase=None)


def waiting_client(clock: Ticking, monkeypatch: pytest.MonkeyPatch) -> Client:
    monkeypatch.setattr(time, "sleep", clock.sleep)  # the client's module's time, patched
    monkeypatch.setattr(time, "monotonic", lambda: clock.now)
    client = Client.__new__(Client)  # the wait reads statuses only: no graph
    monkeypatch.setattr(client, "status", clock.status, raising=False)
    return client


def test_wait_polls_at_its_interval_until_the_workflow_completes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Ticking([Status.RUNNING] * 5 + [Status.COMPLETED])
    done = waiting_client(clock, monkeypatch).wait(uuid4(), poll=0.002)
    assert done.status is Status.COMPLETED
    assert clock.sleeps == [0.002] * 5


def test_wait_raises_on_failure_and_on_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = Ticking([Status.RUNNING, Status.FAILED])
    with pytest.raises(WorkflowFailed):
        waiting_client(failed, monkeypatch).wait(uuid4())
    running = Ticking([Status.RUNNING])
    with pytest.raises(WaitTimeout):
        waiting_client(running, monkeypatch).wait(uuid4(), timeout=1.0)
    assert running.now == pytest.approx(1.0)  # the last sleep is cut to the deadline
    assert max(running.sleeps) <= WAIT_CAP_S
