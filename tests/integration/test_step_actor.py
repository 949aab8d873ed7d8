"""The whole dispatch path in one process: enqueue → outbox → relay → RabbitMQ → Dramatiq
consumer → step actor → fenced claim → handler → settle → the next step's pointer."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

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
from actors.topology import REASON_HEADER
from actors.worker import Runtime, WorkerConfig
from tests.amqp_fixtures import Amqp
from workflows.dispatch import DispatchEnvelope, WaitTiers, encode
from workflows.job import FailureClass, JobState
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Failure, Handlers, Success

P = "proj"
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))


def boom(job: Job) -> Success:
    raise RuntimeError(f"handler bug on {job.subject}")


HANDLERS: Handlers = {
    "design.interview": lambda job: Success({"subject": job.subject}),
    "design.research": boom,
    "design.spec": lambda job: Failure(FailureClass.WORK, "spec rejected", retry_in=timedelta(0)),
}


@pytest.fixture
def runtime(pg_url: str, amqp: Amqp) -> Iterator[Runtime]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(
            rabbitmq=RabbitMqSettings(
                wait_tiers_seconds=TIERS.seconds, reconcile_interval_seconds=1
            )
        ),
        worker=WorkerSettings(threads=4),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # recorded: cleanup
    runtime = Runtime(config, handlers=HANDLERS, owner="test-worker")
    runtime.start()
    try:
        yield runtime
    finally:
        runtime.stop(timeout=10)


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def states(runtime: Runtime, *jobs: Job) -> list[JobState]:
    return [j.state for j in (runtime.jobs.get(job.id) for job in jobs) if j is not None]


def test_a_chain_of_steps_runs_to_the_end(runtime: Runtime) -> None:
    first = runtime.jobs.enqueue(
        EnqueueRequest(project_id=P, kind="design.interview", subject="1")
    ).job
    second = runtime.jobs.enqueue(
        EnqueueRequest(project_id=P, kind="design.interview", subject="2", depends_on=(first.id,))
    ).job
    third = runtime.jobs.enqueue(
        EnqueueRequest(project_id=P, kind="design.interview", subject="3", depends_on=(second.id,))
    ).job
    wait_for(lambda: states(runtime, first, second, third) == [JobState.SUCCEEDED] * 3)
    # A step's result is counted once its unit has committed and done what follows the commit.
    wait_for(lambda: runtime.results[StepResult.SUCCEEDED] >= 3)
    done = runtime.jobs.get(third.id)
    assert done is not None and done.result == {"subject": "3"} and done.attempts == 1
    assert runtime.results[StepResult.SUCCEEDED] == 3


def test_a_handler_exception_is_a_failed_attempt_not_a_crash(runtime: Runtime) -> None:
    job = runtime.jobs.enqueue(
        EnqueueRequest(project_id=P, kind="design.research", max_attempts=1)
    ).job
    wait_for(lambda: states(runtime, job) == [JobState.FAILED])
    failed = runtime.jobs.get(job.id)
    assert failed is not None and failed.failure_class is FailureClass.VIBEY
    assert failed.last_error is not None and "handler bug" in failed.last_error
    ok = runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job
    wait_for(lambda: states(runtime, ok) == [JobState.SUCCEEDED])  # the worker lives on


def test_a_failure_with_attempts_left_is_dispatched_again(runtime: Runtime) -> None:
    job = runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.spec", max_attempts=3)).job
    wait_for(lambda: states(runtime, job) == [JobState.FAILED])
    failed = runtime.jobs.get(job.id)
    assert failed is not None and failed.attempts == 3 and failed.dispatch_seq == 3


def publish(
    amqp: Amqp,
    body: bytes,
    routing_key: str = f"shared.interactive.{P}",
    properties: pika.BasicProperties | None = None,
) -> None:
    connection = amqp.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        amqp.names.work_exchange,
        routing_key,
        body,
        properties or pika.BasicProperties(),
        mandatory=True,
    )


def dead_letters(amqp: Amqp) -> list[dict]:
    channel = amqp.connect().channel()
    found: list[Any] = []
    while True:
        method, properties, _body = channel.basic_get(amqp.names.dead_queue, auto_ack=True)
        if method is None:
            return found
        found.append(properties.headers or {})


def test_malformed_pointers_are_dead_lettered_with_a_reason(runtime: Runtime, amqp: Amqp) -> None:
    runtime.reconciler.stop()  # keep the dead-letter queue for the test to read
    bodies = [
        b"not json",
        b'{"schema":"vibey.job.dispatch/1"}',
        b'{"schema":"vibey.job.dispatch/9"}',
        b"\xff\xfe",
        b"[1,2]",
    ]
    for body in bodies:
        publish(amqp, body)
    collected: list[dict] = []

    def all_dead() -> bool:
        collected.extend(dead_letters(amqp))
        return len(collected) >= len(bodies)

    wait_for(all_dead, timeout=10)
    reasons = {h.get(REASON_HEADER) for h in collected}
    assert reasons == {"not_json", "missing_field", "unknown_schema", "not_utf8", "not_object"}
    assert sum(runtime.jobs.queue_depth(P).values()) == 0  # nothing written
    ok = runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job
    wait_for(lambda: states(runtime, ok) == [JobState.SUCCEEDED])  # the worker lives on


def test_duplicate_and_stale_pointers_change_nothing(runtime: Runtime, amqp: Amqp) -> None:
    job = runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job
    wait_for(lambda: states(runtime, job) == [JobState.SUCCEEDED])
    for seq in (1, 1, 1, 7):  # duplicates of a finished generation, and one from nowhere
        envelope = DispatchEnvelope(
            job_id=job.id, project_id=P, dispatch_seq=seq, kind=job.kind, not_before=job.run_after
        )
        publish(amqp, encode(envelope))
    unknown = DispatchEnvelope(
        job_id=uuid.uuid4(), project_id=P, dispatch_seq=1, kind=job.kind, not_before=job.run_after
    )
    publish(amqp, encode(unknown))
    wait_for(lambda: runtime.results[StepResult.DROPPED] >= 5)
    settled = runtime.jobs.get(job.id)
    assert (
        settled is not None and settled.attempts == 1 and runtime.results[StepResult.SUCCEEDED] == 1
    )


def test_a_pointer_names_its_workflow_to_the_runner_and_a_bad_name_changes_nothing(
    runtime: Runtime, amqp: Amqp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay's ``correlation_id`` (the job's workflow, else the job) reaches the runner as
    ``workflow`` when it names a workflow: a hint that lets the claim's round trip carry the
    workflow's history. A hint that is not a UUID, or names another workflow, costs at most
    a read: the pointer is judged by its row as always."""
    delivered: list[dict[str, Any]] = []
    run = runtime.runner.run

    def recording(**pointer: Any) -> StepResult:
        delivered.append(pointer)
        return run(**pointer)

    monkeypatch.setattr(runtime.runner, "run", recording)
    job = runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job
    wait_for(lambda: states(runtime, job) == [JobState.SUCCEEDED])
    other = uuid.uuid4()
    for correlation in (str(other), "not a uuid"):
        envelope = DispatchEnvelope(
            job_id=job.id, project_id=P, dispatch_seq=1, kind=job.kind, not_before=job.run_after
        )
        publish(amqp, encode(envelope), properties=pika.BasicProperties(correlation_id=correlation))
    wait_for(lambda: runtime.results[StepResult.DROPPED] >= 2)
    named = sorted(p["workflow"] for p in delivered if "workflow" in p)
    assert named == sorted([str(other), "not a uuid"])  # the relay's own: the job, no name
    assert len(delivered) > len(named)
    settled = runtime.jobs.get(job.id)
    assert settled is not None and settled.attempts == 1
    assert runtime.results[StepResult.SUCCEEDED] == 1
