"""Duplicate, stale and malformed pointers against a running Runtime (failure-modes K3, K4).

Duplicates: 200 jobs (chains of three among them, some needing a second generation) run to
completion under a commit-audit trigger that writes a row, under a primary key, in the ack's
own transaction (a second commit would fail loudly). Then every pointer of every generation
1..dispatch_seq is replayed twice, and 100 pointers of a generation that never existed
(dispatch_seq + 5) are injected. Oracle: 0 extra settlements (audit rows == jobs, no
attempt or row touched), every replayed pointer ack-and-dropped (``StepResult.DROPPED``),
and the stale batch drains fast.

Malformed: 200 messages in ≥ 10 classes published straight to the work exchange: the bodies of
``tests.unit.test_dispatch.MALFORMED`` and ``MORE_MALFORMED`` (one or more per rejection
reason), a 1 MiB body, a forged ``user_id`` property, a hostile ``x-delivery-count`` header,
and valid envelopes for an unknown job, for another project (routed to this project's queue),
for a wrong generation and for a finished job. Oracle: every envelope-invalid body is
dead-lettered with its ``x-vibey-reason``; every valid envelope is dropped; a forged
``user_id`` is refused by the broker (or, if accepted, dropped); 0 worker crashes (no Dramatiq
consumer restarts, no error logged, and a healthy job enqueued afterwards succeeds); 0
database writes (job, job_outbox, gate and job_dependency unchanged, row for row).

Seeded: ``VIBEY_DUPLICATES_SEED`` reruns the same jobs and injections.
"""

from __future__ import annotations

import logging
import os
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import pika.exceptions
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
from actors.topology import REASON_HEADER
from actors.worker import Runtime, WorkerConfig
from tests.amqp_fixtures import Amqp
from tests.commit_audit import COMMIT_AUDIT
from tests.unit.test_dispatch import MALFORMED, MORE_MALFORMED
from workflows.dispatch import MAX_ENVELOPE_BYTES, DispatchEnvelope, encode
from workflows.job import FailureClass
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Failure, Handlers, Outcome, Success

P = "dupes"
KINDS = ("design.interview", "build.implement")  # both lanes
TIERS_S = (1, 5)
CHAINS = 40  # × 3 steps
SINGLES = 80
FLAKY_RATE = 0.25  # fail the first attempt: a second generation to replay
STALE = 100
DRAIN_LIMIT_S = 5.0


def work(job: Job) -> Outcome:
    if job.payload.get("flaky") and job.attempts == 1:
        return Failure(FailureClass.WORK, "first attempt fails", retry_in=timedelta(0))
    return Success({"attempt": job.attempts})


HANDLERS: Handlers = dict.fromkeys(KINDS, work)


class ErrorLog(logging.Handler):
    """Counts ERROR and worse from Dramatiq and vibey: a consumer or worker thread crash."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def errors() -> Iterator[ErrorLog]:
    handler = ErrorLog()
    loggers = [logging.getLogger(name) for name in ("dramatiq", "actors", "store")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@pytest.fixture
def runtime(pg_url: str, amqp: Amqp, errors: ErrorLog) -> Iterator[Runtime]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(
            rabbitmq=RabbitMqSettings(wait_tiers_seconds=TIERS_S, reconcile_interval_seconds=1)
        ),
        worker=WorkerSettings(threads=4),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # recorded: cleanup
    runtime = Runtime(config, handlers=HANDLERS, owner="dupes-worker")
    runtime.start()
    try:
        yield runtime
    finally:
        runtime.stop(timeout=10)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def scalar(runtime: Runtime, query: str) -> Any:
    with runtime.pool.connection() as conn:
        row = conn.execute(query.encode()).fetchone()
    return row[0] if row else None


def consumers_started(runtime: Runtime) -> dict[str, int]:
    """Each lane queue's Dramatiq consumer (its serial: a restart after a crash changes it)."""
    consumers = runtime._worker.consumers  # type: ignore[union-attr]
    wait_for(lambda: all(c.consumer is not None for c in consumers.values()), 10, "the consumers")
    return {queue: thread.consumer.serial for queue, thread in consumers.items()}  # type: ignore[union-attr]


def queue_depths(amqp: Amqp, queues: list[str]) -> dict[str, int]:
    connection = pika.BlockingConnection(pika.URLParameters(amqp.url))
    try:
        channel = connection.channel()
        return {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}
    finally:
        connection.close()


