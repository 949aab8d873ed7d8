"""What a workflow has cost and where it stands against its budget, from the ledger.

The ledger's ``BudgetSpent`` events of a workflow are the one source of truth
(``store/sql/cost.sql`` sums them in PostgreSQL, one statement for every grouping): tokens
(``input_tokens + output_tokens``), turns, and dollars where the engine reported them. A CLI
that reports no dollars (Codex, Gemini, aider without a price) leaves ``dollars`` ``None``:
"no price", never $0. :class:`CostLine.unpriced` counts the events of a line that reported
none, so a line mixing both says so.

:meth:`CostReads.budget` is what the step handlers ask before an engine step runs
(:mod:`workflows.budget`): the workflow's budget, its spend, what answers to its
``budget_exhausted`` gates granted, and the gate that is open now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg.rows import DictRow

from store.db import Conn, Pool, fetch_all, fetch_one, statement, transaction
from store.retry import retried
from store.sql import load
from workflows.budget import Budget, BudgetError, Reached, Spend, amount, reached

Q = load("cost.sql")
NO_PRICE = "no price"
SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

__all__ = ["BudgetState", "CostLine", "CostReads", "WorkflowCost"]


@dataclass(frozen=True, slots=True)
class CostLine:
    """What one engine, phase or step (or the whole workflow) spent. ``dollars`` is ``None``
    when none of its events reported a price; ``phase``/``step`` are ``None`` when the step's
    job is gone (an archived workflow)."""

    engine: str | None = None
    phase: str | None = None
    step: str | None = None
    events: int = 0
    turns: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    dollars: float | None = None
    priced: int = 0  # events that reported dollars

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def unpriced(self) -> int:
        """Events of this line that reported no dollars."""
        return self.events - self.priced

    @property
    def price(self) -> str:
        """The dollars for a person: ``$1.25``; ``no price`` when no event reported one;
        ``$1.25 + 2 runs with no price`` for a line mixing both (a run: one BudgetSpent)."""
        if self.dollars is None:
            return NO_PRICE
        figure = f"${self.dollars:,.2f}"
        if not self.unpriced:
            return figure
        runs = "run" if self.unpriced == 1 else "runs"
        return f"{figure} + {self.unpriced} {runs} with {NO_PRICE}"

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "phase": self.phase,
            "step": self.step,
            "events": self.events,
            "turns": self.turns,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "tokens": self.tokens,
            "dollars": self.dollars,
            "priced": self.priced,
            "unpriced": self.unpriced,
        }


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A workflow's budget (``None``: none), its spend, the grants, its open gate."""

    budget: Budget | None = None
    spent: Spend = field(default_factory=Spend)
    granted: Spend = field(default_factory=Spend)
    open_gate: UUID | None = None
    problem: str | None = None  # a budget in the input that is not one (none is enforced)

    @property
    def reached(self) -> Reached | None:
        return reached(self.budget, self.spent, self.granted)

    @property
    def summary(self) -> str:
        """One line for a person: the budget, what it stands at, what is waiting."""
        if self.problem is not None:
            return f"the budget in the input is not one ({self.problem}): none is enforced"
        if self.budget is None:
            return "no budget"
        parts = []
        for bound in ("dollars", "tokens"):
            cap = getattr(self.budget, bound)
            if cap is None:
                continue
            limit = cap + getattr(self.granted, bound)
            spent = getattr(self.spent, bound)
            extra = (
                f" (+{amount(bound, getattr(self.granted, bound))} granted)" if limit > cap else ""
            )
            parts.append(f"{amount(bound, spent)} of {amount(bound, limit)}{extra}")
        at = self.reached
        state = "" if at is None else f"; reached ({at.bound}): the next engine step parks"
        gate = "" if self.open_gate is None else f"; gate {self.open_gate} is open"
        return "budget " + ", ".join(parts) + state + gate

    def to_json(self) -> dict[str, Any]:
        at = self.reached
        return {
            "budget": None if self.budget is None else self.budget.to_json(),
            "spent": {"dollars": self.spent.dollars, "tokens": self.spent.tokens},
            "granted": {"dollars": self.granted.dollars, "tokens": self.granted.tokens},
            "reached": None if at is None else at.bound,
            "open_gate": None if self.open_gate is None else str(self.open_gate),
            "problem": self.problem,
        }


