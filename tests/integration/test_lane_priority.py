"""Lanes under load, on the real broker: an interactive step overtakes a backlog of BUILD
steps. The lanes are separate queues; a process serving both keeps one thread for the
interactive lane (its BUILD queues' prefetch is at most threads - 1), so an interactive step
starts at once even while every other thread runs a long BUILD step; and the interactive
actor has the higher priority, so a buffered one takes the next free thread first."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.worker import LANE_PRIORITY, Runtime, WorkerConfig
from tests.amqp_fixtures import Amqp
from workflows.dispatch import WaitTiers
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Handlers, Success

P = "proj"
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))
BUILD_S = 1.0
THREADS = 2
BACKLOG = 6


class Starts:
    def __init__(self) -> None:
        self.order: list[tuple[str, float]] = []
        self._lock = threading.Lock()

    def handlers(self) -> Handlers:
        def build(job: Job) -> Success:
            self._seen(job)
            time.sleep(BUILD_S)
            return Success()

        def interactive(job: Job) -> Success:
            self._seen(job)
            return Success()

        return {"build.implement": build, "design.interview": interactive}

    def _seen(self, job: Job) -> None:
        with self._lock:
            self.order.append((job.subject, time.monotonic()))

    def started(self, prefix: str) -> list[tuple[str, float]]:
        with self._lock:
            return [(s, t) for s, t in self.order if s.startswith(prefix)]


@pytest.fixture
def worker(pg_url: str, amqp: Amqp) -> Iterator[tuple[Runtime, Starts]]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(rabbitmq=RabbitMqSettings(wait_tiers_seconds=TIERS.seconds)),
        worker=WorkerSettings(threads=THREADS),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # recorded: cleanup
    starts = Starts()
    runtime = Runtime(config, handlers=starts.handlers(), owner="lane-test")
    runtime.start()
    try:
        yield runtime, starts
    finally:
        runtime.stop(timeout=30)


def wait_for(predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_interactive_actor_outranks_the_build_actor() -> None:
    assert LANE_PRIORITY["interactive"] < LANE_PRIORITY["build"]  # Dramatiq: lower runs first


def test_a_process_serving_both_lanes_keeps_a_thread_for_the_interactive_one() -> None:
    both = WorkerConfig(
        bus=BusSettings(prefix="v"),
        worker=WorkerSettings(threads=8),
    )
    assert both.prefetch_by_queue() == {"v.jobs.interactive": 8, "v.jobs.build": 7}
    build_only = WorkerConfig(
        bus=BusSettings(prefix="v"),
        worker=WorkerSettings(threads=8, lanes=("build",)),
    )
    assert build_only.prefetch_by_queue() == {"v.jobs.build": 8}
    one = WorkerConfig(
        bus=BusSettings(prefix="v"),
        queue=QueueSettings(rabbitmq=RabbitMqSettings(prefetch=4)),
        worker=WorkerSettings(threads=1),
    )
    assert one.prefetch_by_queue() == {"v.jobs.interactive": 4, "v.jobs.build": 4}


def test_an_interactive_step_overtakes_a_backlog_of_build_steps(
    worker: tuple[Runtime, Starts],
) -> None:
    runtime, starts = worker
    for n in range(BACKLOG):
        runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="build.implement", subject=f"b{n}"))
    wait_for(lambda: len(starts.started("b")) >= THREADS - 1)  # the build lane is saturated
    time.sleep(BUILD_S / 2)  # mid-step: the BUILD lane's every thread busy, a backlog queued
    enqueued = time.monotonic()
    runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview", subject="i0"))
    wait_for(lambda: starts.started("i"))
    ((_, started),) = starts.started("i")
    builds = starts.started("b")
    # It did not wait for a BUILD step to finish: it started before the first of them ended
    # (BUILD_S after it started; BUILD_S / 2 after the interactive step was enqueued)...
    first_build_ends = min(t for _, t in builds) + BUILD_S
    assert started < first_build_ends - BUILD_S / 10, (started - enqueued, builds)
    # ...and the rest of the backlog, enqueued before it, ran after it.
    before = [s for s, t in builds if t < started]
    assert len(before) == THREADS - 1, before
    wait_for(lambda: len(starts.started("b")) == BACKLOG, timeout=60)
    begun = sorted(t for _, t in starts.started("b"))  # one BUILD step at a time on 2 threads
    assert all(b - a >= BUILD_S * 0.9 for a, b in itertools.pairwise(begun)), begun
