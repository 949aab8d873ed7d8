"""Short steps (``workflows.steps.Short``): the first delivery claims, runs and settles in one
transaction. The same guarantees as the two-commit path: attempts are counted, a crash before
the commit changes nothing (the redelivery runs it on the two-commit path), one commit."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest

from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.steps import CrashPoint, StepResult
from actors.worker import Runtime, WorkerConfig
from tests.amqp_fixtures import Amqp
from workflows.job import FailureClass, JobState
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Failure, Handlers, Short, Success

P = "short"
HANDLERS: Handlers = {
    "design.interview": Short(lambda job: Success({"subject": job.subject})),
    "design.spec": Short(
        lambda job: Failure(FailureClass.WORK, "spec rejected", retry_in=timedelta(0))
    ),
}


class Crash(Exception):
    pass


class CrashAfterWork:
    """Raises at AFTER_WORK: the process 'dies' with the settle uncommitted."""

    def reached(self, point: CrashPoint, job_id: UUID, seq: int, count: int) -> None:
        if point is CrashPoint.AFTER_WORK:
            raise Crash(str(job_id))


@pytest.fixture
def runtime(pg_url: str, amqp: Amqp) -> Iterator[Runtime]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(rabbitmq=RabbitMqSettings(reconcile_interval_seconds=1)),
        worker=WorkerSettings(threads=2),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    runtime = Runtime(config, handlers=HANDLERS, owner="short-worker")
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


def state(runtime: Runtime, job: Job) -> JobState | None:
    found = runtime.jobs.get(job.id)
    return None if found is None else found.state


def test_a_chain_of_short_steps_runs_to_the_end_one_attempt_each(runtime: Runtime) -> None:
    first = runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job
    second = runtime.jobs.enqueue(
        EnqueueRequest(project_id=P, kind="design.interview", subject="2", depends_on=(first.id,))
    ).job
    wait_for(lambda: state(runtime, second) is JobState.SUCCEEDED)
    done = runtime.jobs.get(second.id)
    assert done is not None and done.attempts == 1 and done.result == {"subject": "2"}
    assert done.lease_owner is None and done.lease_token is None


def test_a_short_failure_counts_its_attempts(runtime: Runtime) -> None:
    job = runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.spec", max_attempts=3)).job
    wait_for(lambda: state(runtime, job) is JobState.FAILED)
    failed = runtime.jobs.get(job.id)
    assert failed is not None and failed.attempts == 3 and failed.dispatch_seq == 3


def test_a_crash_before_the_commit_leaves_the_job_as_it_was(pg_url: str, amqp: Amqp) -> None:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    runtime = Runtime(config, handlers=HANDLERS, owner="crashing")  # not started: no consumer
    runtime.runner._crash = CrashAfterWork()
    try:
        job = runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job
        pointer: dict[str, Any] = {
            "job_id": str(job.id),
            "project_id": P,
            "seq": job.dispatch_seq,
            "kind": job.kind,
            "routing_key": "r",
        }
        with pytest.raises(Crash):
            runtime.runner.run(**pointer)
        after = runtime.jobs.get(job.id)
        assert after is not None and after.state is JobState.READY
        assert after.attempts == 0 and after.dispatch_seq == job.dispatch_seq
        assert after.lease_owner is None
        # The redelivery runs on the two-commit path: its claim commits (the attempt counts).
        with pytest.raises(Crash):
            runtime.runner.run(**pointer, redelivered=True)
        leased = runtime.jobs.get(job.id)
        assert leased is not None and leased.state is JobState.LEASED and leased.attempts == 1
        runtime.runner._crash = None
        # The lease is live: a third delivery waits for it in a wait tier.
        assert runtime.runner.run(**pointer, delivery=1) is StepResult.REDELAYED
    finally:
        runtime.runner.close()
        runtime.broker.close()
        runtime.pool.close()
