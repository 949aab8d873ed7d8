"""Gate deadlines on real PostgreSQL: a default recorded as such, an answer racing the
deadline applied once, escalation, failure, reminders, a default that is no answer."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from psycopg_pool import ConnectionPool

from store.events import EventLog
from store.gate_deadlines import GateDeadlines
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.workflows import WorkflowStore
from tests.deadline_definition import Deadlined
from tests.tiny_definition import Tiny
from workflows.engine import Registry, Status
from workflows.events import DEFAULT_BY, EventType
from workflows.ledger import EventKind
from workflows.queue import AnswerStatus, EnqueueRequest, GateRequest
from workflows.steps import Success


def stores(pool: ConnectionPool, definition: Deadlined) -> tuple[WorkflowStore, Ledger]:
    ledger = Ledger(pool)
    jobs = PostgresJobRepository(pool=pool)
    return WorkflowStore(
        pool=pool, jobs=jobs, registry=Registry([definition]), ledger=ledger
    ), ledger


def gate_row(pool: ConnectionPool, workflow_id: UUID) -> dict[str, Any]:
    with pool.connection() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT id, answer, answered_by, answer_source, escalated_at, reminded FROM gate"
            " WHERE workflow_id = %s AND kind = 'approval'",
            (workflow_id,),
        )
        row = cur.fetchone()
        assert row is not None
        names = ("id", "answer", "answered_by", "answer_source", "escalated_at", "reminded")
        return dict(zip(names, row, strict=True))


def types_of(pool: ConnectionPool, project: str) -> list[str]:
    return [e.event_type.value for _, e in EventLog(pool=pool).recent(project=project, limit=100)]


def test_a_two_second_deadline_resumes_the_workflow_with_the_default_recorded_as_such(
    pool: ConnectionPool,
) -> None:
    store, ledger = stores(pool, Deadlined(deadline=timedelta(seconds=2)))
    sweeper = GateDeadlines(pool=pool, workflows=store)
    started = store.start("p1", definition="deadlined").workflow
    opened = time.monotonic()
    assert sweeper.sweep().expired == 0  # not due yet
    while store.get(started.id).status is Status.RUNNING:
        assert time.monotonic() - opened < 8, "the deadline never fired"
        sweeper.sweep()
        time.sleep(0.1)
    assert time.monotonic() - opened >= 2
    workflow = store.get(started.id)
    assert (workflow.status, workflow.completion_mode) == (Status.COMPLETED, "local")
    gate = gate_row(pool, started.id)
    assert (gate["answer"], gate["answered_by"], gate["answer_source"]) == (
        "yes",
        DEFAULT_BY,
        "default",
    )
    (given,) = [e for e in ledger.read("p1") if e.kind is EventKind.AnswerGiven]
    assert given.payload == {"closes": "approve", "answer": "yes", "by": DEFAULT_BY}
    assert types_of(pool, "p1") == [
        EventType.WORKFLOW_STARTED,
        EventType.GATE_OPENED,
        EventType.GATE_EXPIRED,
        EventType.GATE_ANSWERED,
        EventType.WORKFLOW_COMPLETED,
    ]
    answered = EventLog(pool=pool).recent(project="p1", event_type="gate.answered")
    assert answered[0][1].payload["default"] is True


@pytest.mark.parametrize("round_", range(4))
def test_an_answer_racing_the_deadline_is_applied_exactly_once(
    pool: ConnectionPool, round_: int
) -> None:
    store, _ = stores(pool, Deadlined(deadline=timedelta(seconds=1)))
    later = GateDeadlines(
        pool=pool, workflows=store, clock=lambda: datetime.now(UTC) + timedelta(seconds=5)
    )
    project = f"race{round_}"
    started = store.start(project, definition="deadlined").workflow
    gate_id = gate_row(pool, started.id)["id"]
    barrier = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def person() -> None:
        barrier.wait()
        outcomes["person"] = store.answer(gate_id, "no", by="ann").status

    def deadline() -> None:
        barrier.wait()
        outcomes["deadline"] = later.sweep().expired

    threads = [threading.Thread(target=person), threading.Thread(target=deadline)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    answers = [h for h in store.history(started.id) if h.event["type"] == "gate_answered"]
    assert len(answers) == 1
    gate = gate_row(pool, started.id)
    workflow = store.get(started.id)
    if outcomes["person"] is AnswerStatus.ANSWERED:
        assert (gate["answer"], gate["answer_source"], workflow.status) == (
            "no",
            "person",
            Status.FAILED,
        )
        assert outcomes["deadline"] == 0
    else:
        assert outcomes["person"] is AnswerStatus.ALREADY_ANSWERED
        assert (gate["answer"], gate["answer_source"], workflow.status) == (
            "yes",
            "default",
            Status.COMPLETED,
        )
    assert types_of(pool, project).count(EventType.GATE_ANSWERED) == 1


def test_escalate_waits_on_and_reports_once_fail_fails_the_workflow(pool: ConnectionPool) -> None:
    later = lambda: datetime.now(UTC) + timedelta(seconds=5)  # noqa: E731
    store, _ = stores(
        pool, Deadlined(deadline=timedelta(seconds=1), on_deadline="escalate", default=None)
    )
    escalated = store.start("esc", definition="deadlined").workflow
    sweeper = GateDeadlines(pool=pool, workflows=store, clock=later)
    assert sweeper.sweep().escalated == 1
    assert sweeper.sweep().escalated == 0
    assert store.get(escalated.id).status is Status.RUNNING
    assert gate_row(pool, escalated.id)["escalated_at"] is not None
    assert (
        store.answer(gate_row(pool, escalated.id)["id"], "yes", by="ann").status
        is AnswerStatus.ANSWERED
    )
    assert types_of(pool, "esc").count(EventType.GATE_ESCALATED) == 1

    store, _ = stores(
        pool, Deadlined(deadline=timedelta(seconds=1), on_deadline="fail", default=None)
    )
    failing = store.start("fails", definition="deadlined").workflow
    assert GateDeadlines(pool=pool, workflows=store, clock=later).sweep().expired == 1
    workflow = store.get(failing.id)
    assert workflow.status is Status.FAILED and "deadline" in (workflow.reason or "")
    assert gate_row(pool, failing.id)["answer_source"] == "closed"
    assert types_of(pool, "fails")[-2:] == [EventType.GATE_EXPIRED, EventType.WORKFLOW_FAILED]


def test_reminders_are_events_once_per_age(pool: ConnectionPool) -> None:
    reminders = (timedelta(seconds=1), timedelta(seconds=3))
    store, _ = stores(pool, Deadlined(deadline=None, reminders=reminders))
    started = store.start("rem", definition="deadlined").workflow
    at = datetime.now(UTC)

    def sweep(after: float) -> int:
        return (
            GateDeadlines(pool=pool, workflows=store, clock=lambda: at + timedelta(seconds=after))
            .sweep()
            .reminded
        )

    assert sweep(0.5) == 0
    assert sweep(1.5) == 1
    assert sweep(2.0) == 0
    assert sweep(9.0) == 1  # the second age; one per pass
    assert sweep(20.0) == 0
    assert gate_row(pool, started.id)["reminded"] == 2
    reminded = EventLog(pool=pool).recent(project="rem", event_type="gate.reminded")
    assert [e.payload["age_s"] for _, e in reminded] == [1.0, 3.0]


def test_a_default_that_is_no_answer_to_its_gate_blocks_before_the_gate_is_written(
    pool: ConnectionPool,
) -> None:
    store, _ = stores(pool, Deadlined(default="maybe"))
    started = store.start("bad", definition="deadlined").workflow
    workflow = store.get(started.id)
    assert workflow.status is Status.BLOCKED and "default answer is refused" in (
        workflow.reason or ""
    )
    with pool.connection() as conn:
        kinds = [
            r[0]
            for r in conn.execute("SELECT kind FROM gate WHERE workflow_id = %s", (started.id,))
        ]
    assert kinds == ["workflow_error"]


def test_an_answer_before_its_gate_opens_is_refused_then_applied_once(
    pool: ConnectionPool,
) -> None:
    jobs = PostgresJobRepository(pool=pool)
    store = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny()]))
    started = store.start("early", definition="tiny").workflow
    events_before = len(types_of(pool, "early"))
    early = store.answer_named(started.id, "g", "yes", by="link")
    assert early.status is AnswerStatus.NOT_OPEN
    assert len(store.history(started.id)) == 1 and len(types_of(pool, "early")) == events_before
    (job,) = jobs.claim("early", owner="t")

    assert store.settle(job, Success()).applied
    refused = store.answer_named(started.id, "g", "maybe", by="link")
    assert refused.status is AnswerStatus.INVALID_ANSWER and "valid" in refused.detail
    recorded = len(store.history(started.id)), len(types_of(pool, "early"))
    assert (
        store.answer_named(started.id, "g", "maybe", by="link").status
        is AnswerStatus.INVALID_ANSWER
    )
    assert (len(store.history(started.id)), len(types_of(pool, "early"))) == recorded
    assert store.answer_named(started.id, "g", "yes", by="link").status is AnswerStatus.ANSWERED
    retried = store.answer_named(started.id, "g", "yes", by="link")
    assert retried.status is AnswerStatus.ALREADY_ANSWERED
    answers = [h for h in store.history(started.id) if h.event["type"] == "gate_answered"]
    assert len(answers) == 1


def test_a_parked_jobs_gate_reports_its_opening_and_its_answer(pool: ConnectionPool) -> None:
    jobs = PostgresJobRepository(pool=pool)
    store = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny()]))
    jobs.enqueue(EnqueueRequest(project_id="parked", kind="design.research", subject="s"))
    (job,) = jobs.claim("parked", owner="t")
    parked = jobs.park(job.lease, GateRequest("delivery_exhausted", "Retry it?"))
    assert parked.gate_id is not None
    assert store.answer(parked.gate_id, "go", by="ann").status is AnswerStatus.ANSWERED
    events = [e for _, e in EventLog(pool=pool).recent(project="parked")]
    assert [e.event_type for e in events] == [EventType.GATE_OPENED, EventType.GATE_ANSWERED]
    assert events[0].payload["job_id"] == str(job.id) and events[0].causation_id == str(job.id)
    assert events[1].payload["gate_id"] == str(parked.gate_id)
