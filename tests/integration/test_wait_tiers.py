"""Wait tiers (failure-modes K9): delayed jobs wait in fixed-TTL tier queues, not in a worker.

300 jobs, delays spread over 0.5-12 s, through tiers of 1 s, 2 s and 5 s (the longer delays
take several hops: a 12 s pointer goes 5 s, 5 s, 2 s). Oracle, all on the one machine's clock
(PostgreSQL's ``now()`` and ``time.time()`` read the same system clock):

* 0 dropped: every job succeeds, and no pointer is dropped by the miss policy;
* 0 early: no job starts before its ``run_after`` (both by the database's claim time and by
  the handler's wall clock);
* none late: start ≤ run_after + the smallest tier + 5 s;
* no head-of-line blocking: 1 s jobs enqueued right after a batch of 12 s jobs start within
  3 s of their enqueue;
* 0 messages held in worker memory: the broker has no Dramatiq ``.DQ``/``.XQ`` queues for the
  prefix, the Dramatiq worker consumes only the lane queues (no delay-queue consumer, nothing
  ever in a consumer's in-memory delay queue), the work queues hold at most the prefetch
  unacknowledged, while the waiting pointers sit in the tier queues.

Seeded: ``VIBEY_TIERS_SEED`` reruns the same delays.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import pika
import pytest

from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.steps import StepResult
from actors.worker import Runtime, WorkerConfig
from tests.amqp_fixtures import Amqp
from workflows.dispatch import WaitTiers
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Handlers, Success

P = "tiers"
TIERS = WaitTiers.from_seconds((1, 2, 5))
KINDS = ("design.interview", "build.implement")  # both lanes: a tier keeps the routing key
JOBS = 300
LONG_FIRST = 40  # 12 s jobs enqueued first ...
SHORT_AFTER = 20  # ... then 1 s jobs right behind them
LONG_S = 12.0
SHORT_S = 1.0
SHORT_START_WITHIN_S = 3.0
LATE_SLACK_S = 5.0
THREADS = 4
DEADLINE_S = LONG_S + TIERS.smallest.total_seconds() + LATE_SLACK_S + 20


@dataclass(frozen=True, slots=True)
class Start:
    wall: float  # time.time() when the handler began
    claimed_at: datetime  # the database clock at the claim (lease expiry - lease duration)


class Starts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_job: dict[UUID, Start] = {}
        self.repeated: list[UUID] = []

    def handler(self, job: Job) -> Success:
        wall = time.time()
        assert job.lease_expires_at is not None
        start = Start(wall=wall, claimed_at=job.lease_expires_at - job.lease_timeout)
        with self._lock:
            if job.id in self.by_job:
                self.repeated.append(job.id)
            self.by_job.setdefault(job.id, start)
        return Success({})

    def count(self) -> int:
        with self._lock:
            return len(self.by_job)


@pytest.fixture
def starts() -> Starts:
    return Starts()


@pytest.fixture
def runtime(pg_url: str, amqp: Amqp, starts: Starts) -> Iterator[Runtime]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(
            rabbitmq=RabbitMqSettings(
                wait_tiers_seconds=TIERS.seconds, reconcile_interval_seconds=1
            )
        ),
        worker=WorkerSettings(threads=THREADS),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # recorded: cleanup
    handlers: Handlers = dict.fromkeys(KINDS, starts.handler)
    runtime = Runtime(config, handlers=handlers, owner="tiers-worker")
    runtime.start()
    try:
        yield runtime
    finally:
        runtime.stop(timeout=10)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def message_counts(amqp: Amqp, queues: list[str]) -> dict[str, int]:
    connection = pika.BlockingConnection(pika.URLParameters(amqp.url))
    try:
        channel = connection.channel()
        return {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}
    finally:
        connection.close()


def unacked(amqp: Amqp, queues: list[str]) -> dict[str, int]:
    """messages_unacknowledged per queue, as rabbitmqctl reports it."""
    assert amqp.ctl is not None, "this test needs rabbitmqctl on the broker's machine"
    rows = amqp.ctl(
        "list_queues", "-p", amqp.vhost, "name", "messages_unacknowledged", "--no-table-headers"
    )
    counts = {}
    for line in rows.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in queues:
            counts[parts[0]] = int(parts[1])
    return counts


def requests(seed: int) -> list[tuple[str, EnqueueRequest]]:
    """(group, request) in enqueue order: LONG_FIRST 12 s jobs, SHORT_AFTER 1 s jobs, then the
    rest spread over 0.5-12 s."""
    rng = random.Random(seed)
    delays = [("long", LONG_S)] * LONG_FIRST + [("short", SHORT_S)] * SHORT_AFTER
    delays += [("spread", round(rng.uniform(0.5, LONG_S), 3)) for _ in range(JOBS - len(delays))]
    return [
        (
            group,
            EnqueueRequest(
                project_id=P,
                kind=KINDS[index % len(KINDS)],
                subject=f"{group}-{index}",
                delay=timedelta(seconds=delay),
            ),
        )
        for index, (group, delay) in enumerate(delays)
    ]


def settled_states(runtime: Runtime) -> dict[str, int]:
    """The job states once the last started steps' acks committed (10 s at most)."""
    settle_by = time.monotonic() + 10
    while True:
        with runtime.pool.connection() as conn:
            query = b"SELECT state::text, count(*) FROM job GROUP BY 1"
            states: dict[Any, Any] = dict(conn.execute(query).fetchall())
        if states == {"succeeded": JOBS} or time.monotonic() > settle_by:
            return states
        time.sleep(0.1)


