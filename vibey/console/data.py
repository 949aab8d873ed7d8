"""What the console shows and the one thing it writes, behind a small Protocol.

:class:`ConsoleData` is the seam: :class:`StoreData` reads through :class:`vibey.client.Client`,
the methods the CLI's commands call (the pages of `vibey workflow list` and `history`,
`vibey ledger show` and `verify`, `vibey engine list`'s health, `vibey queue stats`, a
workflow's cost as `vibey workflow cost` prints it), and answers a gate through
:meth:`vibey.client.Client.answer`, the path and validator of `vibey gate answer`;
``tests/console_fake.py``'s ``FakeData`` is the in-memory one the unit tests use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from vibey.console.diagram import PhasePath, phases_entered

if TYPE_CHECKING:
    from actors.queue_stats import QueueStats
    from store.cost import WorkflowCost
    from store.db import Pool
    from store.engine_health import EngineHealth
    from store.workflow_reads import HistoryEntry, Workflow
    from vibey.client import Client
    from vibey.settings import Settings
    from workflows.ledger import LedgerEvent, LedgerVerification
    from workflows.queue import Gate

WORKFLOWS_SHOWN = 50
ROWS_SHOWN = 30  # history and ledger rows on a workflow's page, newest first


@dataclass(frozen=True, slots=True)
class OpenGate:
    gate: Gate
    waited_s: float


@dataclass(frozen=True, slots=True)
class WorkflowSummary:
    workflow: Workflow
    describe: str
    path: PhasePath
    gates: int = 0


@dataclass(frozen=True, slots=True)
class WorkflowDetail:
    summary: WorkflowSummary
    gates: list[OpenGate]
    history: list[HistoryEntry]  # newest first, at most ROWS_SHOWN
    history_total: int
    steps: list[Mapping[str, Any]]
    ledger: list[LedgerEvent]  # newest first, at most ROWS_SHOWN
    ledger_total: int
    verification: LedgerVerification | None
    cost: WorkflowCost | None = None  # tokens and dollars so far (store.cost), and the budget


@dataclass(frozen=True, slots=True)
class Health:
    engines: list[EngineHealth] = field(default_factory=list)
    queues: QueueStats | None = None
    queue_problem: str | None = None  # why the queue stats could not be read


@dataclass(frozen=True, slots=True)
class Answered:
    """An answer's outcome: ``problem`` is None when it was recorded."""

    gate_id: UUID
    problem: str | None = None
    workflow_id: UUID | None = None


class ConsoleData(Protocol):
    def workflows(self) -> list[WorkflowSummary]: ...

    def workflow(self, workflow_id: UUID) -> WorkflowDetail | None: ...

    def gates(self) -> list[OpenGate]: ...

    def health(self) -> Health: ...

    def answer(self, gate_id: UUID, value: str, *, by: str) -> Answered: ...

    def last_change(self) -> str: ...


class StoreData:
    """The console's reads and its answer on the real store, through one client."""

    def __init__(self, *, settings: Settings, client: Client, pool: Pool) -> None:
        self._settings = settings
        self._client = client
        self._pool = pool

    def workflows(self) -> list[WorkflowSummary]:
        from store.listings import PageSpec

        page = self._client.workflow_page(page=PageSpec(limit=WORKFLOWS_SHOWN, newest_first=True))
        waiting = _gates_by_workflow(self.gates())
        return [self._summary(w, waiting.get(w.id, 0)) for w in page.items]

    def workflow(self, workflow_id: UUID) -> WorkflowDetail | None:
        from store.listings import PageSpec
        from store.workflow_reads import WorkflowNotFound

        try:
            workflow = self._client.status(workflow_id)
        except WorkflowNotFound:
            return None
        gates = [g for g in self.gates() if g.gate.workflow_id == workflow_id]
        entered = [
            phase
            for entry in self._client.iter_history(workflow_id)
            for phase in phases_entered(entry.commands or [])
        ]
        newest = PageSpec(limit=ROWS_SHOWN, newest_first=True)
        history = self._client.history_page(workflow_id, newest)
        ledger = self._client.ledger_page(workflow.project_id, newest)
        return WorkflowDetail(
            summary=self._summary(workflow, len(gates), entered),
            gates=gates,
            history=history.items,
            history_total=history.total,
            steps=self._client.steps(workflow_id),
            ledger=ledger.items,
            ledger_total=ledger.total,
            verification=self._client.verify_ledger(workflow.project_id) if ledger.total else None,
            cost=self._client.cost(workflow_id),
        )

    def gates(self) -> list[OpenGate]:
        return [OpenGate(gate, waited) for gate, waited in self._client.inbox()]

    def health(self) -> Health:
        from vibey.settings import SettingsError

        engines = self._client.engine_health()
        try:
            queues = self._client.queue_stats()
        except (SettingsError, OSError, ValueError) as exc:
            return Health(engines, None, str(exc))
        except Exception as exc:  # noqa: BLE001 - pika's errors: shown on the page, not raised
            return Health(engines, None, f"{type(exc).__name__}: {exc}")
        return Health(engines, queues)

    def answer(self, gate_id: UUID, value: str, *, by: str) -> Answered:
        from vibey.client import AnswerRefused

        try:
            gate = self._client.answer(gate_id, value, by=by)
        except AnswerRefused as exc:
            return Answered(gate_id, str(exc))
        self._client.flush()  # the next steps' dispatch, as `vibey gate answer` publishes it
        return Answered(gate_id, None, gate.workflow_id)

    def last_change(self) -> str:
        from store.changes import last_change

        return last_change(self._pool)

    def _summary(
        self, workflow: Workflow, gates: int, entered: Sequence[str] = ()
    ) -> WorkflowSummary:
        path = PhasePath(
            phase=workflow.phase,
            cycle=workflow.cycle,
            status=workflow.status.value,
            entered=tuple(entered),
            waiting=gates > 0,
        )
        return WorkflowSummary(workflow, self._client.describe(workflow), path, gates)


def _gates_by_workflow(gates: Sequence[OpenGate]) -> dict[UUID, int]:
    out: dict[UUID, int] = {}
    for open_gate in gates:
        if open_gate.gate.workflow_id is not None:
            out[open_gate.gate.workflow_id] = out.get(open_gate.gate.workflow_id, 0) + 1
    return out


def age(seconds: float) -> str:
    """``95`` → ``1m35s``: how long something has waited, for a person."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
