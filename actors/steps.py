"""The step actor's body: fenced claim of the pointer, the handler, one settle.

``StepRunner.run`` is what every ``run_step@<queue>`` actor calls with a decoded pointer. It
never raises: a handler's exception becomes a ``vibey``-class failure (a nack the attempt
budget bounds), so Dramatiq always acknowledges the delivery after the settle committed. A
pointer whose claim missed is dropped or re-delayed through a wait tier by
``workflows.dispatch.decide_miss``.

While a handler runs, a heartbeat thread extends the lease every third of its timeout, so a
two-hour step holds its lease however long it takes, and loses it (and any settle) as soon as
its process stops beating.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol
from uuid import UUID

from actors.broker import VibeyBroker
from actors.miss import plan_miss
from actors.solo import SoloGate
from actors.topology import QueueNames
from store.db import Conn
from store.dispatch import DispatchRecords
from store.jobs import PostgresJobRepository
from store.workflows import WorkflowStore
from workflows.dispatch import DispatchEnvelope, WaitTiers
from workflows.job import TIMER_KIND, FailureClass
from workflows.queue import Job, Settled
from workflows.steps import Defer, Failure, Handlers, Outcome, Park, Success

log = logging.getLogger(__name__)


class StepResult(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEFERRED = "deferred"
    PARKED = "parked"
    STALE = "stale"  # the settle found its lease lost
    DROPPED = "dropped"
    REDELAYED = "redelayed"


class CrashPoint(enum.StrEnum):
    """Named places where a chaos test may kill the process (``CrashPoints.reached``)."""

    BEFORE_CLAIM = "before_claim"  # the delivery is held, nothing committed
    AFTER_WORK = "after_work"  # the handler ran (and stopped heartbeating), not settled
    AFTER_SETTLE = "after_settle"  # the settle committed, the delivery not yet acked


class CrashPoints(Protocol):
    def reached(self, point: CrashPoint, job_id: UUID, seq: int, count: int) -> None:
        """``count`` is the delivery count before the claim, the attempt after it: a key
        that changes on every retry, so a seeded decision cannot repeat forever."""


def _died_with_its_process(job: Job) -> bool:
    """Its previous attempt's lease expired (the reaper or a takeover says so)."""
    return job.last_error is not None and job.last_error.startswith("lease expired")


