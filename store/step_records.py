"""What a running step reads from the record store: :class:`StepRecords` and its PostgreSQL
form, named SQL in ``store/sql/step_records.sql``.

The step handlers (``actors.handlers``) and the handoff flow (``actors.handoff``) ask it
whether a claim still holds its job (the workdir lease's fence), for the workflow's spec and
answers (a configured engine's plan), for a bounded job's recorded spend and the grants its
gates' answers made, for the workflow's budget and spend (``store.cost``), for the last
answer to a gate of a kind, for how many capacity
rejections a job has waited through, and for the advisory lock that
serialises one cycle's merges. ``store.memory_records.MemoryStepRecords`` is the fake beside it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

from store.cost import BudgetState, CostReads
from store.db import Pool, fetch_all, fetch_one, statement, transaction
from store.sql import load

Q = load("step_records.sql")


@dataclass(frozen=True, slots=True)
class PlanContext:
    """The workflow's accepted spec and design answers (empty when it has none yet)."""

    spec: str = ""
    answers: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GateAnswer:
    """An answered gate: what was answered, by whom, and the gate's context."""

    answer: str
    by: str
    context: Any  # a JSON value: a mapping for the gates vibey opens


@dataclass(frozen=True, slots=True)
class Spent:
    dollars: float = 0.0
    turns: float = 0.0


class StepRecords(Protocol):
    """The record store as the step handlers read it."""

    def lease_held(self, job_id: str, owner: str) -> bool:
        """Whether job ``job_id`` is still leased under token ``owner``."""
        ...

    def plan_context(self, job_id: str) -> PlanContext | None:
        """The spec and answers of the job's workflow; None for a job of no workflow."""
        ...

    def spent(self, job_id: UUID) -> Spent:
        """What the ledger's BudgetSpent events of the job add up to."""
        ...

    def spend_granted(self, job_id: UUID, gate_kind: str) -> Mapping[str, float]:
        """What numeric answers to the job's ``gate_kind`` gates granted, by bound."""
        ...

    def attempts_granted(self, job_id: UUID, gate_kind: str) -> int:
        """The sum of the numeric answers to the job's ``gate_kind`` gates."""
        ...

    def last_answer(self, job_id: UUID, gate_kind: str) -> GateAnswer | None:
        """The latest answered ``gate_kind`` gate of the job, if any."""
        ...

    def capacity_waits(self, job_id: UUID, gate_kind: str) -> int:
        """The job's ledgered capacity rejections since its last ``gate_kind`` answer."""
        ...

    def integration_lock(self, project: str, cycle: int) -> AbstractContextManager[None]:
        """Held for a merge into ``project``'s integration branch in ``cycle``."""
        ...

    def workflow_budget(self, job_id: UUID) -> BudgetState:
        """The budget of the job's workflow, its spend so far and what was granted
        (:mod:`store.cost`); an empty state for a job of no workflow or budget."""
        ...


class PostgresStepRecords:
    """:class:`StepRecords` on PostgreSQL (one statement a read, driver errors translated)."""

    def __init__(self, *, pool: Pool) -> None:
        self._pool = pool
        self._cost = CostReads(pool)

    def lease_held(self, job_id: str, owner: str) -> bool:
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["lease_held"], {"job_id": job_id, "owner": owner})
        return row is not None

    def plan_context(self, job_id: str) -> PlanContext | None:
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["plan_context"], {"job_id": job_id})
        if row is None:
            return None
        return PlanContext(spec=row["spec"] or "", answers=row["answers"] or {})

    def spent(self, job_id: UUID) -> Spent:
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["spent"], {"job_id": job_id})
        if row is None:
            return Spent()
        return Spent(dollars=float(row["dollars"]), turns=float(row["turns"]))

    def spend_granted(self, job_id: UUID, gate_kind: str) -> Mapping[str, float]:
        with statement(self._pool) as conn:
            rows = fetch_all(conn, Q["spend_granted"], {"job_id": job_id, "kind": gate_kind})
        return {str(row["bound"]): float(row["amount"]) for row in rows}

    def attempts_granted(self, job_id: UUID, gate_kind: str) -> int:
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["attempts_granted"], {"job_id": job_id, "kind": gate_kind})
        return int(row["granted"]) if row else 0

    def last_answer(self, job_id: UUID, gate_kind: str) -> GateAnswer | None:
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["last_answer"], {"job_id": job_id, "kind": gate_kind})
        if row is None:
            return None
        return GateAnswer(str(row["answer"]), str(row["answered_by"]), row["context"])

    def capacity_waits(self, job_id: UUID, gate_kind: str) -> int:
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["capacity_waits"], {"job_id": job_id, "kind": gate_kind})
        return int(row["waits"]) if row else 0

    def workflow_budget(self, job_id: UUID) -> BudgetState:
        return self._cost.budget(job_id=job_id)

    @contextmanager
    def integration_lock(self, project: str, cycle: int) -> Iterator[None]:
        """``pg_advisory_xact_lock(hashtext('vibey.integrate:' || project), cycle)`` in a
        transaction on a pooled connection, held for the block."""
        with transaction(self._pool) as conn:
            fetch_one(conn, Q["integration_lock"], {"project": project, "cycle": cycle})
            yield
