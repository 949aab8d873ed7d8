"""The W3C trace context through a dispatch pointer's AMQP headers: a traced relay sends its
``publish`` span's ``traceparent``, the consumer hands it on, and the step's span is that
span's child; an untraced relay writes no header."""

from __future__ import annotations

import queue
import threading
from datetime import UTC, datetime
from typing import Any, cast

import pika
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from actors.broker import _trace
from actors.relay import Publication, Relay, Router, _Publisher
from actors.steps import StepResult
from actors.tracing import StepTracer
from store.dispatch import DispatchRecords
from store.unit_of_work import OutboxRow
from tests.step_harness import KIND, NAMES, Harness, ok, recording_tracer, spans_by_name
from tests.unit.test_tracing import WORKFLOW
from workflows.dispatch import DEFAULT_WAIT_TIERS
from workflows.queue import Job

URL = "amqp://guest:guest@127.0.0.1:5672/"


class _Channel:
    is_open = True

    def __init__(self) -> None:
        self.properties: list[pika.BasicProperties] = []

    def basic_publish(self, *args: Any, **kwargs: Any) -> None:
        self.properties.append(args[3])


class _IO:
    def __init__(self) -> None:
        self.publications: list[Publication] = []

    def publish(self, publications: list[Publication]) -> None:
        self.publications += publications


def published_headers(
    job: Job, tracer: StepTracer | None, *, traceparent: str | None = None
) -> dict[str, Any]:
    """The AMQP headers the relay sends with ``job``'s pointer (traced when ``tracer``),
    whose outbox row was written with ``traceparent``."""
    relay = Relay(
        url=URL,
        records=cast(DispatchRecords, object()),  # routing and sending read no row
        router=Router(names=NAMES, tiers=DEFAULT_WAIT_TIERS),
        trace_headers=None if tracer is None else tracer.publish_headers,
    )
    io = _IO()
    relay._io = io  # type: ignore[assignment]
    row = OutboxRow(
        id=7,
        key="k",
        job_id=job.id,
        project_id=job.project_id,
        dispatch_seq=job.dispatch_seq,
        kind=job.kind,
        not_before=datetime.now(UTC),
        workflow_id=job.workflow_id,
        traceparent=traceparent,
    )
    relay._publish_rows([row])
    publisher = _Publisher(URL, queue.Queue(), threading.Event(), threading.Event())
    channel = _Channel()
    publisher._channel = channel
    publisher._send(io.publications)
    (properties,) = channel.properties
    return dict(properties.headers or {})


def run_delivered(h: Harness, tracer: StepTracer, job: Job, headers: dict[str, Any]) -> None:
    """As the worker's step actor: the consumer's ``trace`` kwarg to the tracer, then run."""
    runner = h.traced_runner(tracer, ok)
    tracer.delivered(_trace(pika.BasicProperties(headers=headers)).get("trace"))
    assert h.run(runner, job, seq=job.dispatch_seq) is StepResult.SUCCEEDED


def test_a_steps_span_is_the_child_of_the_span_that_published_its_pointer(
    h: Harness,
    spans: InMemorySpanExporter,
) -> None:
    tracer = StepTracer(recording_tracer(spans))
    job = h.enqueue(workflow_id=WORKFLOW, step="design")
    headers = published_headers(job, tracer)
    assert headers["traceparent"].startswith(f"00-{WORKFLOW.int:032x}-")
    run_delivered(h, tracer, job, headers)
    found = spans_by_name(spans)
    publish, step = found[f"publish {KIND}"], found[f"step {KIND}"]
    assert step.parent is not None and step.parent.is_remote
    assert step.parent.span_id == publish.context.span_id  # not the workflow's own span id
    assert step.parent.span_id != (WORKFLOW.int & 0xFFFF_FFFF_FFFF_FFFF)
    assert step.context.trace_id == publish.context.trace_id == WORKFLOW.int


def test_a_forged_traceparent_falls_back_to_the_workflows_trace(
    h: Harness,
    spans: InMemorySpanExporter,
) -> None:
    tracer = StepTracer(recording_tracer(spans))
    job = h.enqueue(workflow_id=WORKFLOW, step="design")
    run_delivered(h, tracer, job, {"traceparent": "not-a-traceparent"})
    step = spans_by_name(spans)[f"step {KIND}"]
    assert step.context.trace_id == WORKFLOW.int
    assert step.parent is not None
    assert step.parent.span_id == WORKFLOW.int & 0xFFFF_FFFF_FFFF_FFFF


def test_without_tracing_no_trace_header_is_written_nor_handed_on(
    h: Harness,
) -> None:
    job = h.enqueue(workflow_id=WORKFLOW, step="design")
    headers = published_headers(job, None)
    assert set(headers) == {"vibey-outbox-id", "x-vibey-solo"}
    assert _trace(pika.BasicProperties(headers=headers)) == {}


def test_a_row_written_with_a_traceparent_is_sent_with_it_by_any_relay(
    h: Harness,
    spans: InMemorySpanExporter,
) -> None:
    """A workflow event's span (a start, an answer) wrote the row: the relay, traced or not
    (the client's, a reconciler's), sends that traceparent and opens no span of its own, so
    the step is the event's child."""
    job = h.enqueue(workflow_id=WORKFLOW, step="design")
    event = f"00-{WORKFLOW.int:032x}-00f067aa0ba902b7-01"
    traced = StepTracer(recording_tracer(spans))
    for tracer in (None, traced):
        headers = published_headers(job, tracer, traceparent=event)
        assert headers["traceparent"] == event
        assert set(headers) == {"vibey-outbox-id", "x-vibey-solo", "traceparent"}
    assert spans.get_finished_spans() == ()  # no publish span for a row that has its trace
    run_delivered(h, traced, job, {"traceparent": event})
    step = spans_by_name(spans)[f"step {job.kind}"]
    assert step.parent is not None and step.parent.span_id == 0x00F067AA0BA902B7
