"""The step actor's body: fenced claim of the pointer, the handler, one settle.

``StepRunner.run`` is what every ``run_step@<queue>`` actor calls with a decoded pointer. It
never raises: a handler's exception becomes a ``vibey``-class failure (a nack the attempt
budget bounds), so Dramatiq always acknowledges the delivery after the settle committed. A
pointer whose claim missed is dropped or re-delayed through a wait tier by
``workflows.dispatch.decide_miss``. When PostgreSQL does not answer (past the store's retries)
the pointer goes back through a wait tier instead, and a commit cut off mid-flight is resolved
by reading the row (``actors.outage``).

While a handler runs, the process's heartbeat thread (``actors.heartbeat``) extends the lease
every third of its timeout, so a two-hour step holds its lease however long it takes, and
loses it (and any settle) as soon as its process stops beating.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol
from uuid import UUID

from actors import outage
from actors.heartbeat import Heartbeats
from actors.in_place import Chain, InPlace
from actors.miss import plan_miss
from actors.solo import SoloGate
from actors.stub_broker import Publisher
from actors.topology import QueueNames
from store.errors import CommitUnknown, DatabaseUnavailable, DecisionFailed, SettleRefused
from store.ports import PointerClaims, SettlingJobRepository, StepWorkflows
from store.retry import retrying
from store.settle import settle, settle_txn
from store.unit_of_work import UnitOfWork
from store.workflow_reads import Workflow
from workflows.dispatch import DispatchEnvelope, WaitTiers
from workflows.job import TIMER_KIND, FailureClass
from workflows.queue import Job, Settled
from workflows.steps import Defer, Failure, Handlers, Outcome, Park, Short, Success

log = logging.getLogger(__name__)


class StepResult(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEFERRED = "deferred"
    PARKED = "parked"
    STALE = "stale"  # the settle found its lease lost
    DROPPED = "dropped"
    REDELAYED = "redelayed"
    WAITED = "waited"  # PostgreSQL did not answer: the pointer went back through a wait tier


class CrashPoint(enum.StrEnum):
    """Named places where a chaos test may kill the process (``CrashPoints.reached``)."""

    BEFORE_CLAIM = "before_claim"  # the delivery is held, nothing committed
    AFTER_WORK = "after_work"  # the handler ran (and stopped heartbeating), not settled
    AFTER_SETTLE = "after_settle"  # the settle committed, the delivery not yet acked


class CrashPoints(Protocol):
    def reached(self, point: CrashPoint, job_id: UUID, seq: int, count: int) -> None:
        """``count`` is the delivery count before the claim, the attempt after it: a key
        that changes on every retry, so a seeded decision cannot repeat forever."""


@dataclass(slots=True)
class _Handled:
    """A short step's handler outcome, kept across the units that settle it."""

    outcome: Outcome | None = None


def _died_with_its_process(job: Job) -> bool:
    """Its previous attempt's lease expired (the reaper or a takeover says so)."""
    return job.lease_expired


