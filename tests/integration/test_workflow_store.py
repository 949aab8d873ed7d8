"""The workflow store on real PostgreSQL: start, step settles, gates, timers, blocks, cancel,
verify, and concurrent events on one workflow.

Steps are claimed and settled here through the job repository and ``settle_txn`` (what the
step actor does), so these tests need no broker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from store.jobs import PostgresJobRepository
from store.workflows import WorkflowNotFound, WorkflowStore
from tests import tiny_definition
from tests.tiny_definition import Tiny
from workflows.engine import Registry, Status, StepSucceeded
from workflows.job import TIMER_KIND, FailureClass, JobState
from workflows.queue import AnswerStatus, Job
from workflows.steps import Failure, Success


@pytest.fixture
def jobs(pool: ConnectionPool) -> PostgresJobRepository:
    return PostgresJobRepository(pool=pool)


@pytest.fixture
def store(pool: ConnectionPool, jobs: PostgresJobRepository) -> WorkflowStore:
    return WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny()]))


@pytest.fixture(autouse=True)
def broken() -> Iterator[None]:
    tiny_definition.BROKEN["on"] = True
    yield
    tiny_definition.BROKEN["on"] = True


def claim_one(jobs: PostgresJobRepository, project: str) -> Job:
    claimed = jobs.claim(project, owner="t")
    assert len(claimed) == 1, claimed
    return claimed[0]


def succeed(store: WorkflowStore, jobs: PostgresJobRepository, job: Job) -> None:
    assert store.settle(job, Success({"ok": True})).applied


def fail(store: WorkflowStore, jobs: PostgresJobRepository, job: Job, detail: str) -> None:
    """A failed attempt (a work failure, retried at once), settled as the step actor does."""

    with jobs.units.begin() as unit:
        store.settle_txn(unit, job, Failure(FailureClass.WORK, detail, retry_in=timedelta(0)))


def gate_id(store: WorkflowStore, project: str, name: str = "g") -> UUID:
    [gate] = [g for g, _ in store.inbox(project) if g.name == name]
    return gate.id


def test_start_is_idempotent_and_schedules_the_first_step(
    store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    first = store.start("p1", definition="tiny", input={"k": "v"})
    second = store.start("p1", definition="tiny")
    assert first.created and not second.created
    assert first.workflow.id == second.workflow.id
    assert first.workflow.phase == "design" and first.workflow.last_seq == 1
    job = claim_one(jobs, "p1")
    assert (job.workflow_id, job.step, job.kind) == (first.workflow.id, "a", "design.research")
    assert job.payload["input"] == {"x": 1}
    [entry] = store.history(first.workflow.id)
    assert entry.event == {"type": "started", "input": {"k": "v"}}
    assert entry.commands is not None and [c["type"] for c in entry.commands] == [
        "transition_phase",
        "schedule_step",
    ]


def test_concurrent_starts_of_one_project_make_one_workflow(
    store: WorkflowStore, pool: ConnectionPool
) -> None:
    barrier = threading.Barrier(6)
    ids: list[UUID] = []

    def start() -> None:
        barrier.wait()
        ids.append(store.start("race", definition="tiny").workflow.id)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1
    with pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM workflow WHERE project_id = 'race'").fetchone()
    assert row == (1,)


def test_a_step_gate_and_timer_run_the_workflow_to_completion(
    store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    wf = store.start("p2", definition="tiny").workflow
    succeed(store, jobs, claim_one(jobs, "p2"))
    assert store.describe(store.get(wf.id)) == "tiny at gate"
    outcome = store.answer(gate_id(store, "p2"), "yes", by="ann")
    assert outcome.status is AnswerStatus.ANSWERED
    timer = claim_one(jobs, "p2")
    assert timer.kind == TIMER_KIND and timer.step == "timer:t"
    succeed(store, jobs, timer)
    done = store.get(wf.id)
    assert (done.status, done.completion_mode) == (Status.COMPLETED, "local")
    assert done.finished_at is not None
    events = [e.event["type"] for e in store.history(wf.id)]
    assert events == ["started", "step_succeeded", "gate_answered", "timer_fired"]
    assert store.verify(wf.id).ok


def test_answering_twice_or_outside_the_allowed_set_changes_nothing(
    store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    wf = store.start("p3", definition="tiny").workflow
    succeed(store, jobs, claim_one(jobs, "p3"))
    gid = gate_id(store, "p3")
    bad = store.answer(gid, "maybe", by="ann")
    assert bad.status is AnswerStatus.INVALID_ANSWER and "valid: yes, no, boom" in bad.detail
    assert store.answer(gid, "no", by="ann").status is AnswerStatus.ANSWERED
    seq = store.get(wf.id).last_seq
    again = store.answer(gid, "yes", by="bob")
    assert again.status is AnswerStatus.ALREADY_ANSWERED
    assert again.gate is not None and again.gate.answered_by == "ann"
    assert store.get(wf.id).last_seq == seq
    assert store.get(wf.id).status is Status.FAILED
    assert store.answer(uuid4(), "yes", by="ann").status is AnswerStatus.UNKNOWN_GATE


def test_a_failing_decide_blocks_behind_a_gate_and_retry_applies_the_waiting_events(
    store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    wf = store.start("p4", definition="tiny").workflow
    succeed(store, jobs, claim_one(jobs, "p4"))
    answered = store.answer(gate_id(store, "p4"), "boom", by="ann")
    assert answered.status is AnswerStatus.ANSWERED  # the answer is kept, the decision is not
    blocked = store.get(wf.id)
    assert blocked.status is Status.BLOCKED and "RuntimeError: boom" in (blocked.reason or "")
    assert (blocked.last_seq, blocked.applied_seq) == (3, 2)
    [error_gate] = [g for g, _ in store.inbox("p4") if g.kind == "workflow_error"]
    assert error_gate.answers == ("retry", "cancel")
    # Still broken: retry blocks again behind a new gate, nothing applied.
    assert store.answer(error_gate.id, "retry", by="ops").status is AnswerStatus.ANSWERED
    assert store.get(wf.id).status is Status.BLOCKED
    [second] = [g for g, _ in store.inbox("p4") if g.kind == "workflow_error"]
    tiny_definition.BROKEN["on"] = False  # the fix is deployed
    assert store.answer(second.id, "retry", by="ops").status is AnswerStatus.ANSWERED
    resumed = store.get(wf.id)
    assert resumed.status is Status.RUNNING and resumed.applied_seq == resumed.last_seq == 3
    assert claim_one(jobs, "p4").kind == TIMER_KIND
    assert store.verify(wf.id).ok


def test_an_unregistered_definition_version_blocks_instead_of_crashing(
    pool: ConnectionPool, jobs: PostgresJobRepository
) -> None:
    old = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(1)]))
    wf = old.start("p5", definition="tiny").workflow
    job = claim_one(jobs, "p5")
    new = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(2)]))
    succeed(new, jobs, job)  # the step's settle commits; its event waits
    blocked = new.get(wf.id)
    assert blocked.status is Status.BLOCKED
    assert "tiny v1 is not registered" in (blocked.reason or "")
    assert jobs.get(job.id) is not None and jobs.get(job.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]
    # A worker that has v1 again picks it up on retry.
    [gate] = [g for g, _ in old.inbox("p5") if g.kind == "workflow_error"]
    old.answer(gate.id, "retry", by="ops")
    assert old.get(wf.id).status is Status.RUNNING
    assert old.describe(old.get(wf.id)) == "tiny at gate"


def test_a_new_version_starts_new_workflows_and_running_ones_keep_theirs(
    pool: ConnectionPool, jobs: PostgresJobRepository
) -> None:
    both = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(1), Tiny(2)]))
    assert both.start("p6", definition="tiny").workflow.version == 2
    only_one = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(1)]))
    assert only_one.start("p7", definition="tiny").workflow.version == 1
    assert both.for_project("p7").version == 1


def test_verify_detects_a_changed_definition_and_blocks_the_workflow(
    pool: ConnectionPool, jobs: PostgresJobRepository
) -> None:
    good = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny()]))
    wf = good.start("p8", definition="tiny").workflow
    succeed(good, jobs, claim_one(jobs, "p8"))
    assert good.verify(wf.id).ok
    changed = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(gate_name="h")]))
    report = changed.verify(wf.id, block=True)
    assert not report.ok and report.divergence is not None
    assert "#2" in report.divergence and "gate g" in report.divergence
    assert changed.get(wf.id).status is Status.BLOCKED
    assert any(g.kind == "workflow_error" for g, _ in changed.inbox("p8"))


def test_a_worker_running_a_changed_definition_blocks_the_workflow_at_its_next_event(
    pool: ConnectionPool, jobs: PostgresJobRepository
) -> None:
    good = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny()]))
    wf = good.start("p14", definition="tiny").workflow
    succeed(good, jobs, claim_one(jobs, "p14"))  # opens gate g
    gate = gate_id(good, "p14")
    # The same name and version, different code: a process running it must not decide.
    drifted = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(gate_name="h")]))
    assert drifted.answer(gate, "yes", by="ann").status is AnswerStatus.ANSWERED
    blocked = drifted.get(wf.id)
    assert blocked.status is Status.BLOCKED
    assert "non-determinism" in (blocked.reason or "") and "gate g" in (blocked.reason or "")
    assert (blocked.last_seq, blocked.applied_seq) == (3, 2)
    assert jobs.claim("p14", owner="t") == []  # nothing was scheduled by the drifted code
    # The right code, once deployed, applies the waiting answer.
    [error] = [g for g, _ in good.inbox("p14") if g.kind == "workflow_error"]
    good.answer(error.id, "retry", by="ops")
    assert good.get(wf.id).status is Status.RUNNING
    assert claim_one(jobs, "p14").kind == TIMER_KIND


def test_a_process_new_to_a_workflow_reports_the_decision_error_when_its_history_replays(
    pool: ConnectionPool, jobs: PostgresJobRepository
) -> None:
    """The guard's history read travels with the decision: a decision that raises in a
    process that has not replayed the workflow yet blocks it with its own error."""
    good = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny()]))
    wf = good.start("p15", definition="tiny").workflow
    succeed(good, jobs, claim_one(jobs, "p15"))
    fresh = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny()]))
    assert fresh.answer(gate_id(fresh, "p15"), "boom", by="ann").status is AnswerStatus.ANSWERED
    blocked = fresh.get(wf.id)
    assert blocked.status is Status.BLOCKED and "RuntimeError: boom" in (blocked.reason or "")
    assert "non-determinism" not in (blocked.reason or "")


def test_a_changed_definition_that_also_raises_is_reported_as_the_divergence(
    pool: ConnectionPool, jobs: PostgresJobRepository
) -> None:
    good = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny()]))
    wf = good.start("p16", definition="tiny").workflow
    succeed(good, jobs, claim_one(jobs, "p16"))
    drifted = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(gate_name="h")]))
    assert drifted.answer(gate_id(good, "p16"), "boom", by="ann").status is AnswerStatus.ANSWERED
    blocked = drifted.get(wf.id)
    assert blocked.status is Status.BLOCKED
    assert "non-determinism" in (blocked.reason or "") and "gate g" in (blocked.reason or "")


def test_a_changed_definition_blocks_a_step_settle_and_undoes_what_it_wrote(
    pool: ConnectionPool, jobs: PostgresJobRepository
) -> None:
    """A step's settle in a process new to the workflow: the drifted decision's writes (the
    next steps it schedules) are sent before the guard's verdict, and undone by it."""
    good = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(chain=True)]))
    wf = good.start("p17", definition="tiny").workflow
    first = claim_one(jobs, "p17")
    drifted = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(gate_name="h")]))
    assert drifted.settle(first, Success({})).applied
    blocked = drifted.get(wf.id)
    assert blocked.status is Status.BLOCKED and "non-determinism" in (blocked.reason or "")
    assert [g.name for g, _ in drifted.inbox("p17") if g.kind != "workflow_error"] == []


