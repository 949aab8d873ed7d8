"""Continue in place (``actors.in_place``): a short step's settle that releases a job this
process consumes runs that job right after the commit, on the same thread, with no broker hop;
its outbox row is marked sent in the claiming step's transaction. Bounded, fenced, and left to
the drain when the process stops in between."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkflowSettings,
)
from actors.steps import CrashPoint, StepResult
from actors.worker import Runtime, WorkerConfig
from tests.amqp_fixtures import Amqp
from tests.integration.test_workflow_start import Wire
from tests.tiny_definition import THREE_STEP_HANDLERS
from workflows.job import JobState
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Handlers, Short, Success

P = "inplace"
HANDLERS: Handlers = {
    "design.interview": Short(lambda job: Success({"subject": job.subject})),
    **{kind: Short(handler) for kind, handler in THREE_STEP_HANDLERS.items()},
}


def runtime_of(pg_url: str, amqp: Amqp, in_place_steps: int) -> Runtime:
    """A worker's parts, not started: the test delivers pointers by calling the runner."""
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        # A chain's bound under test is its steps: its time budget (250 ms by default) is what
        # a loaded box would cut first, and these tests count steps.
        queue=QueueSettings(
            rabbitmq=RabbitMqSettings(in_place_steps=in_place_steps, in_place_ms=60_000)
        ),
        workflow=WorkflowSettings(definitions="tests.tiny_definition:THREE_STEPS"),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    connection.close()
    return Runtime(config, handlers=HANDLERS, owner="in-place")


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


