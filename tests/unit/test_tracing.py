"""Step traces (actors/tracing.py) read from the SDK's in-memory exporter: a workflow is one
trace, each step a span over claim → handler → settle; without a tracer nothing is wrapped."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from actors import tracing
from actors.steps import StepResult
from actors.tracing import StepTracer
from store.event_spans import NO_SPANS
from tests.step_harness import KIND, Harness, ok, recording_tracer
from tests.step_harness import spans_by_name as by_name
from tests.unit.test_settings import AMQP, PG, settings_error
from vibey.settings import load_settings
from vibey.wiring import worker_config
from workflows.job import FailureClass
from workflows.queue import Job
from workflows.steps import Failure, Handler, Outcome, Short

WORKFLOW = uuid.UUID("6f1c2a9e-4b7d-4c1e-9a53-0d2f8e6b7c41")


def traced_run(
    h: Harness, exporter: InMemorySpanExporter, handler: Handler, job: Job
) -> StepResult:
    """``job`` run once by a step runner given the tracer's hooks, as the worker wires it."""
    runner = h.traced_runner(StepTracer(recording_tracer(exporter)), handler)
    return h.run(runner, job, seq=job.dispatch_seq)


@pytest.mark.parametrize("short", [False, True], ids=["two commits", "one commit"])
def test_a_workflow_step_is_a_span_in_the_workflows_trace_over_claim_handler_settle(
    h: Harness,
    spans: InMemorySpanExporter,
    short: bool,
) -> None:
    job = h.enqueue(workflow_id=WORKFLOW, step="design")
    assert traced_run(h, spans, Short(ok) if short else ok, job) is StepResult.SUCCEEDED
    found = by_name(spans)
    assert set(found) == {f"step {KIND}", "claim", "handler", "settle"}
    step = found[f"step {KIND}"]
    assert {span.context.trace_id for span in found.values()} == {WORKFLOW.int}
    assert step.parent is not None and step.parent.is_remote  # the workflow is the parent
    for child in ("claim", "handler", "settle"):
        parent = found[child].parent
        assert parent is not None and parent.span_id == step.context.span_id
    claim, handler, settle = found["claim"], found["handler"], found["settle"]
    assert step.start_time == claim.start_time and step.end_time == settle.end_time
    assert claim.end_time <= handler.start_time <= handler.end_time <= settle.start_time  # type: ignore[operator]
    attributes = step.attributes or {}
    assert attributes["vibey.workflow.id"] == str(WORKFLOW)
    assert attributes["vibey.workflow.step"] == "design"
    assert attributes["vibey.step.result"] == "succeeded"
    assert attributes["vibey.step.outcome"] == "success"


def test_a_failed_step_marks_its_span_an_error_and_a_plain_job_is_its_own_trace(
    h: Harness,
    spans: InMemorySpanExporter,
) -> None:
    def broken(job: Job) -> Outcome:
        return Failure(FailureClass.WORK, "no")

    job = h.enqueue(max_attempts=1)
    assert traced_run(h, spans, broken, job) is StepResult.FAILED
    step = by_name(spans)[f"step {KIND}"]
    assert step.context.trace_id == job.id.int
    assert step.status.status_code is StatusCode.ERROR


def test_a_missed_claim_makes_no_span(h: Harness, spans: InMemorySpanExporter) -> None:
    job = h.enqueue()
    assert traced_run(h, spans, ok, job) is StepResult.SUCCEEDED
    spans.clear()
    assert traced_run(h, spans, ok, job) is StepResult.DROPPED  # that generation is settled
    assert spans.get_finished_spans() == ()


def test_without_an_endpoint_nothing_is_traced_or_wrapped(h: Harness) -> None:
    assert tracing.step_tracer(None) is None
    handlers = {KIND: ok}
    count = lambda result: None  # noqa: E731
    assert tracing.hooked(None, h.records, handlers, count) == (h.records, handlers, count)


def test_the_endpoint_comes_from_the_settings_and_must_be_a_url(tmp_path: Path) -> None:
    env = {"VIBEY_PG_URL": PG, "VIBEY_AMQP_URL": AMQP}
    assert worker_config(load_settings(env, tmp_path)).tracing.otlp_endpoint is None  # off
    env["VIBEY_TRACING_OTLP_ENDPOINT"] = "http://collector:4318/v1/traces"
    config = worker_config(load_settings(env, tmp_path))
    assert (config.tracing.otlp_endpoint, config.tracing.service_name) == (
        "http://collector:4318/v1/traces",
        "vibey",
    )
    env["VIBEY_TRACING_OTLP_ENDPOINT"] = "collector:4318"
    assert "VIBEY_TRACING_OTLP_ENDPOINT" in settings_error(env, tmp_path)


def test_an_event_span_opens_in_the_trace_it_is_given_and_records_a_failure(
    spans: InMemorySpanExporter,
) -> None:
    events = tracing.event_spans(StepTracer(recording_tracer(spans)))
    assert isinstance(events, tracing.EventTracer)
    never = events.begin("gate answered", {"vibey.gate.id": "g"})
    never.end()  # refused: no trace was named, nothing is recorded
    assert spans.get_finished_spans() == ()
    span = events.begin("workflow cancelled", {"vibey.event.type": "workflow.cancelled"})
    traceparent = span.traceparent(WORKFLOW, {"vibey.workflow.id": str(WORKFLOW)})
    span.end(RuntimeError("the commit was lost"))
    (ended,) = spans.get_finished_spans()
    assert traceparent == f"00-{WORKFLOW.int:032x}-{ended.context.span_id:016x}-01"
    assert ended.status.status_code is StatusCode.ERROR
    assert dict(ended.attributes or {}) == {
        "vibey.event.type": "workflow.cancelled",
        "vibey.workflow.id": str(WORKFLOW),
    }


def test_without_a_step_tracer_the_store_gets_no_event_spans() -> None:
    assert tracing.event_spans(None) is NO_SPANS
    span = NO_SPANS.begin("workflow started", {})
    assert span.traceparent(WORKFLOW, {}) is None
