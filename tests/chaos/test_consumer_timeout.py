"""Steps longer than RabbitMQ's ``consumer_timeout``: no double run, no lost dispatch.

A private RabbitMQ node (``tests/chaos/private_rabbit.py``) runs with ``consumer_timeout =
10000`` and a 1 s channel tick. One in-process :class:`Runtime` (4 threads, tiers 1 s and 5 s,
6 s leases so heartbeats matter) serves it. Four ``build.implement`` steps sleep 25 s each,
started 12 s apart so they are held on different channels; 40 ``build.verify`` steps of 50 ms
share their lane queue (and so their channel) throughout.

What must happen (issue 3 item 7): the broker closes the channel that holds a long step's
delivery and redelivers what that channel held; each redelivered pointer's fenced claim
misses (the lease is live: the heartbeats keep it) and is re-delayed through a wait tier until
the original settled, then dropped; the original's ack, meant for a closed channel, is skipped
by ``PointerConsumer`` instead of acknowledging whatever holds that delivery tag on the
consumer's new channel.

Invariants: every job succeeded within the deadline, at its first generation and first attempt
(nothing was lost and rescued by a sweep or a lease reap); the handler ran exactly once per
job, so no two runs overlapped, and the job's result names that run; one applied settle per
job; every re-delayed duplicate came back from its tier and at the end no queue holds a
message; the broker really closed channels (read from the node's log) and every long step's
ack was skipped as stale, none landing on a tag its consumer did not own; no connection is
left open after the runtime stopped.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from dramatiq import MessageProxy, Middleware

from actors.broker import PointerConsumer, VibeyBroker
from actors.config import (
    BusSettings,
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.steps import StepResult
from actors.worker import Runtime, WorkerConfig
from tests.chaos.figures import figure
from tests.chaos.private_rabbit import PrivateRabbit, private_rabbit
from workflows.dispatch import Lane, WaitTiers
from workflows.job import JobState
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Handlers, Success

pytestmark = pytest.mark.chaos

PROJECT = "ctimeout"
CONSUMER_TIMEOUT_MS = 10_000
LONG_KIND, SHORT_KIND = "build.implement", "build.verify"  # one lane: one queue, one channel
LONG_JOBS, LONG_S, LONG_EVERY_S = 4, 25.0, 12.0
SHORT_JOBS, SHORT_S, SHORT_EVERY_S = 40, 0.05, 1.2
LEASE = timedelta(seconds=6)  # heartbeats every 2 s carry the long steps through
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))
FEED_DEADLINE_S = (LONG_JOBS - 1) * LONG_EVERY_S + LONG_S + 30.0  # first enqueue to all done
CHANNEL_CLOSED = re.compile(
    r"^(\S+ \S+) \[error\] .*precondition_failed: delivery acknowledgement on channel \d+ "
    r"timed out",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Run:
    job_id: UUID
    run_id: str
    start: float
    end: float


@dataclass(frozen=True)
class Delivery:
    job_id: str
    redelivered: bool
    started: float  # seconds after the first enqueue
    result: StepResult


class Recorder:
    """Handler runs, step deliveries and stale acks, from every worker thread."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.runs: list[Run] = []
        self.deliveries: list[Delivery] = []
        self.stale_acks: list[tuple[str, bool]] = []  # (message id, its tag held by another)
        self.current = threading.local()

    def handler(self, seconds: float) -> Callable[[Job], Success]:
        def run(job: Job) -> Success:
            run_id, start = uuid.uuid4().hex, time.monotonic()
            time.sleep(seconds)
            with self.lock:
                self.runs.append(Run(job.id, run_id, start, time.monotonic()))
            return Success({"run": run_id})

        return run


class DeliveryTap(Middleware):
    """Remembers, per worker thread, the delivery being processed and when it started."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def before_process_message(self, broker: Any, message: Any) -> None:
        self.recorder.current.message = message
        self.recorder.current.started = time.monotonic() - self.recorder.t0


def tap_steps(runtime: Runtime, recorder: Recorder) -> None:
    """Record each step's delivery and what became of it."""
    original = runtime.runner.run

    def run(**pointer: Any) -> StepResult:
        result = original(**pointer)
        message = recorder.current.message
        delivery = Delivery(
            job_id=pointer["job_id"],
            redelivered=bool(getattr(message, "redelivered", False)),
            started=recorder.current.started,
            result=result,
        )
        with recorder.lock:
            recorder.deliveries.append(delivery)
        return result

    runtime.runner.run = run  # type: ignore[method-assign]
    runtime.broker.add_middleware(DeliveryTap(recorder))