def test_cancel_stops_unfinished_steps_and_closes_gates(
    store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    wf = store.start("p9", definition="tiny").workflow
    running = claim_one(jobs, "p9")
    cancelled = store.cancel(wf.id, by="ann", reason="not needed")
    assert cancelled.status is Status.CANCELLED
    assert cancelled.reason == "cancelled by ann: not needed"
    assert jobs.get(running.id).state is JobState.CANCELLED  # type: ignore[union-attr]

    # The running step's settle finds its fence gone; the workflow absorbs nothing more.
    with jobs.units.begin() as unit:
        settled = store.settle_txn(unit, running, Success())
    assert not settled.applied
    after = store.record(wf.id, StepSucceeded(step="a"))
    assert after.status is Status.CANCELLED and after.last_seq == 3
    assert store.history(wf.id)[-1].commands == []
    assert store.verify(wf.id).ok


def test_a_cancel_at_a_gate_closes_it_with_the_workflow_and_records_its_events_in_order(
    store: WorkflowStore, jobs: PostgresJobRepository, pool: ConnectionPool
) -> None:
    wf = store.start("p9g", definition="tiny").workflow
    succeed(store, jobs, claim_one(jobs, "p9g"))
    gate = gate_id(store, "p9g")
    store.cancel(wf.id, by="ann", reason="not needed")
    with pool.connection() as conn:
        closed = conn.execute(
            "SELECT answer, answered_by, answer_source FROM gate WHERE id = %s", (gate,)
        ).fetchone()
        types = [
            r[0]
            for r in conn.execute(
                "SELECT event_type FROM domain_event WHERE project_id = 'p9g' ORDER BY seq"
            ).fetchall()
        ]
    assert closed is not None and closed[1:] == ("vibey", "closed")
    assert closed[0].startswith("(closed: workflow cancelled")
    assert store.answer(gate, "yes", by="ann").status is AnswerStatus.ALREADY_ANSWERED
    assert types[-1] == "workflow.cancelled" and types.index("gate.opened") < len(types) - 1


def test_a_step_that_spends_its_attempts_reaches_the_workflow_as_a_failure(
    store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    wf = store.start("p10", definition="tiny").workflow
    for attempt in range(5):
        fail(store, jobs, claim_one(jobs, "p10"), f"no {attempt}")
    final = store.get(wf.id)
    assert final.status is Status.FAILED and final.reason == "step a failed"
    failed = store.history(wf.id)[-1].event
    assert failed == {"type": "step_failed", "step": "a", "failure_class": "work", "detail": "no 4"}


def test_the_steps_waiting_on_a_step_that_failed_for_good_are_cancelled(
    pool: ConnectionPool, jobs: PostgresJobRepository
) -> None:
    store = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(chain=True)]))
    wf = store.start("p13", definition="tiny").workflow
    for _ in range(5):
        job = claim_one(jobs, "p13")
        assert job.step == "a"
        fail(store, jobs, job, "no")
    states = {row["step"]: row["state"] for row in store.steps(wf.id)}
    assert states == {"a": "failed", "b": "cancelled", "c": "cancelled"}


