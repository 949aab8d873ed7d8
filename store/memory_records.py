"""In-memory fakes of the record store's smaller seams, beside :mod:`store.memory`'s job
repository, over which they read:

* :class:`MemoryDispatchRecords` is :class:`store.ports.PointerClaims`: the fenced claim of a
  pointer (job, generation) and the row a missed claim reads (``store/sql/dispatch.sql``);
* :class:`MemoryWorkflowStore` is :class:`store.ports.StepWorkflows`: it runs the settle and
  keeps the event facts each settled step reported (no definition is decided here);
* :class:`MemoryStepRecords` is :class:`store.step_records.StepRecords`: leases and gate
  answers read from a :class:`store.memory.MemoryJobRepository`, spend and plans set by the
  test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from store.cost import BudgetState
from store.dispatch import PointerRow
from store.memory import MemoryJobRepository
from store.settle import event_facts, is_one_statement, settle_txn
from store.step_records import GateAnswer, PlanContext, Spent
from store.unit_of_work import UnitOfWork
from store.workflow_reads import Workflow
from workflows.job import JobState
from workflows.queue import Job, JsonObject, Settled
from workflows.steps import Outcome


class MemoryDispatchRecords:
    """Pointer claims over a :class:`MemoryJobRepository` (``store/sql/dispatch.sql``)."""

    def __init__(self, jobs: MemoryJobRepository) -> None:
        self._jobs = jobs
        self.claims = 0  # claims attempted, hit or miss

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
        """``locked`` changes nothing here: a claim in memory is written at once."""
        self.claims += 1
        jobs, now = self._jobs, self._jobs.clock()
        job = jobs.get(job_id)
        if job is None or job.project_id != project_id or job.dispatch_seq != seq:
            return None
        expired = (
            job.state is JobState.LEASED
            and job.lease_expires_at is not None
            and job.lease_expires_at <= now
            and job.attempts < job.max_attempts
        )
        claimable = job.state in (JobState.READY, JobState.AWAITING_CAPACITY) or expired
        if not claimable or job.run_after > now or not jobs.deps_met(job.id):
            return None
        return jobs.lease_to(job, owner, now)

    def claim_pointer(self, *, job_id: UUID, project_id: str, seq: int, owner: str) -> Job | None:
        with self._jobs.units.begin(one_statement=True) as unit:
            return self.claim_pointer_txn(
                unit, job_id=job_id, project_id=project_id, seq=seq, owner=owner
            )

    def snapshot(self, *, job_id: UUID, project_id: str) -> PointerRow | None:
        job = self._jobs.get(job_id)
        if job is None or job.project_id != project_id:
            return None
        return PointerRow(
            state=job.state,
            dispatch_seq=job.dispatch_seq,
            run_after=job.run_after,
            lease_expires_at=job.lease_expires_at,
            deps_met=self._jobs.deps_met(job_id),
            now=self._jobs.clock(),
        )


@dataclass(frozen=True, slots=True)
class StepEvent:
    """What a finished workflow step reported to its workflow."""

    job_id: UUID
    step: str | None
    state: JobState | None
    result: JsonObject | None
    failure: tuple[Any, str] | None
    evidence: JsonObject | None


class MemoryWorkflowStore:
    """The workflow side of a step's settle, in memory: the fenced write the outcome asks for
    runs on ``jobs`` (``store.settle``), and each step that it settled is kept as a
    :class:`StepEvent` (``events``)."""

    def __init__(
        self, jobs: MemoryJobRepository, workflows: Mapping[UUID, Workflow] | None = None
    ) -> None:
        self._jobs = jobs
        self.workflows = dict(workflows or {})
        self.events: list[StepEvent] = []
        self.locked: list[UUID] = []

    def lock_of_job_txn(
        self, unit: UnitOfWork, job_id: UUID, *, workflow: UUID | None = None
    ) -> Callable[[], Workflow | None]:
        self.locked.append(job_id)
        return lambda: None

    def settle(self, job: Job, outcome: Outcome) -> Settled:
        one = job.workflow_id is None and is_one_statement(outcome)
        with self._jobs.units.begin(one_statement=one) as unit:
            return self.settle_txn(unit, job, outcome)

    def settle_txn(
        self,
        unit: UnitOfWork,
        job: Job,
        outcome: Outcome,
        *,
        locked: Workflow | None = None,
        claimed: bool = False,
        savepoint: bool = True,
    ) -> Settled:
        settled = settle_txn(self._jobs, unit, job, outcome)
        if settled.applied and job.workflow_id is not None and job.step is not None:
            result, failure, evidence = event_facts(outcome)
            event = StepEvent(job.id, job.step, settled.state, result, failure, evidence)
            self.events.append(event)
        return settled


class MemoryStepRecords:
    """What the handlers read, in memory: leases and gate answers from ``jobs`` (when given),
    spend and plan contexts as the test sets them (:meth:`spend`, ``plans``)."""

    def __init__(self, jobs: MemoryJobRepository | None = None) -> None:
        self._jobs = jobs
        self.plans: dict[str, PlanContext] = {}
        self._spent: dict[UUID, Spent] = {}
        self.rejections: dict[UUID, int] = {}  # capacity rejections since the last answer
        self.answers: list[tuple[UUID, str, GateAnswer]] = []  # besides the jobs' gates
        self.locks_taken: list[tuple[str, int]] = []
        self.budgets: dict[UUID, BudgetState] = {}  # by job: the workflow's, as the test sets
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._guard = threading.Lock()

    def spend(self, job_id: UUID, *, dollars: float = 0.0, turns: float = 0.0) -> None:
        """Record spend against ``job_id`` (the ledger's BudgetSpent, in the real store)."""
        was = self._spent.get(job_id, Spent())
        self._spent[job_id] = Spent(was.dollars + dollars, was.turns + turns)

    def lease_held(self, job_id: str, owner: str) -> bool:
        job = None if self._jobs is None else self._jobs.get(UUID(job_id))
        return job is not None and job.state is JobState.LEASED and str(job.lease_token) == owner

    def plan_context(self, job_id: str) -> PlanContext | None:
        return self.plans.get(job_id)

    def spent(self, job_id: UUID) -> Spent:
        return self._spent.get(job_id, Spent())

    def _answered(self, job_id: UUID, gate_kind: str) -> list[GateAnswer]:
        """The answers to the job's gates of ``gate_kind``, oldest first."""
        found: list[tuple[datetime, GateAnswer]] = []
        if self._jobs is not None:
            for gate in self._jobs.gates_of(job_id):
                if gate.kind == gate_kind and gate.answered_at is not None:
                    answer = GateAnswer(str(gate.answer), str(gate.answered_by), gate.context)
                    found.append((gate.answered_at, answer))
        found.sort(key=lambda pair: pair[0])
        extra = [a for j, k, a in self.answers if (j, k) == (job_id, gate_kind)]
        return [a for _, a in found] + extra

    def spend_granted(self, job_id: UUID, gate_kind: str) -> Mapping[str, float]:
        granted: dict[str, float] = {}
        for answer in self._answered(job_id, gate_kind):
            if answer.answer.isdigit() and isinstance(answer.context, Mapping):
                bound = str(answer.context.get("grant"))
                granted[bound] = granted.get(bound, 0.0) + float(answer.answer)
        return granted

    def attempts_granted(self, job_id: UUID, gate_kind: str) -> int:
        return sum(int(a.answer) for a in self._answered(job_id, gate_kind) if a.answer.isdigit())

    def last_answer(self, job_id: UUID, gate_kind: str) -> GateAnswer | None:
        answered = self._answered(job_id, gate_kind)
        return answered[-1] if answered else None

    def capacity_waits(self, job_id: UUID, gate_kind: str) -> int:
        """The rejections the test set in ``rejections`` (the ledger's, in the real store)."""
        return self.rejections.get(job_id, 0)

    def workflow_budget(self, job_id: UUID) -> BudgetState:
        """The state the test set in ``budgets`` (the ledger's and the gates', in the real
        store); none by default."""
        return self.budgets.get(job_id, BudgetState())

    @contextmanager
    def integration_lock(self, project: str, cycle: int) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault((project, cycle), threading.Lock())
        with lock:
            self.locks_taken.append((project, cycle))
            yield