def tapped_consumer(recorder: Recorder) -> type[PointerConsumer]:
    """PointerConsumer, noting for each ack it skips whether its own current channel holds
    a delivery with that tag: the message a fence-less ack would have acknowledged."""

    class TapConsumer(PointerConsumer):
        def ack(self, message: MessageProxy) -> None:
            if message.options.get("vibey_consumer") != self.serial:
                victim = message._tag in self.known_tags
                with recorder.lock:
                    recorder.stale_acks.append((message.message_id, victim))
            super().ack(message)

    return TapConsumer


class LogTally(logging.Handler):
    """Counts the warnings that show how acks and consumers fared."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.unknown_tags = 0
        self.consumer_errors = 0
        self.ack_retries = 0  # an ack that met its closed connection, retried by Dramatiq

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "not in known tags" in text:
            self.unknown_tags += 1
        elif "Consumer encountered a connection error" in text:
            self.consumer_errors += 1
        elif text.startswith("Failed to post_process_message"):
            self.ack_retries += 1


@pytest.fixture
def log_tally() -> Iterator[LogTally]:
    tally = LogTally()
    root = logging.getLogger()
    root.addHandler(tally)
    try:
        yield tally
    finally:
        root.removeHandler(tally)


def overlapping(runs: list[Run]) -> int:
    """Overlapping neighbours in start order (0 exactly when no two runs overlap)."""
    ordered = sorted(runs, key=lambda r: r.start)
    return sum(1 for a, b in itertools.pairwise(ordered) if b.start < a.end)


def feed(runtime: Runtime, t0: float) -> tuple[list[UUID], list[UUID]]:
    """Enqueue on a schedule: a long step every 12 s from 0 s, a short one every 1.2 s."""
    schedule = [(i * LONG_EVERY_S, LONG_KIND, f"long-{i}") for i in range(LONG_JOBS)]
    schedule += [(0.5 + i * SHORT_EVERY_S, SHORT_KIND, f"short-{i}") for i in range(SHORT_JOBS)]
    long_ids: list[UUID] = []
    short_ids: list[UUID] = []
    for at, kind, subject in sorted(schedule):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        job = runtime.jobs.enqueue(EnqueueRequest(project_id=PROJECT, kind=kind, subject=subject))
        (long_ids if kind == LONG_KIND else short_ids).append(job.job.id)
    return long_ids, short_ids


def wait_terminal(runtime: Runtime, ids: list[UUID], deadline: float) -> dict[UUID, Job]:
    while True:
        jobs = {i: j for i in ids if (j := runtime.jobs.get(i)) is not None}
        done = len(jobs) == len(ids) and all(j.state.terminal for j in jobs.values())
        if done or time.monotonic() > deadline:
            return jobs
        time.sleep(0.25)


def queue_depths(rabbit: PrivateRabbit, prefix: str) -> dict[str, int]:
    """Ready plus unacknowledged messages of every queue of this test."""
    rows = json.loads(
        rabbit.ctl(
            "list_queues", "name", "messages", "messages_unacknowledged", "--formatter", "json"
        )
        or "[]"
    )
    return {
        row["name"]: int(row["messages"]) + int(row["messages_unacknowledged"])
        for row in rows
        if row["name"].startswith(prefix)
    }


def tier_returns(deliveries: list[Delivery]) -> int:
    """Deliveries that came back from a wait tier: neither a job's first nor redelivered."""
    seen: set[str] = set()
    returns = 0
    for d in sorted(deliveries, key=lambda d: d.started):
        returns += d.job_id in seen and not d.redelivered
        seen.add(d.job_id)
    return returns


def wait_quiet(
    rabbit: PrivateRabbit, prefix: str, runtime: Runtime, recorder: Recorder
) -> dict[str, int]:
    """Queue depths once every re-delayed pointer came back and no queue holds a message
    (or after the longest tier and some slack)."""
    deadline = time.monotonic() + TIERS.tiers[-1].total_seconds() + 3
    while True:
        depths = queue_depths(rabbit, prefix)
        with recorder.lock:
            returned = tier_returns(recorder.deliveries)
        quiet = returned == runtime.results[StepResult.REDELAYED] and not sum(depths.values())
        if quiet or time.monotonic() > deadline:
            return depths
        time.sleep(0.25)