def test_history_is_append_only(store: WorkflowStore, pool: ConnectionPool) -> None:
    wf = store.start("p11", definition="tiny").workflow
    with pool.connection() as conn, pytest.raises(psycopg.errors.RaiseException, match="append"):
        conn.execute("DELETE FROM workflow_history WHERE workflow_id = %s", (wf.id,))
    with pool.connection() as conn, pytest.raises(psycopg.errors.RaiseException, match="append"):
        conn.execute(
            "UPDATE workflow_history SET event = '{}'::jsonb WHERE workflow_id = %s", (wf.id,)
        )


def test_concurrent_events_on_one_workflow_serialise_with_a_gapless_history(
    store: WorkflowStore,
) -> None:
    wf = store.start("p12", definition="tiny").workflow
    barrier = threading.Barrier(8)

    def record(i: int) -> None:
        barrier.wait()
        for n in range(10):
            store.record(wf.id, StepSucceeded(step=f"stale-{i}-{n}"))

    threads = [threading.Thread(target=record, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    history = store.history(wf.id)
    assert [e.seq for e in history] == list(range(1, 82))
    assert store.get(wf.id).last_seq == store.get(wf.id).applied_seq == 81
    assert store.verify(wf.id).ok


def test_unknown_workflow_and_project_raise_not_found(store: WorkflowStore) -> None:
    with pytest.raises(WorkflowNotFound):
        store.get(uuid4())
    with pytest.raises(WorkflowNotFound, match="vibey workflow start nobody"):
        store.for_project("nobody")


def test_start_many_starts_a_batch_in_one_commit_all_or_none(
    store: WorkflowStore, jobs: PostgresJobRepository, pool: ConnectionPool
) -> None:
    live = store.start("b00", definition="tiny").workflow
    outcomes = store.start_many([(f"b{n:02d}", {"n": n}) for n in range(20)], definition="tiny")
    assert [o.workflow.project_id for o in outcomes] == [f"b{n:02d}" for n in range(20)]
    assert [o.created for o in outcomes] == [False] + [True] * 19
    assert outcomes[0].workflow.id == live.id  # the live one, as start gives it
    assert store.history(outcomes[5].workflow.id)[0].event == {"type": "started", "input": {"n": 5}}
    assert claim_one(jobs, "b07").workflow_id == outcomes[7].workflow.id
    with pytest.raises(Exception, match="nope"):  # an unknown definition: nothing starts
        store.start_many([("c1", {}), ("c2", {})], definition="nope")
    with pytest.raises(WorkflowNotFound):
        store.for_project("c1")
    # One transaction for the batch: now(), every row's created_at, is its start time.
    store.start_many([(f"d{n:02d}", {}) for n in range(30)], definition="tiny")
    with pool.connection() as conn:
        [(count, stamps)] = conn.execute(
            "SELECT count(*), count(DISTINCT created_at) FROM workflow WHERE project_id LIKE 'd%'"
        ).fetchall()
    assert (count, stamps) == (30, 1)
