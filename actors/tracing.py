"""OpenTelemetry traces of the steps and of the workflow events outside a step: off (the API's
no-op) unless an OTLP endpoint is set.

A workflow is a trace: its trace id is the workflow's UUID (a plain job's, its own id), so
every step of one workflow — whichever process, backend or retry ran it — lands in one trace
with nothing carried between them. A step is a span ``step <kind>`` from the start of its claim
to the end of its settle, with three children: ``claim``, ``handler`` and ``settle`` (the
fenced settle and, for a workflow's step, the workflow event it records, in one commit).

Across the broker the W3C ``traceparent`` rides in the dispatch pointer's AMQP headers: a
traced process's relay opens a ``publish <kind>`` span (under the workflow's context) for each
pointer it sends and injects it (:meth:`StepTracer.publish_headers`); the consumer hands those
headers to :meth:`StepTracer.delivered`, and the step's span is then that publish span's child
(same trace). An untraced relay opens no span (it sends only a row's stored traceparent,
below); an untraced worker ignores the header.

Workflow events recorded outside a step — a start, a gate answered (from the CLI, the console,
the client, or by its default at its deadline), a cancel — are spans too (:class:`EventTracer`,
given to the workflow store: ``store.event_spans``), in the same trace: the trace id is derived
from the workflow id, not persisted with the workflow, because every process (a CLI, a worker
answering a deadline, a reconciler) can derive it from the id it already holds, with no column
to read or migrate, and the step spans already hang from it. What is
persisted is the event span's ``traceparent``, on the outbox rows its transaction wrote
(``job_outbox.traceparent``): every relay sends a row's stored traceparent as it is (the next
step's span is then the event span's child), a reconciler's drain and the lost-dispatch sweep
included, so a resent pointer continues the trace it was written in. A row written untraced
has none, and a traced relay opens a ``publish`` span for it as above. A timer firing is a
step (its job's span); a gate's deadline is the ``gate deadline`` span.

The step spans are made after the fact from the times each phase began: only the claim says
which workflow a pointer belongs to. The hooks wrap what :class:`actors.steps.StepRunner`
is given (its pointer claims, its handlers, its result callback), so the runner itself knows
nothing of tracing; one step runs on one thread, and a thread-local holds its times.

Only ``opentelemetry-api`` is a dependency: without :func:`configure` every span is the API's
non-recording one and costs next to nothing. :func:`configure` installs the SDK's provider
with a batching OTLP/HTTP exporter (``pip install 'vibey[otel]'``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from actors.steps import StepResult
from store.dispatch import PointerRow
from store.event_spans import NO_SPANS, Attributes, EventSpans
from store.ports import PointerClaims
from store.unit_of_work import OutboxRow, UnitOfWork
from workflows.queue import Job
from workflows.steps import Handler, Handlers, Outcome, Short

TRACER_NAME = "vibey"
_FAILED = frozenset({StepResult.FAILED, StepResult.PARKED})
_configured: list[str] = []  # the endpoint this process exports to, once configured


class TracingUnavailable(RuntimeError):
    """An OTLP endpoint is configured but the SDK or its exporter is not installed."""


def configure(endpoint: str, *, service_name: str = "vibey") -> None:
    """Export every span to the OTLP/HTTP collector at ``endpoint`` (…/v1/traces); once
    per process (a second call, e.g. a second client, keeps the first provider)."""
    if _configured:
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            f"an OTLP endpoint is set ({endpoint}) but the OpenTelemetry SDK is not installed "
            f"({exc}): run `pip install 'vibey[otel]'`, or unset VIBEY_TRACING_OTLP_ENDPOINT"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)
    _configured.append(endpoint)


def workflow_context(trace_of: UUID) -> Context:
    """The remote parent every step of ``trace_of`` (a workflow, or a plain job) hangs from."""
    span_id = (trace_of.int & 0xFFFF_FFFF_FFFF_FFFF) or 1
    parent = SpanContext(
        trace_id=trace_of.int,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


@dataclass(slots=True)
class _Step:
    job: Job
    claim_start: int
    claim_end: int
    handler_start: int | None = None
    handler_end: int | None = None
    outcome: str | None = None
    parent: Context | None = None  # the publish span the delivery carried


class StepTracer:
    """The spans of the steps one process runs (``tracer``: the API's global one by default)."""

    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        self._tracer = tracer or trace.get_tracer(TRACER_NAME)
        self._local = threading.local()

    @property
    def tracer(self) -> trace.Tracer:
        return self._tracer

    # -- the hooks -------------------------------------------------------------------------

    def claims(self, inner: PointerClaims) -> PointerClaims:
        return _TracedClaims(inner, self)

    def handlers(self, inner: Handlers) -> Handlers:
        traced: dict[str, Handler] = {}
        for kind, handler in inner.items():
            if isinstance(handler, Short):
                traced[kind] = Short(self._handler(handler.handler))
            else:
                traced[kind] = self._handler(handler)
        return traced

    def on_result(self, inner: Callable[[StepResult], None] | None) -> Callable[[StepResult], None]:
        def record(result: StepResult) -> None:
            self.finished(result)
            if inner is not None:
                inner(result)

        return record

    # -- what the hooks report -------------------------------------------------------------

    def publish_headers(self, row: OutboxRow) -> dict[str, str]:
        """A ``publish <kind>`` span for the pointer of ``row``, in its workflow's trace, as
        the W3C headers to send with it (the relay sends a row's stored traceparent instead,
        when it has one: no span is opened for it)."""
        span = self._tracer.start_span(
            f"publish {row.kind}",
            context=workflow_context(row.workflow_id or row.job_id),
            kind=trace.SpanKind.PRODUCER,
            attributes={"vibey.job.id": str(row.job_id), "vibey.job.kind": row.kind},
        )
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        span.end()
        return carrier

    def delivered(self, headers: Mapping[str, Any] | None) -> None:
        """The trace headers of the pointer this thread is about to run (None: none)."""
        self._local.parent = None
        carrier = {k: v for k, v in (headers or {}).items() if isinstance(v, str)}
        if carrier.get("traceparent"):
            parent = propagate.extract(carrier)
            if trace.get_current_span(parent).get_span_context().is_valid:
                self._local.parent = parent

    def claimed(self, job: Job, started_ns: int) -> None:
        """A claim that returned ``job`` (the postgres backend's claim calls this itself)."""
        parent: Context | None = getattr(self._local, "parent", None)
        self._local.parent = None
        self._local.step = _Step(job, started_ns, time.time_ns(), parent=parent)

    def finished(self, result: StepResult) -> None:
        """The step's result is recorded: its settle is over; emit its spans."""
        step: _Step | None = getattr(self._local, "step", None)
        self._local.step = None
        if step is None:  # a missed claim: no job, no step
            return
        end = time.time_ns()
        job = step.job
        root = self._tracer.start_span(
            f"step {job.kind}",
            context=step.parent or workflow_context(job.workflow_id or job.id),
            start_time=step.claim_start,
            attributes=_attributes(job, result, step.outcome),
        )
        if result in _FAILED:
            root.set_status(Status(StatusCode.ERROR, job.last_error or result.value))
        inside = trace.set_span_in_context(root)
        self._child("claim", inside, step.claim_start, step.claim_end)
        settle_from = step.claim_end
        if step.handler_start is not None and step.handler_end is not None:
            self._child("handler", inside, step.handler_start, step.handler_end)
            settle_from = step.handler_end
        self._child("settle", inside, settle_from, end)
        root.end(end_time=end)

    def _child(self, name: str, parent: Context, start: int, end: int) -> None:
        self._tracer.start_span(name, context=parent, start_time=start).end(end_time=end)

    def _handler(self, handler: Handler) -> Handler:
        def run(job: Job) -> Outcome:
            step: _Step | None = getattr(self._local, "step", None)
            if step is not None:
                step.handler_start = time.time_ns()
            outcome = handler(job)
            if step is not None:
                step.handler_end = time.time_ns()
                step.outcome = type(outcome).__name__.lower()
            return outcome

        return run


class EventTracer:
    """The spans of workflow events outside a step (``store.event_spans.EventSpans``)."""

    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        self._tracer = tracer or trace.get_tracer(TRACER_NAME)

    def begin(self, name: str, attributes: Attributes) -> _EventSpan:
        return _EventSpan(self._tracer, name, attributes)


class _EventSpan:
    """A span begun at construction, opened in its trace once the trace is known."""

    def __init__(self, tracer: trace.Tracer, name: str, attributes: Attributes) -> None:
        self._tracer = tracer
        self._name = name
        self._attributes = dict(attributes)
        self._start = time.time_ns()
        self._span: trace.Span | None = None

    def traceparent(self, trace_of: UUID, attributes: Attributes) -> str | None:
        if self._span is None:
            self._span = self._tracer.start_span(
                self._name,
                context=workflow_context(trace_of),
                start_time=self._start,
                attributes={**self._attributes, **attributes},
            )
        if not self._span.is_recording():
            return None
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier.get("traceparent")

    def end(self, error: BaseException | None = None) -> None:
        if self._span is None:
            return
        if error is not None:
            self._span.record_exception(error)
            self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self._span.end()


class _TracedClaims:
    """A :class:`store.ports.PointerClaims` that tells the tracer which job a claim took."""

    def __init__(self, inner: PointerClaims, tracer: StepTracer) -> None:
        self._inner = inner
        self._tracer = tracer

    def claim_pointer_txn(
        self,
        unit: UnitOfWork,
        *,
        job_id: UUID,
        project_id: str,
        seq: int,
        owner: str,
        sent: int | None = None,
        locked: bool = False,
    ) -> Job | None:
        started = time.time_ns()
        job = self._inner.claim_pointer_txn(
            unit,
            job_id=job_id,
            project_id=project_id,
            seq=seq,
            owner=owner,
            sent=sent,
            locked=locked,
        )
        if job is not None:
            self._tracer.claimed(job, started)
        return job

    def claim_pointer(self, *, job_id: UUID, project_id: str, seq: int, owner: str) -> Job | None:
        started = time.time_ns()
        job = self._inner.claim_pointer(job_id=job_id, project_id=project_id, seq=seq, owner=owner)
        if job is not None:
            self._tracer.claimed(job, started)
        return job

    def snapshot(self, *, job_id: UUID, project_id: str) -> PointerRow | None:
        return self._inner.snapshot(job_id=job_id, project_id=project_id)


def _attributes(job: Job, result: StepResult, outcome: str | None) -> Mapping[str, Any]:
    attributes: dict[str, Any] = {
        "vibey.job.id": str(job.id),
        "vibey.job.kind": job.kind,
        "vibey.job.attempt": job.attempts,
        "vibey.project": job.project_id,
        "vibey.step.result": result.value,
    }
    if job.workflow_id is not None:
        attributes["vibey.workflow.id"] = str(job.workflow_id)
    if job.step is not None:
        attributes["vibey.workflow.step"] = job.step
    if outcome is not None:
        attributes["vibey.step.outcome"] = outcome
    return attributes


def step_tracer(endpoint: str | None, *, service_name: str = "vibey") -> StepTracer | None:
    """With an endpoint: the exporter installed and a tracer for this process; else None."""
    if endpoint is None:
        return None
    configure(endpoint, service_name=service_name)
    return StepTracer()


def event_spans(tracer: StepTracer | None) -> EventSpans:
    """The workflow-event spans of a process whose steps ``tracer`` traces (None: none)."""
    return NO_SPANS if tracer is None else EventTracer(tracer.tracer)


def hooked(
    tracer: StepTracer | None,
    claims: PointerClaims,
    handlers: Handlers,
    on_result: Callable[[StepResult], None],
) -> tuple[PointerClaims, Handlers, Callable[[StepResult], None]]:
    """What a :class:`actors.steps.StepRunner` is given, traced when ``tracer`` is set."""
    if tracer is None:
        return claims, handlers, on_result
    return tracer.claims(claims), tracer.handlers(handlers), tracer.on_result(on_result)