def open_connections(rabbit: PrivateRabbit, settle_s: float = 5.0) -> list[dict[str, Any]]:
    """The node's client connections, once closes in flight have landed."""
    deadline = time.monotonic() + settle_s
    while True:
        rows: list[dict[str, Any]] = json.loads(
            rabbit.ctl("list_connections", "peer_port", "state", "--formatter", "json") or "[]"
        )
        if not rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.25)


def channel_closes(rabbit: PrivateRabbit, t0_wall: float) -> list[float]:
    """When the node closed a channel for consumer_timeout, in seconds after ``t0_wall``."""
    return [
        round(datetime.fromisoformat(m.group(1)).timestamp() - t0_wall, 1)
        for m in CHANNEL_CLOSED.finditer(rabbit.log_text())
    ]


def dispatch_report(pg_url: str, job_ids: Iterable[str]) -> str:
    """Each job's row and its outbox rows: where a job that did not finish was left."""
    ids = list(job_ids)
    with psycopg.connect(pg_url) as conn:
        jobs = conn.execute(
            "SELECT id, kind, state, attempts, dispatch_seq, lease_owner, lease_expires_at,"
            " updated_at FROM job WHERE id = ANY(%s::uuid[]) ORDER BY created_at",
            (ids,),
        ).fetchall()
        outbox = conn.execute(
            "SELECT job_id, key, created_at, claimed_by, claimed_at, sent_at FROM job_outbox"
            " WHERE job_id = ANY(%s::uuid[]) ORDER BY id",
            (ids,),
        ).fetchall()
        now = conn.execute("SELECT now()").fetchone()
    lines = [f"at {now}:"] + [f"  job {row}" for row in jobs] + [f"  outbox {r}" for r in outbox]
    return "\n".join(lines)