@dataclass(frozen=True, slots=True)
class WorkflowCost:
    """A workflow's cost so far: the total, by engine, by phase and by step, and its budget."""

    workflow_id: UUID
    project_id: str
    total: CostLine = field(default_factory=CostLine)
    engines: tuple[CostLine, ...] = ()
    phases: tuple[CostLine, ...] = ()
    steps: tuple[CostLine, ...] = ()
    budget: BudgetState = field(default_factory=BudgetState)

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow_id": str(self.workflow_id),
            "project": self.project_id,
            "total": self.total.to_json(),
            "engines": [line.to_json() for line in self.engines],
            "phases": [line.to_json() for line in self.phases],
            "steps": [line.to_json() for line in self.steps],
            "budget": self.budget.to_json(),
        }


class CostReads:
    """Reads a workflow's cost and budget on ``pool``."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    @retried("read a workflow's cost", idempotent=True)
    def workflow_cost(self, workflow_id: UUID, project_id: str) -> WorkflowCost:
        """The cost of ``workflow_id`` so far and its budget, in one snapshot."""
        with transaction(self._pool) as conn:
            conn.execute(SNAPSHOT.encode())
            rows = fetch_all(conn, Q["workflow_cost"], {"workflow_id": workflow_id})
            state = _budget(conn, workflow_id=workflow_id)
        lines = [(row, _line(row)) for row in rows]
        total = next((line for row, line in lines if _is_total(row)), CostLine())
        return WorkflowCost(
            workflow_id=workflow_id,
            project_id=project_id,
            total=total,
            engines=tuple(line for row, line in lines if row["by_engine"]),
            phases=tuple(line for row, line in lines if row["by_phase"]),
            steps=tuple(line for row, line in lines if row["by_step"]),
            budget=state,
        )

    @retried("read a workflow's budget", idempotent=True)
    def budget(self, *, workflow_id: UUID | None = None, job_id: UUID | None = None) -> BudgetState:
        """The budget of ``workflow_id`` (or of ``job_id``'s workflow); an empty state for a
        job of no workflow."""
        with statement(self._pool) as conn:
            return _budget(conn, workflow_id=workflow_id, job_id=job_id)


def _budget(
    conn: Conn, *, workflow_id: UUID | None = None, job_id: UUID | None = None
) -> BudgetState:
    row = fetch_one(conn, Q["budget_of_workflow"], {"workflow_id": workflow_id, "job_id": job_id})
    return BudgetState() if row is None else budget_state(row)


def budget_state(row: Mapping[str, Any]) -> BudgetState:
    """A ``budget_of_workflow`` row as a :class:`BudgetState`. A malformed budget (written by
    hand into the input) bounds nothing and says why."""
    if row["budget"] is None:
        return BudgetState()
    try:
        budget = Budget.from_json(row["budget"])
    except BudgetError as exc:
        return BudgetState(problem=str(exc))
    return BudgetState(
        budget=budget,
        spent=Spend(float(row["dollars"] or 0), int(row["tokens"] or 0)),
        granted=Spend(float(row["granted_dollars"] or 0), int(row["granted_tokens"] or 0)),
        open_gate=row["open_gate"],
    )


def _is_total(row: DictRow) -> bool:
    return not (row["by_engine"] or row["by_phase"] or row["by_step"])


def _line(row: DictRow) -> CostLine:
    return CostLine(
        engine=row["engine"] if row["by_engine"] else None,
        phase=row["phase"] if row["by_phase"] or row["by_step"] else None,
        step=row["step"] if row["by_step"] else None,
        events=int(row["events"]),
        turns=float(row["turns"] or 0),
        input_tokens=int(row["input_tokens"] or 0),
        output_tokens=int(row["output_tokens"] or 0),
        dollars=None if row["dollars"] is None else float(row["dollars"]),
        priced=int(row["priced"]),
    )
