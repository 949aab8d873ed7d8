"""The seam through which the store traces the workflow events it records outside a step.

A workflow's start, a gate answered (by a person, or by its default at its deadline) and a
cancel are each one transaction that may dispatch the workflow's next steps. Each is a span,
``workflow started``, ``gate answered``, ``workflow cancelled``, ``gate deadline``: begun
before the transaction (:meth:`EventSpans.begin`), opened in the workflow's trace once the
transaction knows which workflow it is (:meth:`EventSpan.traceparent`, which returns the W3C
``traceparent`` to write on the outbox rows of that transaction: ``UnitOfWork.trace``), and
ended after the commit (an error status when it raised). The next step's span is then that
span's child, whichever relay or reconciler sends its pointer.

:data:`NO_SPANS` (the default) records nothing and returns no traceparent, so an untraced
process writes no trace context; ``actors.tracing.EventTracer`` is the OpenTelemetry one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol, TypeVar
from uuid import UUID

from store.unit_of_work import UnitOfWork
from store.workflow_reads import GateAnswerOutcome
from workflows.queue import AnswerStatus

Attributes = Mapping[str, str | int | bool]
T = TypeVar("T")


class EventSpan(Protocol):
    def traceparent(self, trace_of: UUID, attributes: Attributes) -> str | None:
        """Open the span in the trace of ``trace_of`` (a workflow, or a plain job: the same
        trace its steps are in), from when it was begun, adding ``attributes``; the W3C
        traceparent its pointers carry (None: not recorded)."""
        ...

    def end(self, error: BaseException | None = None) -> None:
        """End the span (never opened: nothing is recorded)."""
        ...


class EventSpans(Protocol):
    def begin(self, name: str, attributes: Attributes) -> EventSpan:
        """A span of the workflow event ``name``, begun now."""
        ...


class _NoSpan:
    def traceparent(self, trace_of: UUID, attributes: Attributes) -> str | None:
        return None

    def end(self, error: BaseException | None = None) -> None:
        return None


class _NoSpans:
    """Tracing off: no span, no traceparent, nothing written."""

    def begin(self, name: str, attributes: Attributes) -> EventSpan:
        return _NO_SPAN


_NO_SPAN = _NoSpan()
NO_SPANS: EventSpans = _NoSpans()


@contextmanager
def event_span(spans: EventSpans, name: str, attributes: Attributes) -> Iterator[EventSpan]:
    """``spans.begin(name, attributes)``, ended when the block ends (with its exception)."""
    span = spans.begin(name, attributes)
    try:
        yield span
    except BaseException as exc:
        span.end(exc)
        raise
    span.end()


def traced_unit(
    begin: Callable[[], AbstractContextManager[UnitOfWork]],
    spans: EventSpans,
    name: str,
    attributes: Attributes,
    body: Callable[[UnitOfWork], T],
    trace_of: Callable[[T], tuple[UUID, Attributes] | None],
) -> T:
    """``body`` in a unit of work (``begin``) under the span ``name``: when ``trace_of`` its
    result names a trace (a workflow, or a parked job's own id) the span opens in it, and the
    unit's outbox rows carry its traceparent; the span ends after the commit."""
    with event_span(spans, name, attributes) as span, begin() as unit:
        result = body(unit)
        found = trace_of(result)
        if found is not None:
            unit.trace(span.traceparent(*found))
        return result


def answer_trace(outcome: GateAnswerOutcome) -> tuple[UUID, Attributes] | None:
    """The trace an applied answer continues (a workflow's, or a parked job's own) and what
    its span says of the gate; None for an answer that was refused."""
    gate = outcome.gate
    if outcome.status is not AnswerStatus.ANSWERED or gate is None:
        return None
    trace_of = gate.workflow_id or gate.job_id
    if trace_of is None:  # pragma: no cover - a gate belongs to a workflow or a job
        return None
    attributes: dict[str, str | int | bool] = {
        "vibey.gate.id": str(gate.id),
        "vibey.gate.kind": gate.kind,
        "vibey.gate.answered_by": gate.answered_by or "",
        "vibey.gate.answer_source": gate.answer_source or "person",
    }
    if gate.name is not None:
        attributes["vibey.gate.name"] = gate.name
    if gate.workflow_id is not None:
        attributes["vibey.workflow.id"] = str(gate.workflow_id)
    if gate.job_id is not None:
        attributes["vibey.job.id"] = str(gate.job_id)
    return trace_of, attributes