def test_delayed_jobs_wait_in_tiers_and_start_on_time(
    runtime: Runtime, amqp: Amqp, starts: Starts
) -> None:
    seed = int(os.environ.get("VIBEY_TIERS_SEED") or random.SystemRandom().randrange(2**31))
    print(f"\nwait tiers seed: {seed} (rerun with VIBEY_TIERS_SEED={seed})")
    config = runtime.config
    names = config.names
    work_queues = config.queues()
    tier_queues = [names.tier_queue(name) for name in TIERS.names]
    consumers = runtime._worker.consumers  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while any(c.consumer is None for c in consumers.values()):
        assert time.monotonic() < deadline, "the Dramatiq consumers did not start"
        time.sleep(0.05)
    serials = {q: c.consumer.serial for q, c in consumers.items()}  # type: ignore[union-attr]
    planned = requests(seed)
    batches = [[r for g, r in planned if g == group] for group in ("long", "short", "spread")]
    started = time.monotonic()
    enqueued = [e for batch in batches for e in runtime.jobs.enqueue_batch(batch)]
    groups = ["long"] * LONG_FIRST + ["short"] * SHORT_AFTER
    groups += ["spread"] * (JOBS - LONG_FIRST - SHORT_AFTER)
    jobs = {e.job.id: (group, e.job) for group, e in zip(groups, enqueued, strict=True)}
    assert len(jobs) == JOBS and all(e.created for e in enqueued)

    # While jobs wait: pointers in the tier queues, nothing in a worker's memory.
    tier_peak = 0
    unacked_peak = 0
    held_peak = 0  # in-process: Dramatiq's delay queues and its work queue
    samples = 0
    rabbitmqctl_samples = 0
    while starts.count() < JOBS and time.monotonic() - started < DEADLINE_S:
        elapsed = time.monotonic() - started
        if elapsed < LONG_S - 2:
            tier_peak = max(tier_peak, sum(message_counts(amqp, tier_queues).values()))
            if rabbitmqctl_samples < 3 and elapsed > 1.5 * (rabbitmqctl_samples + 1):
                unacked_peak = max(unacked_peak, sum(unacked(amqp, work_queues).values()))
                rabbitmqctl_samples += 1
        delayed = sum(c.delay_queue.qsize() for c in consumers.values())
        held_peak = max(held_peak, delayed)
        assert delayed == 0, "a pointer waited in a Dramatiq consumer's in-memory delay queue"
        samples += 1
        time.sleep(0.25)
    wall = time.monotonic() - started

    states = settled_states(runtime)
    declared = amqp.list_queues()
    lateness: list[float] = []
    short_starts: list[float] = []
    early: list[tuple[UUID, float]] = []
    late: list[tuple[UUID, float]] = []
    for job_id, (group, job) in jobs.items():
        start = starts.by_job.get(job_id)
        if start is None:
            continue
        run_after = job.run_after.timestamp()
        if start.claimed_at < job.run_after or start.wall < run_after:
            early.append((job_id, start.wall - run_after))
        lateness.append(start.wall - run_after)
        if start.wall - run_after > TIERS.smallest.total_seconds() + LATE_SLACK_S:
            late.append((job_id, start.wall - run_after))
        if group == "short":
            short_starts.append(start.wall - job.created_at.timestamp())  # from its enqueue
    results = dict(runtime.results)
    print(
        f"wait tiers tally (seed {seed}): jobs={JOBS} started={starts.count()} states={states} "
        f"lateness p50={statistics.median(lateness):.3f}s p99={percentile(lateness, 0.99):.3f}s "
        f"max={max(lateness):.3f}s; 1s-after-12s starts max={max(short_starts, default=-1):.3f}s; "
        f"re-delays (hops)={results[StepResult.REDELAYED]} dropped={results[StepResult.DROPPED]} "
        f"tier peak={tier_peak} work unacked peak={unacked_peak} in-memory delayed peak="
        f"{held_peak} samples={samples} wall={wall:.1f}s"
    )
    assert starts.count() == JOBS and states == {"succeeded": JOBS}, "a delayed job was dropped"
    assert results[StepResult.DROPPED] == 0, "a pointer was dropped"
    assert not starts.repeated, f"jobs started twice: {starts.repeated[:5]}"
    assert not early, f"jobs started early (s): {early[:5]}"
    assert not late, f"jobs started later than smallest tier + {LATE_SLACK_S}s: {late[:5]}"
    assert len(short_starts) == SHORT_AFTER
    assert max(short_starts) <= SHORT_START_WITHIN_S, "a 1 s job waited behind the 12 s ones"
    assert results[StepResult.REDELAYED] > 0, "no pointer took more than one hop"
    # Nothing held in worker memory: the pointers waited in the tier queues ...
    assert tier_peak > 0, "the waiting pointers were not in the tier queues"
    assert unacked_peak <= THREADS * len(work_queues), "work queues held unacked pointers"
    # ... and Dramatiq's delay machinery was never declared or consumed.
    assert not [q for q in declared if q.endswith((".DQ", ".XQ"))], sorted(declared)
    assert set(declared) == {*work_queues, *tier_queues, names.dead_queue}, sorted(declared)
    assert set(consumers) == set(work_queues), f"consumers: {sorted(consumers)}"
    assert not runtime.broker.delay_queues and set(runtime.broker.queues) == set(work_queues)
    assert {q: c.consumer.serial for q, c in consumers.items()} == serials, "a consumer restarted"  # type: ignore[union-attr]
    assert all(t.is_alive() for t in consumers.values())
    tiers_now = message_counts(amqp, tier_queues)
    assert sum(tiers_now.values()) == 0, f"pointers left in the tiers: {tiers_now}"
