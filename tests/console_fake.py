"""An in-memory :class:`~vibey.console.data.ConsoleData` for the console's unit tests: gates
that take an answer once (checked by the one validator, ``workflows.gates.check_answer``, and
refused in the words of :func:`vibey.client.refusal`) and
a change marker that moves with every answer; and :class:`FakeEvents`, an
:class:`~vibey.console.feed.EventSource` the test drives, calling back from threads of its own
as the broker's ``actors.event_watch.EventWatch`` does."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID, uuid4

from store.workflow_reads import GateAnswerOutcome, Workflow
from vibey.client import refusal
from vibey.console.data import Answered, Health, OpenGate, WorkflowDetail, WorkflowSummary
from vibey.console.diagram import PhasePath
from workflows.engine import Status
from workflows.events import DomainEvent
from workflows.gates import check_answer
from workflows.queue import AnswerStatus, Gate


def workflow(project: str = "demo", phase: str = "review", cycle: int = 1) -> Workflow:
    now = datetime.now(UTC)
    return Workflow(
        id=uuid4(),
        project_id=project,
        definition="vibey-protocol",
        version=1,
        phase=phase,
        cycle=cycle,
        status=Status.RUNNING,
        completion_mode=None,
        reason=None,
        input={},
        state={},
        last_seq=1,
        applied_seq=1,
        created_at=now,
        updated_at=now,
        finished_at=None,
    )


def gate(prompt: str = "Ship it?", answers: tuple[str, ...] = ("yes", "no")) -> Gate:
    return Gate(
        id=uuid4(),
        project_id="demo",
        job_id=None,
        kind="approval",
        prompt=prompt,
        answers=answers,
        context={},
        opened_at=datetime.now(UTC),
        answer=None,
        answered_by=None,
        answered_at=None,
        name="ship.approval",
    )


@dataclass
class FakeData:
    open: dict[UUID, Gate] = field(default_factory=dict)
    answered: list[tuple[UUID, str, str]] = field(default_factory=list)  # (gate, answer, by)
    runs: dict[UUID, WorkflowDetail] = field(default_factory=dict)
    marker: int = 0

    def add(self, new: Gate) -> Gate:
        self.open[new.id] = new
        self.marker += 1
        return new

    def add_workflow(self, run: Workflow, entered: tuple[str, ...] = ()) -> WorkflowDetail:
        """A workflow with no gate, step, history nor ledger (``entered``: its phases)."""
        path = PhasePath(run.phase, run.cycle, run.status.value, entered)
        detail = WorkflowDetail(WorkflowSummary(run, "running", path), [], [], 0, [], [], 0, None)
        self.runs[run.id] = detail
        self.marker += 1
        return detail

    def workflows(self) -> list[WorkflowSummary]:
        return [detail.summary for detail in self.runs.values()]

    def workflow(self, workflow_id: UUID) -> WorkflowDetail | None:
        return self.runs.get(workflow_id)

    def gates(self) -> list[OpenGate]:
        return [OpenGate(g, 1.0) for g in self.open.values()]

    def health(self) -> Health:
        return Health()

    def answer(self, gate_id: UUID, value: str, *, by: str) -> Answered:
        found = self.open.get(gate_id)
        if found is None:  # the fake forgets answered gates: unknown, in the store's words
            refused = GateAnswerOutcome(AnswerStatus.UNKNOWN_GATE)
            return Answered(gate_id, refusal(refused, str(gate_id), value))
        problem = check_answer(value, answers=found.answers, schema=found.schema)
        if problem is not None:
            refused = GateAnswerOutcome(AnswerStatus.INVALID_ANSWER, found, problem)
            return Answered(gate_id, refusal(refused, str(gate_id), value))
        del self.open[gate_id]
        self.answered.append((gate_id, value, by))
        self.marker += 1
        return Answered(gate_id)

    def last_change(self) -> str:
        return str(self.marker)


@dataclass
class FakeEvents:
    on_event: Callable[[DomainEvent | None], None] | None = None
    on_state: Callable[[bool], None] | None = None
    stopped: bool = False

    def start(
        self,
        *,
        on_event: Callable[[DomainEvent | None], None],
        on_state: Callable[[bool], None],
    ) -> None:
        self.on_event, self.on_state = on_event, on_state

    def stop(self) -> None:
        self.stopped = True

    def connect(self) -> None:
        assert self.on_state is not None, "start() first"
        _on_a_thread(self.on_state, True)

    def drop(self) -> None:
        assert self.on_state is not None, "start() first"
        _on_a_thread(self.on_state, False)

    def emit(self, event: DomainEvent | None) -> None:
        assert self.on_event is not None, "start() first"
        _on_a_thread(self.on_event, event)


def _on_a_thread(callback: Callable[..., None], *args: object) -> None:
    thread = threading.Thread(target=callback, args=args, name="fake-events")
    thread.start()
    thread.join()