class StepRunner:
    def __init__(
        self,
        *,
        store: PostgresJobRepository,
        records: DispatchRecords,
        broker: VibeyBroker | None,  # None on the postgres backend (no pointers to re-delay)
        names: QueueNames,
        tiers: WaitTiers,
        handlers: Handlers,
        owner: str,
        crash: CrashPoints | None = None,
        on_result: Callable[[StepResult], None] | None = None,
        workflows: WorkflowStore | None = None,
    ) -> None:
        self._store = store
        self._records = records
        self._broker = broker
        self._names = names
        self._tiers = tiers
        self._handlers = handlers
        self._owner = owner
        self._crash = crash
        self._gate = SoloGate()
        self._on_result = on_result
        self._workflows = workflows

    def run(
        self,
        *,
        job_id: str,
        project_id: str,
        seq: int,
        kind: str,
        routing_key: str,
        delivery: int = 0,
        solo: bool = False,
    ) -> StepResult:
        with self._gate.alone() if solo else self._gate.shared():
            return self._run(UUID(job_id), project_id, seq, kind, routing_key, delivery, solo)

    def _run(
        self,
        job_id: UUID,
        project_id: str,
        seq: int,
        kind: str,
        routing_key: str,
        delivery: int,
        solo: bool,
    ) -> StepResult:
        self._reached(CrashPoint.BEFORE_CLAIM, job_id, seq, delivery)
        job = self._records.claim_pointer(
            job_id=job_id, project_id=project_id, seq=seq, owner=self._owner
        )
        if job is None:
            return self._record(self._missed(job_id, project_id, seq, kind, routing_key))
        if not solo and _died_with_its_process(job):
            return self._record(self._run_alone_next(job))
        with self._heartbeat(job):
            outcome = self._handle(job)
        self._reached(CrashPoint.AFTER_WORK, job.id, seq, job.attempts)
        result = self._settle(job, outcome)
        self._record(result)
        self._reached(CrashPoint.AFTER_SETTLE, job.id, seq, job.attempts)
        return result

    def run_claimed(self, job: Job) -> StepResult:
        """A job this process already leased (the postgres backend's claim): the handler
        under a heartbeat, then the one settle, as for a pointer's claim."""
        with self._heartbeat(job):
            outcome = self._handle(job)
        self._reached(CrashPoint.AFTER_WORK, job.id, 0, job.attempts)
        result = self._record(self._settle(job, outcome))
        self._reached(CrashPoint.AFTER_SETTLE, job.id, 0, job.attempts)
        return result

    def _run_alone_next(self, job: Job) -> StepResult:
        """Hand the job back (the claim's attempt refunded) for a solo run."""
        settled = self._store.defer(
            job.lease,
            delay=timedelta(0),
            reason=f"{job.last_error}; running it again alone",
            solo=True,
        )
        return StepResult.DEFERRED if settled.applied else StepResult.STALE

    def _record(self, result: StepResult) -> StepResult:
        if self._on_result is not None:
            self._on_result(result)
        return result

    def _reached(self, point: CrashPoint, job_id: UUID, seq: int, count: int) -> None:
        if self._crash is not None:
            self._crash.reached(point, job_id, seq, count)

    def _handle(self, job: Job) -> Outcome:
        if job.kind == TIMER_KIND:  # a workflow timer: its due time was the work
            return Success()
        handler = self._handlers.get(job.kind)
        if handler is None:
            return Failure(FailureClass.VIBEY, f"no handler is registered for kind {job.kind!r}")
        try:
            return handler(job)
        except Exception as exc:
            log.exception("handler for %s failed on job %s", job.kind, job.id)
            return Failure(FailureClass.VIBEY, f"{type(exc).__name__}: {exc}"[:2000])

    def _settle(self, job: Job, outcome: Outcome) -> StepResult:
        """One transaction: the fenced settle and, for a workflow's step that finished, the
        workflow's event with everything it decides (``WorkflowStore.settle_txn``)."""
        settle, label = _settle_write(self._store, job, outcome)
        if self._workflows is not None and job.workflow_id is not None:
            result = outcome.result if isinstance(outcome, Success) else {}
            evidence = outcome.evidence if isinstance(outcome, Failure) else result.get("evidence")
            failure = (
                (outcome.failure_class, outcome.detail) if isinstance(outcome, Failure) else None
            )
            settled = self._store.dispatching_transaction(
                self._workflows.settle_txn,
                job,
                settle,
                result={k: v for k, v in result.items() if k != "evidence"},
                failure=failure,
                evidence=evidence if isinstance(evidence, Mapping) else None,
            )
        else:
            # nack, defer and park are one statement each: no BEGIN/COMMIT around them.
            one = not isinstance(outcome, Success)
            settled = self._store.dispatching_transaction(_plain, settle, one_statement=one)
        if not settled.applied:
            log.warning("job %s: settle refused, the lease was lost (%s)", job.id, label)
            return StepResult.STALE
        return label

    def _missed(
        self, job_id: UUID, project_id: str, seq: int, kind: str, routing_key: str
    ) -> StepResult:
        envelope = DispatchEnvelope(
            job_id=job_id,
            project_id=project_id,
            dispatch_seq=seq,
            kind=kind,
            not_before=datetime.now(UTC),
        )
        hop = plan_miss(self._records, self._names, self._tiers, envelope)
        if hop is None or self._broker is None:
            return StepResult.DROPPED
        self._broker.publish(
            exchange=hop.exchange, routing_key=routing_key, body=hop.body, message_id=hop.message_id
        )
        return StepResult.REDELAYED

    @contextmanager
    def _heartbeat(self, job: Job) -> Iterator[None]:
        stop = threading.Event()
        interval = max(job.lease_timeout / 3, timedelta(milliseconds=50)).total_seconds()

        def beat() -> None:
            while not stop.wait(interval):
                if not self._store.heartbeat(job.lease).applied:
                    log.warning("job %s: heartbeat refused, the lease was lost", job.id)
                    return

        thread = threading.Thread(target=beat, name=f"heartbeat-{job.id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


SettleWrite = Callable[[Conn, list[int] | None], Settled]


def _settle_write(
    store: PostgresJobRepository, job: Job, outcome: Outcome
) -> tuple[SettleWrite, StepResult]:
    """The fenced write an outcome asks for, as a function of the caller's transaction."""
    lease = job.lease
    match outcome:
        case Success(result=result):
            return (
                lambda conn, outbox: store.ack_txn(conn, lease, result=result, outbox=outbox),
                StepResult.SUCCEEDED,
            )
        case Failure(failure_class=cls, detail=detail, retry_in=retry_in):
            return (
                lambda conn, outbox: store.nack_txn(
                    conn, lease, error=detail, failure_class=cls, retry_in=retry_in, outbox=outbox
                ),
                StepResult.FAILED,
            )
        case Defer(delay=delay, reason=reason, capacity=capacity):
            return (
                lambda conn, outbox: store.defer_txn(
                    conn, lease, delay=delay, reason=reason, capacity=capacity, outbox=outbox
                ),
                StepResult.DEFERRED,
            )
        case Park(gate=gate):
            return (lambda conn, outbox: store.park_txn(conn, lease, gate), StepResult.PARKED)


def _plain(
    conn: Conn, settle: Callable[[Conn, list[int] | None], Settled], *, outbox: list[int]
) -> Settled:
    return settle(conn, outbox)
