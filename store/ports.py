"""The store's seams as the step path sees them: small Protocols the PostgreSQL classes
satisfy and the fakes of :mod:`store.memory` and :mod:`store.memory_records` implement too.

* :class:`SettlingJobRepository`: :class:`workflows.queue.JobRepository` with the ``*_txn``
  forms a step's settle joins (``PostgresJobRepository``; ``MemoryJobRepository``);
* :class:`PointerClaims`: the fenced claim of a dispatch pointer and the row a miss reads
  (``DispatchRecords``; ``MemoryDispatchRecords``);
* :class:`StepWorkflows`: the workflow side of a step's settle (``WorkflowStore``;
  ``MemoryWorkflowStore``).

What the handlers read is :class:`store.step_records.StepRecords`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Protocol
from uuid import UUID

from store.dispatch import PointerRow
from store.unit_of_work import UnitOfWork
from store.workflow_reads import Workflow
from workflows.job import FailureClass
from workflows.queue import GateRequest, Job, JobRepository, JsonObject, Lease, Settled
from workflows.steps import Outcome


class UnitsOfWork(Protocol):
    def begin(self, *, one_statement: bool = False) -> AbstractContextManager[UnitOfWork]:
        """A unit of work; its pointers go to the relay once it committed."""
        ...


class SettlingJobRepository(JobRepository, Protocol):
    """The job repository with the fenced settles a caller's unit of work joins."""

    @property
    def units(self) -> UnitsOfWork: ...

    def ack_txn(
        self, unit: UnitOfWork, lease: Lease, *, result: JsonObject | None = None
    ) -> Settled: ...

    def nack_txn(
        self,
        unit: UnitOfWork,
        lease: Lease,
        *,
        error: str,
        failure_class: FailureClass,
        retry_in: timedelta | None = None,
    ) -> Settled: ...

    def defer_txn(
        self,
        unit: UnitOfWork,
        lease: Lease,
        *,
        delay: timedelta,
        reason: str,
        capacity: bool = False,
        solo: bool = False,
    ) -> Settled: ...

    def park_txn(self, unit: UnitOfWork, lease: Lease, gate: GateRequest) -> Settled: ...


class PointerClaims(Protocol):
    """The fenced claim of pointer (job, generation), and what a missed claim reads."""

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
    ) -> Job | None: ...

    def claim_pointer(
        self, *, job_id: UUID, project_id: str, seq: int, owner: str
    ) -> Job | None: ...

    def snapshot(self, *, job_id: UUID, project_id: str) -> PointerRow | None: ...


class StepWorkflows(Protocol):
    """A step's settle as one call that takes its outcome: for a workflow's step, the
    workflow locked first, then the job's fenced write and the event it implies, in one unit
    of work (the caller's: ``settle_txn``; its own: ``settle``). A plain job's settle is the
    fenced write alone."""

    def lock_of_job_txn(
        self, unit: UnitOfWork, job_id: UUID, *, workflow: UUID | None = None
    ) -> Callable[[], Workflow | None]:
        """``workflow``: the job's workflow as its pointer names it (None: unknown), a hint
        that lets the lock's round trip carry what is read under it."""
        ...

    def settle_txn(
        self,
        unit: UnitOfWork,
        job: Job,
        outcome: Outcome,
        *,
        locked: Workflow | None = None,
        claimed: bool = False,
        savepoint: bool = True,
    ) -> Settled: ...

    def settle(self, job: Job, outcome: Outcome) -> Settled: ...
