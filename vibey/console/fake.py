"""An in-memory :class:`~vibey.console.data.ConsoleData` for the console's unit tests: gates
that take an answer once (checked by the one validator, ``workflows.gates.check_answer``) and
a change marker that moves with every answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID, uuid4

from vibey.console.data import Answered, Health, OpenGate, WorkflowDetail, WorkflowSummary
from workflows.gates import check_answer
from workflows.queue import Gate


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
    marker: int = 0

    def add(self, new: Gate) -> Gate:
        self.open[new.id] = new
        self.marker += 1
        return new

    def workflows(self) -> list[WorkflowSummary]:
        return []

    def workflow(self, workflow_id: UUID) -> WorkflowDetail | None:
        return None

    def gates(self) -> list[OpenGate]:
        return [OpenGate(g, 1.0) for g in self.open.values()]

    def health(self) -> Health:
        return Health()

    def answer(self, gate_id: UUID, value: str, *, by: str) -> Answered:
        found = self.open.get(gate_id)
        if found is None:
            return Answered(gate_id, "no such gate, or it is answered already")
        problem = check_answer(value, answers=found.answers, schema=found.schema)
        if problem is not None:
            return Answered(gate_id, problem)
        del self.open[gate_id]
        self.answered.append((gate_id, value, by))
        self.marker += 1
        return Answered(gate_id)

    def last_change(self) -> str:
        return str(self.marker)
