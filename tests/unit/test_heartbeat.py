"""The process's one heartbeat thread: every running step's lease is beaten, and only while
it runs; a refused beat stops that lease's beats."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta

from actors.heartbeat import Heartbeats
from tests.factories import leased_job
from workflows.job import JobState
from workflows.queue import NOT_APPLIED, Job, Lease, Settled


class Beats:
    def __init__(self, refuse: frozenset[object] = frozenset()) -> None:
        self.lock = threading.Lock()
        self.count: dict[object, int] = {}
        self.refuse = refuse

    def __call__(self, lease: Lease) -> Settled:
        with self.lock:
            self.count[lease.job_id] = self.count.get(lease.job_id, 0) + 1
        if lease.job_id in self.refuse:
            return NOT_APPLIED
        return Settled(True, JobState.LEASED)


def short(kind: str = "k") -> Job:
    return replace(leased_job(kind, {}), lease_timeout=timedelta(milliseconds=150))


def test_every_running_lease_is_beaten_by_one_thread_and_only_while_it_runs() -> None:
    beats = Beats()
    hearts = Heartbeats(beat=beats)
    a, b = short(), short()
    before = threading.active_count()
    with hearts.holding(a), hearts.holding(b):
        time.sleep(0.35)
        assert threading.active_count() <= before + 1  # one thread for both
    seen = dict(beats.count)
    assert seen.get(a.id, 0) >= 3 and seen.get(b.id, 0) >= 3
    time.sleep(0.2)
    assert beats.count == seen  # nothing beats a step that ended
    hearts.close()


def test_a_refused_beat_stops_that_lease_only() -> None:
    lost, kept = short(), short()
    beats = Beats(refuse=frozenset({lost.id}))
    hearts = Heartbeats(beat=beats)
    with hearts.holding(lost), hearts.holding(kept):
        time.sleep(0.4)
    assert beats.count[lost.id] == 1
    assert beats.count[kept.id] >= 4
    hearts.close()


def test_a_failing_beat_is_tried_again() -> None:
    calls: list[int] = []

    def flaky(lease: Lease) -> Settled:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("connection lost")
        return Settled(True, JobState.LEASED)

    hearts = Heartbeats(beat=flaky)
    with hearts.holding(short()):
        time.sleep(0.3)
    assert len(calls) >= 3
    hearts.close()