def deliver(runtime: Runtime, job: Job, *, named: bool | str = True) -> StepResult:
    """The pointer's delivery, as the consumer makes it: naming the job's workflow (the
    relay's ``correlation_id``), unless ``named`` is false (a pointer published without) or
    another name (a pointer naming a workflow it is not of)."""
    return runtime.runner.run(
        job_id=str(job.id),
        project_id=job.project_id,
        seq=job.dispatch_seq,
        kind=job.kind,
        routing_key="r",
        workflow=named
        if isinstance(named, str)
        else (str(job.workflow_id) if named and job.workflow_id else None),
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


def one_by_one(runtime: Runtime, project: str = P) -> tuple[Any, Job]:
    """A started ``one-by-one`` workflow (each step scheduled when the one before succeeded)
    and its first step's job."""
    workflow = runtime.workflows.start(project, definition="one-by-one").workflow
    [first] = [j for j in runtime.jobs.list_for_cycle(project, 0) if j.workflow_id == workflow.id]
    return workflow, first


def steps_of(runtime: Runtime, workflow: Any) -> dict[str | None, Job]:
    jobs = runtime.jobs.list_for_cycle(workflow.project_id, 0)
    return {j.step: j for j in jobs if j.workflow_id == workflow.id}


def test_a_step_the_settle_schedules_runs_in_place_its_row_written_held(
    runtime: Runtime, pg_url: str
) -> None:
    sent: list[Any] = []
    runtime.jobs.units._publish = sent.extend
    workflow, first = one_by_one(runtime)
    sent.clear()
    assert deliver(runtime, first) is StepResult.SUCCEEDED
    assert runtime.workflows.get(workflow.id).status.value == "completed"
    assert sent == []  # b and c ran here: no pointer went to the broker
    steps = steps_of(runtime, workflow)
    assert sorted(s for s in steps if s) == ["a", "b", "c"]
    for step in ("b", "c"):
        assert outbox(pg_url, steps[step]) == [(True, False)]  # held, then sent by its claim


def test_a_cut_after_a_settle_that_scheduled_the_next_step_leaves_it_to_the_drain(
    runtime: Runtime, pg_url: str
) -> None:
    sent: list[Any] = []
    runtime.jobs.units._publish = sent.extend
    workflow, first = one_by_one(runtime)
    sent.clear()
    runtime.runner._crash = DieAfterSettle()
    with pytest.raises(Die):
        deliver(runtime, first)
    assert sent == []
    following = steps_of(runtime, workflow)["b"]
    assert following.state is JobState.READY
    # Written unclaimed by its insert (no relay holds it) and unsent: the drain's to send.
    assert outbox(pg_url, following) == [(False, False)]
    runtime.runner._crash = None
    assert runtime.relay.drain() == 1


@pytest.mark.parametrize("named", [True, False], ids=["workflow named", "workflow unnamed"])
def test_an_in_place_workflow_step_costs_two_round_trips_and_at_most_six_statements(
    pg_url: str, amqp: Amqp, named: bool
) -> None:
    """Per step: the workflow's lock and the job's fenced claim, one statement (which marks a
    held row sent); then the ack
    (the claim's write with it), the next job's insert (its outbox row written held), the
    workflow's history, events and state, and the COMMIT, all read after the commit. No
    statement releases the held row or marks it sent on its own, and the decision takes no
    savepoint (one that fails rolls the unit back and is settled again with one).

    The first step a process takes of a workflow also reads its history (the
    non-determinism guard): behind the claim, in its round trip, when the pointer names the
    workflow (as the relay's do); in a round trip of its own when it does not."""
    parts = urlsplit(pg_url)
    wire = Wire(parts.hostname or "127.0.0.1", parts.port or 5432)
    netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{wire.port}"
    proxied = urlunsplit(parts._replace(netloc=netloc, query="sslmode=disable"))
    runtime = runtime_of(proxied, amqp, in_place_steps=3)
    try:
        runtime.jobs.units._publish = lambda rows: None
        _, warm_first = one_by_one(runtime, "wire-warm")
        assert deliver(runtime, warm_first, named=named) is StepResult.SUCCEEDED  # prepared
        workflow, first = one_by_one(runtime, "wire")
        wire.reset()
        assert deliver(runtime, first, named=named) is StepResult.SUCCEEDED
        waits, statements = wire.waits, wire.count(b"E")
        assert runtime.workflows.get(workflow.id).status.value == "completed"
        # a, b (held), c (held): two each; the history this process reads the first time it
        # touches the workflow (the non-determinism guard, at a): with a's claim when the
        # pointer names the workflow, else in a round trip before a's update
        assert waits == (2 if named else 3) + 2 + 2
        # BEGIN, the claim (the workflow's row locked, then the job's), ack (the claim's write
        # with it), insert (a and b only), update, COMMIT; and a's history read
        assert statements == 6 + 6 + 5 + 1
    finally:
        close(runtime)
        wire.close()


def test_a_decision_that_fails_without_a_savepoint_is_settled_again_and_blocks(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short step's decision takes no savepoint: when it raises, its unit rolls back and
    the step is settled again in one that takes it, where the failure blocks the workflow
    and the step's success still commits. The handler runs once."""
    from tests.tiny_definition import OneByOne
    from workflows.engine import StepSucceeded

    decide = OneByOne.decide

    def broken(self: Any, state: Any, event: Any, now: Any) -> Any:
        if isinstance(event, StepSucceeded) and event.step == "b":
            raise RuntimeError("a definition bug")
        return decide(self, state, event, now)

    monkeypatch.setattr(OneByOne, "decide", broken)
    ran: list[str] = []

    def synthesize(job: Job) -> Success:
        ran.append(job.step or "")
        return Success()

    runtime.runner._handlers = {**runtime.runner._handlers, "design.synthesize": Short(synthesize)}
    workflow, first = one_by_one(runtime)
    assert deliver(runtime, first) is StepResult.SUCCEEDED
    assert ran == ["b"]  # once: the second unit settles the outcome the first one had
    steps = steps_of(runtime, workflow)
    assert steps["b"].state is JobState.SUCCEEDED and "c" not in steps
    assert runtime.workflows.get(workflow.id).status.value == "blocked"
    gates = [gate.kind for gate, _ in runtime.workflows.inbox(workflow.project_id)]
    assert gates == ["workflow_error"]


def test_a_pointer_naming_another_workflow_costs_a_read_and_changes_nothing(
    runtime: Runtime,
) -> None:
    """The history sent behind the claim is another workflow's: the guard reads this one's
    own, and the workflow runs to its end in place."""
    workflow, first = one_by_one(runtime, "misnamed")
    assert deliver(runtime, first, named=str(uuid.uuid4())) is StepResult.SUCCEEDED
    assert runtime.workflows.get(workflow.id).status.value == "completed"


@pytest.mark.parametrize(
    "named",
    [True, False, "00000000-0000-4000-8000-000000000000"],
    ids=["workflow named", "workflow unnamed", "another workflow named"],
)
def test_a_changed_definition_is_caught_by_the_first_step_a_process_takes(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, named: bool | str
) -> None:
    """The non-determinism guard's history read, whether it travelled with the claim (the
    pointer named the workflow) or went on its own: a process whose definition would not
    have made the workflow's start blocks the workflow at its first step, schedules nothing,
    and the step's success still commits."""
    from dataclasses import replace

    from tests.tiny_definition import OneByOne
    from workflows.engine import Decision, ScheduleStep, Started, TransitionPhase

    workflow, first = one_by_one(runtime, f"drift-{named is True}-{named is False}")
    decide = OneByOne.decide

    def drifted(self: Any, state: Any, event: Any, now: Any) -> Any:
        if isinstance(event, Started):  # the same name and version, another first step
            step = ScheduleStep(step="x", kind="design.research")
            return Decision(replace(state, stage="x"), (TransitionPhase("design", 0), step))
        return decide(self, state, event, now)

    monkeypatch.setattr(OneByOne, "decide", drifted)
    assert deliver(runtime, first, named=named) is StepResult.SUCCEEDED
    blocked = runtime.workflows.get(workflow.id)
    assert blocked.status.value == "blocked" and "non-determinism" in (blocked.reason or "")
    steps = steps_of(runtime, workflow)
    assert steps["a"].state is JobState.SUCCEEDED and set(steps) == {"a"}


def test_a_decision_whose_insert_fails_at_the_commit_is_settled_again_and_blocks(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next job's insert is read after the commit, so its error (a step name the
    workflow used already: the job's (workflow, step) key) comes back with the COMMIT's:
    the unit rolls back, and the step is settled again in one that takes the savepoint,
    where the error is read inside it and blocks the workflow; the step's success commits."""
    from tests.tiny_definition import OneByOne
    from workflows.engine import Decision, ScheduleStep, StepSucceeded

    decide = OneByOne.decide

    def again(self: Any, state: Any, event: Any, now: Any) -> Any:
        if isinstance(event, StepSucceeded) and event.step == "b":  # "a" again, another kind
            return Decision(state, (ScheduleStep(step="a", kind="design.spec"),))
        return decide(self, state, event, now)

    monkeypatch.setattr(OneByOne, "decide", again)
    workflow, first = one_by_one(runtime)
    assert deliver(runtime, first) is StepResult.SUCCEEDED
    steps = steps_of(runtime, workflow)
    assert steps["a"].kind == "design.research" and steps["a"].state is JobState.SUCCEEDED
    assert steps["b"].state is JobState.SUCCEEDED
    assert runtime.workflows.get(workflow.id).status.value == "blocked"
    gates = [gate.kind for gate, _ in runtime.workflows.inbox(workflow.project_id)]
    assert gates == ["workflow_error"]


def test_a_step_claim_locks_its_workflow_before_its_job(runtime: Runtime, pg_url: str) -> None:
    """The claim locks the workflow and the job in one statement, in the store's lock order:
    while the workflow's row is held elsewhere, the claim waits on it holding nothing of the
    job, whose row another writer can still lock."""
    import threading

    workflow, first = one_by_one(runtime)
    ran: list[StepResult] = []
    with psycopg.connect(pg_url) as holder:
        holder.execute("SELECT 1 FROM workflow WHERE id = %s FOR UPDATE", (workflow.id,))
        step = threading.Thread(target=lambda: ran.append(deliver(runtime, first)))
        step.start()
        with psycopg.connect(pg_url, autocommit=True) as probe:
            for _ in range(200):  # till the claim waits on the workflow's lock
                waiting = probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE %s",
                    ("%claim_dependents%",),
                ).fetchone()
                if waiting and waiting[0]:
                    break
                time.sleep(0.02)
            else:
                pytest.fail("the claim never waited on its workflow's lock")
            probe.execute("SET lock_timeout = '500ms'")
            probe.execute("SELECT 1 FROM job WHERE id = %s FOR NO KEY UPDATE", (first.id,))
        holder.rollback()
    step.join(timeout=30)
    assert ran == [StepResult.SUCCEEDED]
    assert runtime.workflows.get(workflow.id).status.value == "completed"