def all_queues(runtime: Runtime) -> list[str]:
    names = runtime.config.names
    return [
        *runtime.config.queues(),
        *(names.tier_queue(t) for t in runtime.config.queue.rabbitmq.wait_tiers.names),
    ]


class Publisher:
    """Publishes to the work exchange on a confirm-mode channel (mandatory)."""

    def __init__(self, amqp: Amqp) -> None:
        self._amqp = amqp
        self._connection = amqp.connect()
        self._channel = self._open()
        self.refused = 0

    def _open(self) -> Any:
        channel = self._connection.channel()
        channel.confirm_delivery()
        return channel

    def publish(
        self, body: bytes, routing_key: str, properties: pika.BasicProperties | None = None
    ) -> bool:
        """True when the broker confirmed the message; False when it refused it (the channel
        is reopened)."""
        try:
            self._channel.basic_publish(
                self._amqp.names.work_exchange,
                routing_key,
                body,
                properties or pika.BasicProperties(delivery_mode=2),
                mandatory=True,
            )
        except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.NackError):
            self.refused += 1
            if not self._channel.is_open:
                self._channel = self._open()
            return False
        return True

    def close(self) -> None:
        if self._connection.is_open:
            self._connection.close()


def pointer(job_id: uuid.UUID, project: str, seq: int, kind: str) -> bytes:
    envelope = DispatchEnvelope(
        job_id=job_id,
        project_id=project,
        dispatch_seq=seq,
        kind=kind,
        not_before=datetime(2026, 1, 1, tzinfo=UTC),
    )
    return encode(envelope)


def routing_key(runtime: Runtime, kind: str) -> str:
    return runtime.config.names.routing_key(STEP_KINDS.get_kind(kind).lane, P)


class DropClock:
    """Wraps the runner's result hook: when each DROPPED was counted."""

    def __init__(self, runtime: Runtime) -> None:
        self._inner = runtime.runner._on_result
        self._lock = threading.Lock()
        self.dropped_at: list[float] = []
        runtime.runner._on_result = self

    def __call__(self, result: StepResult) -> None:
        if result is StepResult.DROPPED:
            with self._lock:
                self.dropped_at.append(time.monotonic())
        if self._inner is not None:
            self._inner(result)

    def count(self) -> int:
        with self._lock:
            return len(self.dropped_at)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# --- duplicates and stale generations ------------------------------------------------------


def enqueue_jobs(runtime: Runtime, rng: random.Random) -> int:
    requests: list[EnqueueRequest] = []
    for chain in range(CHAINS):
        previous: tuple[uuid.UUID, ...] = ()
        for step in range(3):
            job_id = uuid.UUID(int=rng.getrandbits(128), version=4)
            requests.append(
                EnqueueRequest(
                    project_id=P,
                    kind=KINDS[step % 2],
                    subject=f"chain-{chain}-{step}",
                    payload={"flaky": rng.random() < FLAKY_RATE},
                    depends_on=previous,
                    job_id=job_id,
                )
            )
            previous = (job_id,)
    for single in range(SINGLES):
        requests.append(
            EnqueueRequest(
                project_id=P,
                kind=KINDS[single % 2],
                subject=f"single-{single}",
                payload={"flaky": rng.random() < FLAKY_RATE},
                job_id=uuid.UUID(int=rng.getrandbits(128), version=4),
            )
        )
    runtime.jobs.enqueue_batch(requests)
    return len(requests)


def fingerprint(runtime: Runtime) -> tuple[Any, ...]:
    """Every row of every table a pointer could write, digested: any write changes it."""
    return tuple(
        scalar(runtime, f"SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, ',' "
               f"ORDER BY t::text)), '') FROM {table} t")
        for table in ("job", "job_outbox", "gate", "job_dependency")
    )  # fmt: skip


