"""The step runner on the in-memory fakes, as the unit tests of the runner and of its traces
drive it: a :class:`Harness` (``tests/unit/conftest.py`` gives one per test as ``h``), the
one handler most tests need (:func:`ok`), and the tracer those traces are read from."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from actors import tracing
from actors.graph import assemble_memory
from actors.steps import StepResult, StepRunner
from actors.stub_broker import StubPublisher
from actors.topology import QueueNames
from actors.tracing import StepTracer
from store.memory import ManualClock, MemoryJobRepository
from store.memory_records import MemoryDispatchRecords, MemoryWorkflowStore
from workflows.dispatch import DEFAULT_WAIT_TIERS
from workflows.engine import Registry
from workflows.protocol.definition import DEFINITIONS
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Handler, Outcome, Short, Success

P = "proj"
KIND = "design.interview"
NAMES = QueueNames("unit")
REGISTRY = Registry(DEFINITIONS)


@dataclass
class Harness:
    clock: ManualClock
    jobs: MemoryJobRepository
    records: MemoryDispatchRecords
    broker: StubPublisher
    workflows: MemoryWorkflowStore
    seen: list[Job]

    def runner(self, handler: Handler, *, workflows: bool = False) -> StepRunner:
        def recording(job: Job) -> Outcome:
            self.seen.append(job)
            return handler(job)

        wrapped: Handler = Short(recording) if isinstance(handler, Short) else recording
        return StepRunner(
            jobs=self.jobs,
            records=self.records,
            broker=self.broker,
            names=NAMES,
            tiers=DEFAULT_WAIT_TIERS,
            handlers={KIND: wrapped},
            owner="worker-1",
            workflows=self.workflows if workflows else None,
        )

    def traced_runner(self, tracer: StepTracer, handler: Handler) -> StepRunner:
        """A runner given the tracer's hooks, as the worker wires it."""
        claims, handlers, on_result = tracing.hooked(tracer, self.records, {KIND: handler}, print)
        return StepRunner(
            jobs=self.jobs,
            records=claims,
            broker=self.broker,
            names=NAMES,
            tiers=DEFAULT_WAIT_TIERS,
            handlers=handlers,
            owner="worker-1",
            on_result=on_result,
        )

    def enqueue(self, **kw: Any) -> Job:
        request = EnqueueRequest(project_id=P, kind=KIND, subject=uuid.uuid4().hex, **kw)
        return self.jobs.enqueue(request).job

    def run(self, runner: StepRunner, job: Job, seq: int, **kw: Any) -> StepResult:
        route = f"shared.interactive.{P}"
        return runner.run(
            job_id=str(job.id), project_id=P, seq=seq, kind=KIND, routing_key=route, **kw
        )

    def now(self, job: Job) -> Job:
        found = self.jobs.get(job.id)
        assert found is not None
        return found


def harness() -> Harness:
    """A fresh harness: a manual clock, the memory graph (``actors.graph.assemble_memory``)
    dispatching to a stub broker."""
    clock = ManualClock()
    broker = StubPublisher()
    graph = assemble_memory(
        registry=REGISTRY, owner="worker-1", clock=clock, dispatch=True, on_commit=broker.submit
    )
    return Harness(clock, graph.jobs, graph.records, broker, graph.workflows, [])


def ok(job: Job) -> Outcome:
    return Success({"answer": 42})


def recording_tracer(exporter: InMemorySpanExporter) -> Tracer:
    """A tracer whose spans end up in ``exporter`` at once (no global provider is set)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


def spans_by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()}