class StepRunner:
    def __init__(
        self,
        *,
        jobs: SettlingJobRepository,
        records: PointerClaims,
        broker: Publisher | None,  # None on the postgres backend (no pointers to re-delay)
        names: QueueNames,
        tiers: WaitTiers,
        handlers: Handlers,
        owner: str,
        crash: CrashPoints | None = None,
        on_result: Callable[[StepResult], None] | None = None,
        workflows: StepWorkflows | None = None,
        in_place: InPlace | None = None,
    ) -> None:
        """``in_place``: which released jobs this process runs itself right after a settle
        (``actors.in_place``; None: every pointer goes through the broker)."""
        self._jobs = jobs
        self._in_place = in_place
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
        self._heartbeats = Heartbeats(beat=jobs.heartbeat)

    def close(self) -> None:
        """Stop the heartbeat thread (once no step runs)."""
        self._heartbeats.close()

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
        redelivered: bool = False,
        workflow: str | None = None,
    ) -> StepResult:
        """``delivery``: the broker's delivery count before this one; ``redelivered``: the
        broker delivered this message before (a consumer died holding it); ``workflow``: the
        job's workflow as the pointer names it (a hint: the claim's round trip then carries
        the workflow's history when this process has not replayed it)."""
        with self._gate.alone() if solo else self._gate.shared():
            try:
                if not (solo or redelivered or delivery) and self._short(kind):
                    chain = None if self._in_place is None else self._in_place.chain()
                    result = self._run_short_retried(
                        UUID(job_id), project_id, seq, kind, routing_key, chain,
                        workflow=_uuid_or_none(workflow),
                    )  # fmt: skip
                    if chain is not None:
                        self._continue(chain)
                    return result
                return self._run(UUID(job_id), project_id, seq, kind, routing_key, delivery, solo)
            except DatabaseUnavailable as exc:
                log.warning(
                    "job %s: PostgreSQL did not answer (%s); the pointer waits", job_id, exc
                )
                if self._broker is None:  # the postgres backend: the row is the pointer
                    return self._record(StepResult.WAITED)
                outage.wait_out(
                    self._broker,
                    self._names,
                    self._tiers,
                    job_id=UUID(job_id),
                    project_id=project_id,
                    seq=seq,
                    kind=kind,
                    routing_key=routing_key,
                )
                return self._record(StepResult.WAITED)

    def _continue(self, chain: Chain) -> None:
        """Run the jobs the chain's settles kept from the relay, one after another, each
        claimed (fenced on its generation) in the unit that marks its outbox row sent. When
        PostgreSQL does not answer, the chain stops: the held row is unsent and unheld, so a
        reconciler's drain publishes it."""
        while (held := chain.take()) is not None:
            row, routing_key = held
            try:
                self._run_short_retried(
                    row.job_id, row.project_id, row.dispatch_seq, row.kind, routing_key, chain,
                    sent=row.id, workflow=row.workflow_id,
                )  # fmt: skip
            except DatabaseUnavailable as exc:
                log.warning(
                    "job %s: PostgreSQL did not answer (%s); its pointer waits for the drain",
                    row.job_id,
                    exc,
                )
                return

    def _run_short_retried(
        self,
        job_id: UUID,
        project_id: str,
        seq: int,
        kind: str,
        routing_key: str,
        chain: Chain | None = None,
        *,
        sent: int | None = None,
        workflow: UUID | None = None,
    ) -> StepResult:
        """A lost connection before the unit's commit runs it again (nothing of it committed);
        one cut off during the commit goes the two-commit way, whose claim says what is true
        (taken again when it did not land, a miss when it did)."""
        try:
            return retrying(
                lambda: self._run_short(
                    job_id, project_id, seq, kind, routing_key, chain, sent=sent, workflow=workflow
                ),
                what="a short step",
                idempotent=False,
            )
        except CommitUnknown:
            log.warning("job %s: the short step's commit was cut off; claiming it again", job_id)
            return self._run(job_id, project_id, seq, kind, routing_key, 0, False)

    def _short(self, kind: str) -> bool:
        return kind == TIMER_KIND or isinstance(self._handlers.get(kind), Short)

    def _run_short(
        self,
        job_id: UUID,
        project_id: str,
        seq: int,
        kind: str,
        routing_key: str,
        chain: Chain | None = None,
        *,
        sent: int | None = None,
        workflow: UUID | None = None,
    ) -> StepResult:
        """A short step's first delivery: the fenced claim, the handler and the settle in one
        unit of work, one commit. The claim is never committed on its own, so no heartbeat
        is needed (the row lock holds the job), and a crash before the commit leaves the job
        as it was at this generation: the broker redelivers the pointer, and a redelivery runs
        on the two-commit path, whose committed claim counts the attempt (poison stays
        bounded). A workflow's step locks its workflow first (the store's lock order).

        ``sent``: the outbox row of this pointer, when a chain kept it from the relay
        (``actors.in_place``): marked sent in this unit, claim or miss. With ``chain``, the
        first job the settle releases that the chain may run is held for it. ``workflow``: the
        job's workflow as its pointer names it (:meth:`run`)."""
        self._reached(CrashPoint.BEFORE_CLAIM, job_id, seq, 0)
        handled = _Handled()
        step = (job_id, project_id, seq, kind, routing_key, chain, sent, workflow, handled)
        try:
            try:  # the decision without a savepoint: one statement fewer a step
                return self._run_short_unit(*step, savepoint=False)
            except DecisionFailed:  # rolled back: the settle again, where a failure blocks
                log.warning("job %s: its workflow's decision failed; settling it again", job_id)
                return self._run_short_unit(*step, savepoint=True)
        except SettleRefused:  # nothing committed: the job is as it was, its row unsent
            log.exception("job %s: the settle of its claim refused; rolled back", job_id)
            return self._record(StepResult.STALE)

    def _run_short_unit(
        self,
        job_id: UUID,
        project_id: str,
        seq: int,
        kind: str,
        routing_key: str,
        chain: Chain | None,
        sent: int | None,
        hint: UUID | None,
        handled: _Handled,
        *,
        savepoint: bool,
    ) -> StepResult:
        """``handled``: the handler's outcome, once it ran (a unit rolled back by a failed
        decision is settled again without running the handler twice)."""
        with self._jobs.units.begin() as unit:
            locked = (
                None
                if self._workflows is None
                else self._workflows.lock_of_job_txn(unit, job_id, workflow=hint)
            )
            job = self._records.claim_pointer_txn(
                unit,
                job_id=job_id,
                project_id=project_id,
                seq=seq,
                owner=self._owner,
                sent=sent,
                locked=True,  # settled in this unit: the row is written once, by the settle
            )
            workflow = None if locked is None else locked()
            if job is None:
                missed = True
            elif _died_with_its_process(job):
                missed, result = False, self._alone_next_txn(unit, job)
            else:
                missed, outcome = False, handled.outcome
                if outcome is None:
                    outcome = handled.outcome = self._handle(job)
                    self._reached(CrashPoint.AFTER_WORK, job.id, seq, job.attempts)
                if chain is not None:  # the job the settle dispatches first, chosen at its insert
                    unit.hold_next(chain.taker(unit, job.id, self._short))
                result = self._settle_txn(unit, job, outcome, workflow, savepoint=savepoint)
                if (
                    chain is not None
                    and not unit.holds
                    and (row := chain.pick(unit.pointers, job.id, self._short)) is not None
                ):
                    unit.hold(row)  # one released otherwise (a dependent): held by an UPDATE
        if chain is not None and unit.held is not None:
            chain.keep(unit.held)
        if missed or job is None:
            return self._record(self._missed(job_id, project_id, seq, kind, routing_key))
        self._record(result)
        self._reached(CrashPoint.AFTER_SETTLE, job.id, seq, job.attempts)
        return result

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
        try:
            job = self._records.claim_pointer(
                job_id=job_id, project_id=project_id, seq=seq, owner=self._owner
            )
        except CommitUnknown:
            job = outage.adopt_claim(self._jobs, job_id=job_id, seq=seq, owner=self._owner)
        if job is None:
            return self._record(self._missed(job_id, project_id, seq, kind, routing_key))
        if not solo and _died_with_its_process(job):
            return self._record(self._run_alone_next(job))
        with self._heartbeats.holding(job):
            outcome = self._handle(job)
        self._reached(CrashPoint.AFTER_WORK, job.id, seq, job.attempts)
        result = self._settle(job, outcome)
        self._record(result)
        self._reached(CrashPoint.AFTER_SETTLE, job.id, seq, job.attempts)
        return result

    def run_claimed(self, job: Job) -> StepResult:
        """A job this process already leased (the postgres backend's claim): the handler
        under a heartbeat, then the one settle, as for a pointer's claim."""
        with self._heartbeats.holding(job):
            outcome = self._handle(job)
        self._reached(CrashPoint.AFTER_WORK, job.id, 0, job.attempts)
        result = self._record(self._settle(job, outcome))
        self._reached(CrashPoint.AFTER_SETTLE, job.id, 0, job.attempts)
        return result

    def _run_alone_next(self, job: Job) -> StepResult:
        """Hand the job back (the claim's attempt refunded) for a solo run."""

        def defer() -> StepResult:
            with self._jobs.units.begin(one_statement=True) as unit:
                return self._alone_next_txn(unit, job)

        result = outage.settle_resolved(self._jobs, job, StepResult.DEFERRED, defer)
        return StepResult(result or StepResult.STALE)

    def _alone_next_txn(self, unit: UnitOfWork, job: Job) -> StepResult:
        settled = self._jobs.defer_txn(
            unit,
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
        except DatabaseUnavailable as exc:  # not the step's fault: no attempt spent on it
            log.warning("handler for %s on job %s: %s; deferred", job.kind, job.id, exc)
            return Defer(delay=self._tiers.smallest, reason=f"PostgreSQL did not answer: {exc}")
        except Exception as exc:
            log.exception("handler for %s failed on job %s", job.kind, job.id)
            return Failure(FailureClass.VIBEY, f"{type(exc).__name__}: {exc}"[:2000])

    def _settle(self, job: Job, outcome: Outcome) -> StepResult:
        """The settle as one store call in a unit of work of its own, with a commit cut off
        mid-flight resolved by reading the row (``actors.outage``)."""
        label = _LABELS[type(outcome)]
        write = self._workflows.settle if self._workflows is not None else self._settle_plain
        result = outage.settle_resolved(
            self._jobs, job, label, lambda: self._applied(job, label, write(job, outcome))
        )
        return StepResult(result or StepResult.STALE)

    def _settle_plain(self, job: Job, outcome: Outcome) -> Settled:
        return settle(self._jobs, job, outcome)

    def _settle_txn(
        self,
        unit: UnitOfWork,
        job: Job,
        outcome: Outcome,
        workflow: Workflow | None,
        *,
        savepoint: bool = True,
    ) -> StepResult:
        """The settle as one store call in the caller's unit of work (the short path's)."""
        if self._workflows is not None:
            settled = self._workflows.settle_txn(
                unit, job, outcome, locked=workflow, claimed=True, savepoint=savepoint
            )
        else:
            settled = settle_txn(self._jobs, unit, job, outcome)
        return self._applied(job, _LABELS[type(outcome)], settled)

    def _applied(self, job: Job, label: StepResult, settled: Settled) -> StepResult:
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


# What each outcome is called once its settle applied (outage.settle_resolved's label).
_LABELS: dict[type[Outcome], StepResult] = {
    Success: StepResult.SUCCEEDED,
    Failure: StepResult.FAILED,
    Defer: StepResult.DEFERRED,
    Park: StepResult.PARKED,
}


def _uuid_or_none(text: str | None) -> UUID | None:
    """A pointer's hint as a UUID; None when absent or not one (a hint is never trusted for
    more than a read it may spare)."""
    if text is None:
        return None
    try:
        return UUID(text)
    except ValueError:
        return None