def quiesce(runtime: Runtime, amqp: Amqp) -> None:
    """Wait until the outbox is sent and the work and tier queues are empty."""
    wait_for(lambda: runtime.relay.flush(timeout=0.1), 15, "the relay")
    wait_for(
        lambda: scalar(runtime, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL") == 0,
        15,
        "the outbox",
    )
    wait_for(lambda: sum(queue_depths(amqp, all_queues(runtime)).values()) == 0, 15, "queues")


def test_replayed_and_stale_pointers_settle_nothing(
    runtime: Runtime, amqp: Amqp, errors: ErrorLog
) -> None:
    seed = int(os.environ.get("VIBEY_DUPLICATES_SEED") or random.SystemRandom().randrange(2**31))
    print(f"\nduplicates seed: {seed} (rerun with VIBEY_DUPLICATES_SEED={seed})")
    rng = random.Random(seed)
    with runtime.pool.connection() as conn:
        conn.execute(COMMIT_AUDIT.encode())
    total = enqueue_jobs(runtime, rng)
    wait_for(
        lambda: scalar(runtime, "SELECT count(*) FROM job WHERE state = 'succeeded'") == total,
        60,
        "every job to succeed",
    )
    quiesce(runtime, amqp)
    serials = consumers_started(runtime)
    before = dict(runtime.results)
    rows_before = fingerprint(runtime)
    with runtime.pool.connection() as conn:
        jobs = conn.execute(b"SELECT id, kind, dispatch_seq FROM job ORDER BY id").fetchall()
    replays = [(job_id, kind, seq) for job_id, kind, top in jobs for seq in range(1, top + 1)] * 2
    rng.shuffle(replays)
    stale = [
        (job_id, kind, top + 5) for job_id, kind, top in (rng.choice(jobs) for _ in range(STALE))
    ]
    clock = DropClock(runtime)
    publisher = Publisher(amqp)
    try:
        # Phase 1: every pointer of every generation, twice.
        replay_started = time.monotonic()
        for job_id, kind, seq in replays:
            assert publisher.publish(pointer(job_id, P, seq, kind), routing_key(runtime, kind))
        wait_for(lambda: clock.count() >= len(replays), 30, "the replays to be dropped")
        replay_s = time.monotonic() - replay_started
        # Phase 2: pointers of a generation that never existed, timed one by one.
        published_at: list[float] = []
        for job_id, kind, seq in stale:
            assert publisher.publish(pointer(job_id, P, seq, kind), routing_key(runtime, kind))
            published_at.append(time.monotonic())
        expected = len(replays) + len(stale)
        wait_for(lambda: clock.count() >= expected, 30, "the stale pointers to be dropped")
        stale_s = clock.dropped_at[expected - 1] - published_at[0]
    finally:
        publisher.close()
    quiesce(runtime, amqp)
    dropped_at = clock.dropped_at[len(replays) :]
    # Consumption is nearly FIFO: pair the i-th stale publish with the i-th drop.
    latencies = [done - sent for sent, done in zip(published_at, dropped_at, strict=True)]
    after = dict(runtime.results)
    delta = {r.value: after[r] - before[r] for r in StepResult if after[r] != before[r]}
    audit = scalar(runtime, "SELECT count(*) FROM audit_commit")
    succeeded = scalar(runtime, "SELECT count(*) FROM job WHERE state = 'succeeded'")
    generations = Counter(top for _, _, top in jobs)
    print(
        f"duplicates tally (seed {seed}): jobs={total} generations={dict(generations)} "
        f"replayed={len(replays)} stale={len(stale)} result deltas={delta} audit rows={audit} "
        f"replays drained in {replay_s:.3f}s; stale drained in {stale_s:.3f}s, per pointer "
        f"(rank-matched) p50={statistics.median(latencies) * 1000:.1f}ms "
        f"p99={percentile(latencies, 0.99) * 1000:.1f}ms max={max(latencies) * 1000:.1f}ms "
        f"errors logged={len(errors.records)}"
    )
    assert audit == succeeded == total, "a job without exactly one commit"
    assert delta == {"dropped": len(replays) + len(stale)}, (
        f"not every pointer was dropped: {delta}"
    )
    assert fingerprint(runtime) == rows_before, "a replayed pointer wrote to the database"
    assert generations.get(2, 0) > 0, "no job had a second generation to replay"
    assert stale_s < DRAIN_LIMIT_S, f"stale pointers took {stale_s:.2f}s to drop"
    assert replay_s < 2 * DRAIN_LIMIT_S, f"replays took {replay_s:.2f}s to drop"
    assert consumers_started(runtime) == serials, "a Dramatiq consumer restarted"
    assert not errors.records, [r.getMessage() for r in errors.records[:3]]


# --- malformed and hostile messages --------------------------------------------------------

DROPPED = "dropped"
REFUSED = "refused"  # by the broker, at publish
EITHER = "dropped or dead-lettered"  # a valid envelope in a hostile wrapping: both are fine


@dataclass(frozen=True, slots=True)
class Case:
    name: str  # the class of message
    body: bytes
    routing_key: str
    expected: str  # a rejection reason (dead-lettered with it), DROPPED, REFUSED or EITHER
    properties: pika.BasicProperties | None = None


def malformed_cases(runtime: Runtime, existing: list[Job], rng: random.Random) -> list[Case]:
    """200 messages in ≥ 10 classes, shuffled."""
    lanes = [routing_key(runtime, kind) for kind in KINDS]
    invalid = [(str(r), raw) for r, raw in MALFORMED.items()]
    invalid += [(str(r), raw) for r, raw in MORE_MALFORMED]
    cases = [
        Case(f"envelope: {reason}", raw, lanes[i % 2], reason)
        for i, (reason, raw) in enumerate(invalid)
    ]
    mib = pointer(uuid.uuid4(), P, 1, KINDS[0]).ljust(1024 * 1024)  # valid JSON, 1 MiB
    assert len(mib) > MAX_ENVELOPE_BYTES
    cases.append(Case("1 MiB body", mib, lanes[0], "too_large"))

    def unknown(i: int) -> bytes:
        return pointer(uuid.uuid4(), P, 1, KINDS[i % 2])

    def of(job: Job, project: str, seq: int) -> Case:
        return Case("", pointer(job.id, project, seq, job.kind), routing_key(runtime, job.kind), "")

    for i in range(15):
        job = existing[i % len(existing)]
        cases.append(Case("valid envelope: unknown job", unknown(i), lanes[i % 2], DROPPED))
        foreign = of(job, "elsewhere", job.dispatch_seq)  # routed to this project's queue
        cases.append(replace(foreign, name="valid envelope: other project", expected=DROPPED))
        wrong = of(job, P, job.dispatch_seq + 3)
        cases.append(replace(wrong, name="valid envelope: wrong generation", expected=DROPPED))
        done = of(job, P, job.dispatch_seq)
        cases.append(replace(done, name="valid envelope: finished job", expected=DROPPED))
    forged = pika.BasicProperties(user_id="admin", delivery_mode=2)
    hostile = [{"x-delivery-count": "many"}, {"x-delivery-count": {"n": 1}}]
    for i in range(10):
        cases.append(Case("forged user_id", unknown(i), lanes[i % 2], REFUSED, forged))
        headers = pika.BasicProperties(headers=hostile[i % 2], delivery_mode=2)
        cases.append(
            Case("hostile x-delivery-count header", unknown(i), lanes[i % 2], EITHER, headers)
        )
    filler = [case for case in cases if case.name.startswith("envelope: ")]
    while len(cases) < 200:
        cases.append(rng.choice(filler))
    rng.shuffle(cases)
    return cases


def dead_letters(amqp: Amqp) -> list[tuple[str | None, bytes]]:
    channel = amqp.connect().channel()
    found: list[tuple[str | None, bytes]] = []
    while True:
        method, properties, body = channel.basic_get(amqp.names.dead_queue, auto_ack=True)
        if method is None:
            channel.close()
            return found
        found.append(((properties.headers or {}).get(REASON_HEADER), body))


class Ledger:
    """What each published message should become, and (in ``outcomes``) what became of it."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.dead: Counter[tuple[str, bytes]] = Counter()  # (reason, body) expected
        self.drops = 0  # valid envelopes the broker accepted: each must be dropped
        self.either: set[bytes] = set()  # bodies that may be dropped or dead-lettered
        self._class_of: dict[bytes, str] = {}

    def publish(self, publisher: Publisher, case: Case) -> None:
        self._class_of[case.body] = case.name
        if not publisher.publish(case.body, case.routing_key, case.properties):
            self.outcomes[f"{case.name} -> refused by the broker"] += 1
            assert case.expected == REFUSED, f"the broker refused {case.name}"
        elif case.expected == EITHER:
            self.either.add(case.body)
        elif case.expected in (DROPPED, REFUSED):  # a forged user_id let through: dropped
            self.drops += 1
        else:
            self.dead[(case.expected, case.body)] += 1

    def settle(self, collected: list[tuple[str | None, bytes]], dropped: int) -> int:
        """Tally what happened; returns how many drops there should have been."""
        for reason, raw in collected:
            self.outcomes[f"{self._class_of.get(raw, '?')} -> dead-lettered ({reason})"] += 1
        either_dead = sum(1 for _, raw in collected if raw in self.either)
        expected = self.drops + len(self.either) - either_dead
        self.outcomes[f"valid envelopes -> dropped (expected {expected})"] += dropped
        return expected


def test_malformed_and_hostile_messages_are_dead_lettered_or_dropped(
    runtime: Runtime, amqp: Amqp, errors: ErrorLog
) -> None:
    seed = int(os.environ.get("VIBEY_MALFORMED_SEED") or random.SystemRandom().randrange(2**31))
    print(f"\nmalformed seed: {seed} (rerun with VIBEY_MALFORMED_SEED={seed})")
    existing = [
        runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind=kind, subject=f"existing-{i}")).job
        for i, kind in enumerate(KINDS * 2)
    ]
    wait_for(
        lambda: scalar(runtime, "SELECT count(*) FROM job WHERE state = 'succeeded'") == 4,
        20,
        "the existing jobs",
    )
    quiesce(runtime, amqp)
    runtime.reconciler.stop()  # its dead-letter drain would ack what this test reads
    existing = [job for job in map(runtime.jobs.get, (j.id for j in existing)) if job]
    cases = malformed_cases(runtime, existing, random.Random(seed))
    serials = consumers_started(runtime)
    rows_before = fingerprint(runtime)
    before = dict(runtime.results)

    ledger = Ledger()
    publisher = Publisher(amqp)
    started = time.monotonic()
    try:
        for case in cases:
            ledger.publish(publisher, case)
    finally:
        publisher.close()
    published_s = time.monotonic() - started
    collected: list[tuple[str | None, bytes]] = []

    def handled() -> bool:
        collected.extend(dead_letters(amqp))
        either_dead = sum(1 for _, raw in collected if raw in ledger.either)
        drops = runtime.results[StepResult.DROPPED] - before[StepResult.DROPPED]
        return (
            len(collected) >= sum(ledger.dead.values()) + either_dead
            and drops >= ledger.drops + len(ledger.either) - either_dead
        )

    wait_for(handled, 45, "every message to be dead-lettered or dropped")
    handled_s = time.monotonic() - started
    time.sleep(1.0)  # anything extra (a redelivery after a crash) shows up now
    collected.extend(dead_letters(amqp))
    dropped = runtime.results[StepResult.DROPPED] - before[StepResult.DROPPED]
    expected_drops = ledger.settle(collected, dropped)
    delta = {
        r.value: runtime.results[r] - before[r]
        for r in StepResult
        if runtime.results[r] != before[r]
    }
    by_reason = Counter(str(reason) for reason, _ in collected)
    crashes = [r.getMessage() for r in errors.records]
    print(
        f"malformed tally (seed {seed}): messages={len(cases)} "
        f"classes={len({c.name for c in cases})} refused by the broker={publisher.refused} "
        f"dead letters by reason={dict(sorted(by_reason.items()))} step results={delta} "
        f"published in {published_s:.2f}s, all handled {handled_s:.2f}s after the first "
        f"publish; consumer crashes/errors logged={len(crashes)}"
    )
    for line, n in sorted(ledger.outcomes.items()):
        print(f"  {n:4d}  {line}")
    problems = []
    if consumers_started(runtime) != serials or crashes:
        problems.append(f"worker crashes: consumers restarted; logged {crashes[:2]}")
    dead = Counter((r, raw) for r, raw in collected if raw not in ledger.either)
    if dead != ledger.dead:
        problems.append("dead letters differ from the envelope-invalid messages published")
    if any(reason is None for reason, _ in collected):
        problems.append("a dead letter without an x-vibey-reason")
    if delta != {"dropped": expected_drops}:
        problems.append(f"valid envelopes: {delta}, expected {expected_drops} drops only")
    if fingerprint(runtime) != rows_before:
        problems.append("a malformed or foreign pointer wrote to the database")
    if handled_s > DRAIN_LIMIT_S:
        problems.append(f"handling took {handled_s:.1f}s (K4: within {DRAIN_LIMIT_S:.0f}s)")
    ok = runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind=KINDS[0], subject="after")).job
    wait_for(
        lambda: (job := runtime.jobs.get(ok.id)) is not None and job.state.value == "succeeded",
        15,
        "a healthy job after the flood",
    )
    assert len({c.name for c in cases}) >= 10 and len(cases) == 200
    assert not problems, problems
