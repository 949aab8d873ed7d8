"""Workflow events outside a step as spans, on real PostgreSQL (and RabbitMQ for the resends):
a start and a gate's answer are spans in the workflow's trace whose traceparent the outbox
rows of their transaction keep, so the next step's span is their child and a reconciler's
resend carries the traceparent the row was written with; with tracing off nothing is
recorded and no row has a trace context."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pika
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg_pool import ConnectionPool

from actors.relay import Relay, Router
from actors.steps import StepResult, StepRunner
from actors.stub_broker import StubPublisher
from actors.topology import QueueNames
from actors.tracing import EventTracer, StepTracer
from store.dispatch import DispatchRecords
from store.event_spans import NO_SPANS, EventSpans
from store.gate_deadlines import GateDeadlines
from store.jobs import PostgresJobRepository
from store.workflows import WorkflowStore
from tests.amqp_fixtures import Amqp
from tests.deadline_definition import Deadlined
from tests.integration.test_relay import TIERS, declare, get
from tests.step_harness import recording_tracer
from tests.tiny_definition import Tiny
from workflows.dispatch import decode
from workflows.engine import Registry
from workflows.job import TIMER_KIND
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import AnswerStatus
from workflows.steps import Success

P = "traced"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


def store_for(pool: ConnectionPool, events: EventSpans, *definitions: Any) -> WorkflowStore:
    jobs = PostgresJobRepository(pool=pool, dispatch=True)  # rows wait for a drain
    registry = Registry(list(definitions) or [Tiny()])
    return WorkflowStore(pool=pool, jobs=jobs, registry=registry, events=events)


def outbox(pool: ConnectionPool, workflow_id: UUID) -> list[dict[str, Any]]:
    with pool.connection() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT o.id, o.job_id, o.kind, o.dispatch_seq, o.traceparent, j.project_id"
            " FROM job_outbox o JOIN job j ON j.id = o.job_id"
            " WHERE j.workflow_id = %s ORDER BY o.id",
            (workflow_id,),
        )
        names = [c.name for c in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def traceparent_of(span: ReadableSpan) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"


def run_step(
    pool: ConnectionPool, store: WorkflowStore, tracer: StepTracer, row: dict[str, Any]
) -> StepResult:
    """The pointer of outbox ``row`` run as a traced worker runs it: its traceparent handed
    to the tracer (as the consumer does with the AMQP header), then claimed and settled."""
    runner = StepRunner(
        jobs=store.jobs,
        records=tracer.claims(DispatchRecords(pool=pool, relay_id="worker")),
        broker=StubPublisher(),
        names=QueueNames("t"),
        tiers=TIERS,
        handlers=tracer.handlers({"design.research": lambda job: Success({"ok": True})}),
        owner="worker",
        on_result=tracer.on_result(None),
        workflows=store,
    )
    tracer.delivered({"traceparent": row["traceparent"]} if row["traceparent"] else None)
    try:
        return runner.run(
            job_id=str(row["job_id"]),
            project_id=row["project_id"],
            seq=row["dispatch_seq"],
            kind=row["kind"],
            routing_key=f"shared.interactive.{row['project_id']}",
        )
    finally:
        runner.close()


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in spans.get_finished_spans() if span.name == name]


def test_a_start_and_an_answer_are_spans_whose_pointers_make_the_next_steps_their_children(
    pool: ConnectionPool, spans: InMemorySpanExporter
) -> None:
    tracer = recording_tracer(spans)
    store = store_for(pool, EventTracer(tracer))
    steps = StepTracer(tracer)
    started = store.start(P, definition="tiny").workflow

    (start,) = named(spans, "workflow started")
    assert start.context.trace_id == started.id.int  # the workflow's trace
    assert start.parent is not None and start.parent.is_remote
    assert dict(start.attributes or {}) == {
        "vibey.event.type": "workflow.started",
        "vibey.project": P,
        "vibey.workflow.id": str(started.id),
        "vibey.workflow.definition": "tiny",
    }
    (first,) = outbox(pool, started.id)
    assert first["kind"] == "design.research"
    assert first["traceparent"] == traceparent_of(start)

    assert run_step(pool, store, steps, first) is StepResult.SUCCEEDED
    (step_a,) = named(spans, "step design.research")
    assert step_a.parent is not None and step_a.parent.span_id == start.context.span_id

    (gate,) = [g for g, _ in store.inbox(P)]
    outcome = store.answer(gate.id, "yes", by="ops@example")
    assert outcome.status is AnswerStatus.ANSWERED
    (answer,) = named(spans, "gate answered")
    assert answer.context.trace_id == started.id.int
    attributes = dict(answer.attributes or {})
    assert attributes["vibey.event.type"] == "gate.answered"
    assert attributes["vibey.gate.id"] == str(gate.id)
    assert attributes["vibey.gate.name"] == "g"
    assert attributes["vibey.gate.answered_by"] == "ops@example"
    assert attributes["vibey.workflow.id"] == str(started.id)
    assert answer.start_time <= answer.end_time  # type: ignore[operator]
    (timer,) = outbox(pool, started.id)[1:]
    assert timer["kind"] == TIMER_KIND
    assert timer["traceparent"] == traceparent_of(answer)

    assert run_step(pool, store, steps, timer) is StepResult.SUCCEEDED
    (fired,) = named(spans, f"step {TIMER_KIND}")
    assert fired.parent is not None and fired.parent.span_id == answer.context.span_id
    assert fired.context.trace_id == started.id.int
    assert store.get(started.id).status.value == "completed"


def test_a_cancel_and_a_gates_deadline_are_spans_in_the_workflows_trace(
    pool: ConnectionPool, spans: InMemorySpanExporter
) -> None:
    tracer = EventTracer(recording_tracer(spans))
    store = store_for(pool, tracer, Deadlined(deadline=timedelta(seconds=1)))
    waiting = store.start(P, definition="deadlined").workflow
    later = datetime.now(UTC) + timedelta(minutes=1)  # past the deadline
    assert GateDeadlines(pool=pool, workflows=store, clock=lambda: later).sweep().expired == 1
    (deadline,) = named(spans, "gate deadline")
    assert deadline.context.trace_id == waiting.id.int
    attributes = dict(deadline.attributes or {})
    assert attributes["vibey.event.type"] == "gate.expired"
    assert attributes["vibey.gate.on_deadline"] == "answer"
    assert attributes["vibey.workflow.id"] == str(waiting.id)

    other = store_for(pool, tracer).start("other", definition="tiny").workflow
    store_for(pool, tracer).cancel(other.id, by="ops@example", reason="not needed")
    (cancel,) = named(spans, "workflow cancelled")
    assert cancel.context.trace_id == other.id.int
    assert dict(cancel.attributes or {})["vibey.event.type"] == "workflow.cancelled"


@pytest.mark.parametrize("events", ["no spans", "no provider"])
def test_without_tracing_nothing_is_recorded_and_no_row_has_a_trace_context(
    pool: ConnectionPool, spans: InMemorySpanExporter, events: str
) -> None:
    """Off: the store's default, or the event tracer on the API's no-op tracer (no endpoint
    configured): no span, and no traceparent on any outbox row."""
    tracer = NO_SPANS if events == "no spans" else EventTracer(trace.NoOpTracer())
    store = store_for(pool, tracer)
    started = store.start(P, definition="tiny").workflow
    (first,) = outbox(pool, started.id)
    assert run_step(pool, store, StepTracer(trace.NoOpTracer()), first) is StepResult.SUCCEEDED
    (gate,) = [g for g, _ in store.inbox(P)]
    store.answer(gate.id, "yes", by="ops@example")
    assert [row["traceparent"] for row in outbox(pool, started.id)] == [None, None]
    assert spans.get_finished_spans() == ()


def drained_headers(amqp: Amqp, pool: ConnectionPool) -> dict[UUID, dict[str, Any]]:
    """What an untraced relay (a reconcile service's) sends at a drain: headers by job."""
    relay = Relay(
        url=amqp.url,
        records=DispatchRecords(pool=pool, relay_id="reconciler"),
        router=Router(names=amqp.names, tiers=TIERS, kinds=STEP_KINDS),
    )
    relay.start()
    try:
        relay.drain(reclaim_after=timedelta(0))
        assert relay.flush(timeout=10)
    finally:
        relay.stop()
    found: dict[UUID, dict[str, Any]] = {}
    for _, properties, body in get(amqp, amqp.names.work_queue("interactive")):
        assert isinstance(properties, pika.BasicProperties)
        found[decode(body).job_id] = dict(properties.headers or {})
    return found


def test_a_reconcilers_drain_and_sweep_resend_the_traceparent_the_row_was_written_with(
    amqp: Amqp, pool: ConnectionPool, spans: InMemorySpanExporter
) -> None:
    declare(amqp)
    store = store_for(pool, EventTracer(recording_tracer(spans)))
    started = store.start(P, definition="tiny").workflow
    (row,) = outbox(pool, started.id)
    written = row["traceparent"]
    assert written is not None and written.startswith(f"00-{started.id.int:032x}-")

    headers = drained_headers(amqp, pool)  # never published: the drain sends it
    assert headers[row["job_id"]]["traceparent"] == written

    # The pointer was lost after its confirm: the sweep writes a new row, with the trace.
    with pool.connection() as conn:
        conn.execute(
            "UPDATE job SET dispatched_at = now() - interval '1 hour',"
            " run_after = now() - interval '1 hour' WHERE id = %s",
            (row["job_id"],),
        )
    swept = DispatchRecords(pool=pool, relay_id="reconciler").sweep_lost(
        redispatch_after=timedelta(seconds=1)
    )
    assert len(swept) == 1
    resent = outbox(pool, started.id)[-1]
    assert resent["id"] == swept[0] and resent["traceparent"] == written
    assert drained_headers(amqp, pool)[row["job_id"]]["traceparent"] == written


def test_an_untraced_rows_drain_sends_no_trace_header(amqp: Amqp, pool: ConnectionPool) -> None:
    declare(amqp)
    started = store_for(pool, NO_SPANS).start(P, definition="tiny").workflow
    (row,) = outbox(pool, started.id)
    headers = drained_headers(amqp, pool)[row["job_id"]]
    assert "traceparent" not in headers and "tracestate" not in headers
