"""Continue in place (``actors.in_place``): a short step's settle that releases a job this
process consumes runs that job right after the commit, on the same thread, with no broker hop;
its outbox row is marked sent in the claiming step's transaction. Bounded, fenced, and left to
the drain when the process stops in between."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings, QueueSettings, RabbitMqSettings
from actors.steps import CrashPoint, StepResult
from actors.worker import Runtime, WorkerConfig
from tests.amqp_fixtures import Amqp
from workflows.job import JobState
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Handlers, Short, Success

P = "inplace"
HANDLERS: Handlers = {
    "design.interview": Short(lambda job: Success({"subject": job.subject})),
}


def runtime_of(pg_url: str, amqp: Amqp, in_place_steps: int) -> Runtime:
    """A worker's parts, not started: the test delivers pointers by calling the runner."""
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(rabbitmq=RabbitMqSettings(in_place_steps=in_place_steps)),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    connection.close()
    runtime = Runtime(config, handlers=HANDLERS, owner="in-place")
    # A chain's bound under test is its steps: its time budget (250 ms) is what a loaded box
    # would cut first, and those tests count steps.
    if runtime.runner._in_place is not None:
        runtime.runner._in_place = replace(runtime.runner._in_place, budget=60.0)
    return runtime


@pytest.fixture
def runtime(pg_url: str, amqp: Amqp) -> Iterator[Runtime]:
    runtime = runtime_of(pg_url, amqp, in_place_steps=3)
    try:
        yield runtime
    finally:
        close(runtime)


def close(runtime: Runtime) -> None:
    runtime.runner.close()
    runtime.broker.close()
    runtime.pool.close()


def chain(runtime: Runtime, length: int) -> list[Job]:
    jobs = [runtime.jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job]
    for n in range(1, length):
        request = EnqueueRequest(
            project_id=P, kind="design.interview", subject=str(n), depends_on=(jobs[-1].id,)
        )
        jobs.append(runtime.jobs.enqueue(request).job)
    return jobs


def deliver(runtime: Runtime, job: Job) -> StepResult:
    return runtime.runner.run(
        job_id=str(job.id), project_id=P, seq=job.dispatch_seq, kind=job.kind, routing_key="r"
    )


def outbox(pg_url: str, job: Job) -> list[tuple[bool, bool]]:
    """(sent, held by a relay) of each of the job's outbox rows."""
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT sent_at IS NOT NULL, claimed_at IS NOT NULL FROM job_outbox "
            "WHERE job_id = %s ORDER BY id",
            (job.id,),
        ).fetchall()
    return [(bool(sent), bool(held)) for sent, held in rows]


def states(runtime: Runtime, jobs: list[Job]) -> list[JobState | None]:
    return [None if (j := runtime.jobs.get(job.id)) is None else j.state for job in jobs]


def test_one_delivery_runs_the_released_chain_in_place(runtime: Runtime, pg_url: str) -> None:
    jobs = chain(runtime, 3)
    sent: list[Any] = []
    runtime.jobs.units._publish = sent.extend  # what would reach the relay

    assert deliver(runtime, jobs[0]) is StepResult.SUCCEEDED
    assert states(runtime, jobs) == [JobState.SUCCEEDED] * 3
    assert sent == []  # no pointer went to the broker
    for job in jobs[1:]:
        done = runtime.jobs.get(job.id)
        assert done is not None and done.attempts == 1 and done.lease_owner is None
        assert outbox(pg_url, job) == [(True, False)]  # marked sent by the step that ran it


def test_a_chain_is_bounded_then_publishes(pg_url: str, amqp: Amqp) -> None:
    runtime = runtime_of(pg_url, amqp, in_place_steps=2)
    try:
        jobs = chain(runtime, 5)
        sent: list[Any] = []
        runtime.jobs.units._publish = sent.extend
        deliver(runtime, jobs[0])
        assert states(runtime, jobs) == [JobState.SUCCEEDED] * 3 + [JobState.READY] * 2
        assert [row.job_id for row in sent] == [jobs[3].id]  # the fourth goes via the broker
    finally:
        close(runtime)


def test_off_every_pointer_goes_through_the_broker(pg_url: str, amqp: Amqp) -> None:
    runtime = runtime_of(pg_url, amqp, in_place_steps=0)
    try:
        jobs = chain(runtime, 2)
        sent: list[Any] = []
        runtime.jobs.units._publish = sent.extend
        deliver(runtime, jobs[0])
        assert states(runtime, jobs) == [JobState.SUCCEEDED, JobState.READY]
        assert [row.job_id for row in sent] == [jobs[1].id]
    finally:
        close(runtime)


class Die(Exception):
    pass


class DieAfterSettle:
    """The process 'dies' right after the first settle committed, its next step held."""

    def reached(self, point: CrashPoint, job_id: Any, seq: int, count: int) -> None:
        if point is CrashPoint.AFTER_SETTLE:
            raise Die(str(job_id))


def test_a_chain_cut_leaves_the_pointer_to_the_drain(runtime: Runtime, pg_url: str) -> None:
    jobs = chain(runtime, 2)
    sent: list[Any] = []
    runtime.jobs.units._publish = sent.extend
    runtime.runner._crash = DieAfterSettle()
    with pytest.raises(Die):
        deliver(runtime, jobs[0])
    assert states(runtime, jobs) == [JobState.SUCCEEDED, JobState.READY]
    assert sent == []
    # Unsent and held by no relay: the next drain pass (any reconciler) takes and sends it.
    assert outbox(pg_url, jobs[1]) == [(False, False)]
    runtime.runner._crash = None
    assert runtime.relay.drain() == 1  # the relay's claim of unsent rows nobody holds