def test_steps_longer_than_consumer_timeout_run_once_and_lose_nothing(
    pg_url: str, log_tally: LogTally, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = time.monotonic()
    recorder = Recorder()
    consumer = tapped_consumer(recorder)
    monkeypatch.setattr(VibeyBroker, "consumer_class", property(lambda _: consumer))
    with private_rabbit(consumer_timeout_ms=CONSUMER_TIMEOUT_MS) as rabbit:
        node_up = time.monotonic() - started
        config = WorkerConfig(
            database=DatabaseSettings(url=pg_url),
            bus=BusSettings(amqp_url=rabbit.url, prefix=f"ct{uuid.uuid4().hex[:8]}"),
            queue=QueueSettings(
                lease_seconds=dict.fromkeys(
                    ("default", LONG_KIND, SHORT_KIND), LEASE.total_seconds()
                ),
                rabbitmq=RabbitMqSettings(
                    wait_tiers_seconds=TIERS.seconds,
                    reconcile_interval_seconds=1,
                    # A lost pointer must show as a job left behind, not be rescued by the sweep.
                    redispatch_after_seconds=600,
                ),
            ),
            worker=WorkerSettings(lanes=(Lane.BUILD.value,), threads=4),
        )
        handlers: Handlers = {
            LONG_KIND: recorder.handler(LONG_S),
            SHORT_KIND: recorder.handler(SHORT_S),
        }
        runtime = Runtime(config, handlers=handlers, owner="ctimeout-worker")
        tap_steps(runtime, recorder)
        runtime.start()
        try:
            t0, t0_wall = time.monotonic(), time.time()
            recorder.t0 = t0
            long_ids, short_ids = feed(runtime, t0)
            all_ids = long_ids + short_ids
            # The last long step starts at 36 s and runs 25 s; the rest is slack for a loaded box.
            jobs = wait_terminal(runtime, all_ids, deadline=t0 + FEED_DEADLINE_S)
            # Let the last re-delayed duplicates come back from their tier and be dropped.
            depths = wait_quiet(rabbit, config.bus.prefix, runtime, recorder)
            wall = time.monotonic() - t0
            closes = channel_closes(rabbit, t0_wall)
        finally:
            stopping = time.monotonic()
            runtime.stop(timeout=30)
            runtime_stop = time.monotonic() - stopping
        connections_left = open_connections(rabbit)
        node_stopping = time.monotonic()
    node_stop = time.monotonic() - node_stopping

    results = dict(runtime.results)
    runs_by_job: dict[UUID, list[Run]] = {}
    for run in recorder.runs:
        runs_by_job.setdefault(run.job_id, []).append(run)
    long_set = {str(i) for i in long_ids}
    seen: set[str] = set()
    fate: Counter[tuple[str, str, str]] = Counter()
    for d in sorted(recorder.deliveries, key=lambda d: d.started):
        kind = "long" if d.job_id in long_set else "short"
        how = "redelivered" if d.redelivered else ("tier" if d.job_id in seen else "first")
        seen.add(d.job_id)
        fate[(kind, how, d.result.value)] += 1
    redelivered = [d for d in recorder.deliveries if d.redelivered]
    victims = sum(1 for _, victim in recorder.stale_acks if victim)
    figure(
        f"\nconsumer_timeout tally: jobs={len(all_ids)} (long={len(long_ids)} x {LONG_S:.0f} s "
        f"every {LONG_EVERY_S:.0f} s, short={len(short_ids)} x {SHORT_S * 1000:.0f} ms), "
        f"consumer_timeout={CONSUMER_TIMEOUT_MS} ms, lease={LEASE.total_seconds():.0f} s\n"
        f"  channel closes (node log)={len(closes)} at {closes} s; consumer restarts="
        f"{log_tally.consumer_errors}; redeliveries={len(redelivered)} at "
        f"{sorted(round(d.started, 1) for d in redelivered)} s\n"
        f"  stale acks skipped={len(recorder.stale_acks)} (their tag held by another delivery "
        f"on the new channel: {victims}); unknown-tag acks={log_tally.unknown_tags}; "
        f"ack retries on a closed connection={log_tally.ack_retries}\n"
        f"  step results={ {k.value: v for k, v in results.items() if v} }; queue depths at "
        f"the end={sum(depths.values())}; connections left={len(connections_left)}; "
        f"wall={wall:.1f} s; node start {node_up:.1f} s, runtime stop {runtime_stop:.1f} s, "
        f"node stop {node_stop:.1f} s, whole test {time.monotonic() - started:.1f} s"
    )
    for (kind, how, result), count in sorted(fate.items()):
        figure(f"    {kind:5} {how:11} delivery -> {result}: {count}")

    # 0 lost dispatches: every job terminal within the deadline, at its first generation.
    assert len(jobs) == len(all_ids) == LONG_JOBS + SHORT_JOBS
    not_done = {str(i): j.state for i, j in jobs.items() if j.state is not JobState.SUCCEEDED}
    assert not not_done, (
        f"jobs not succeeded within the deadline: {not_done}\n{dispatch_report(pg_url, not_done)}"
    )
    assert {j.dispatch_seq for j in jobs.values()} == {1}, "a pointer was lost and re-dispatched"
    assert {j.attempts for j in jobs.values()} == {1}, "a lease was lost and the job re-run"
    # 0 concurrent double runs: one handler run per job, and its run is the one committed.
    assert {i: overlapping(r) for i, r in runs_by_job.items() if overlapping(r)} == {}
    assert {i: len(r) for i, r in runs_by_job.items() if len(r) != 1} == {}
    assert set(runs_by_job) == set(all_ids)
    assert {
        i: j.result for i, j in jobs.items() if j.result != {"run": runs_by_job[i][0].run_id}
    } == {}
    # Exactly one applied settle per job; no settle found its lease lost.
    assert results[StepResult.SUCCEEDED] == len(all_ids)
    assert results[StepResult.STALE] == 0
    # Every re-delayed duplicate came back from its tier; nothing is left in any queue.
    assert tier_returns(recorder.deliveries) == results[StepResult.REDELAYED]
    assert depths and sum(depths.values()) == 0, f"messages left behind: {depths}"
    # Not vacuous: the broker closed channels under the long steps, their pointers came back
    # while they ran and were re-delayed, and every long step's own ack was skipped as stale.
    assert closes, "the private node never enforced consumer_timeout"
    assert log_tally.consumer_errors >= 1
    assert fate[("long", "redelivered", StepResult.REDELAYED.value)] >= 1
    assert long_set <= {message_id.split(":")[0] for message_id, _ in recorder.stale_acks}
    assert log_tally.unknown_tags == 0, "an ack hit a delivery tag its consumer did not own"
    # Every connection closed, including those of the consumers whose channel the node closed.
    assert connections_left == [], f"connections left open after stop: {connections_left}"
