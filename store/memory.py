"""In-memory fakes beside the store's seams, as Dramatiq ships ``StubBroker`` beside its
broker: the step runner, the handlers and the handoff flow run on them in unit tests, with no
PostgreSQL.

:class:`MemoryJobRepository` implements :class:`store.ports.SettlingJobRepository` (the
:class:`workflows.queue.JobRepository` contract and the ``*_txn`` settles) with the arithmetic
of ``store/sql/jobs.sql``: fenced writes, attempts counted by claims and given back by defers,
backoff on a nack, dependencies, gates and the reaper, and what a gate writes beside it (the
``gate.opened`` domain event and the ledger's ``QuestionAsked``; an answer's ``AnswerGiven``),
kept in :attr:`MemoryJobRepository.ledger` and :attr:`MemoryJobRepository.events`. Its clock
is a function (``clock``; a :class:`ManualClock` a test moves instead of sleeping). With
``dispatch`` on it numbers dispatch generations and hands each unit's pointers to
``after_commit``, as the real units do. The fakes of the smaller seams (pointer claims, a
workflow step's settle, what the handlers read) are in :mod:`store.memory_records`.

A unit of work is all or nothing here too: an exception inside ``units.begin()`` restores what
the repository held when the unit began. The contract suite (``tests/contracts``) runs on this
fake beside the real backends, so where the fake and the SQL disagree, a test says so.

This module is past 600 lines because it mirrors the job repository's statements one method
each, as ``store/jobs.py`` does; splitting it would split one contract in two.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

from store.db import Conn
from store.unit_of_work import OutboxRow, Publish, UnitOfWork
from workflows.events import EventType
from workflows.gates import ENGINE_GATES
from workflows.job import (
    DEFAULT_BACKOFF,
    BackoffPolicy,
    FailureClass,
    JobState,
    LeasePolicy,
    backoff,
    jitter_fraction,
)
from workflows.ledger import NewEvent, job_gate_answered, job_gate_asked
from workflows.queue import (
    DELIVERY_EXHAUSTED,
    DELIVERY_EXHAUSTED_PROMPT,
    NOT_APPLIED,
    AnswerOutcome,
    AnswerStatus,
    Enqueued,
    EnqueueRequest,
    Gate,
    GateRequest,
    Job,
    JsonObject,
    Lease,
    ReapResult,
    Settled,
    UnknownDependencyError,
)

Clock = Callable[[], datetime]
_UNSETTLED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class _Detached:
    """The connection of a memory unit: there is none, and using one is a test's mistake."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"an in-memory unit of work has no database connection ({name})")


DETACHED = cast(Conn, _Detached())


def system_clock() -> datetime:
    return datetime.now(UTC)


class ManualClock:
    """A clock a test moves: ``clock.advance(seconds=30)``."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A ledger event the fake appended for a job (``ledger_event``'s kind and payload)."""

    job_id: UUID
    kind: str
    payload: JsonObject


@dataclass(frozen=True, slots=True)
class EventEntry:
    """A domain event the fake emitted (``domain_event``'s type and payload)."""

    type: str
    payload: JsonObject


@dataclass
class _State:
    jobs: dict[UUID, Job] = field(default_factory=dict)
    deps: dict[UUID, tuple[UUID, ...]] = field(default_factory=dict)
    keys: dict[tuple[str, str], UUID] = field(default_factory=dict)
    gates: dict[UUID, Gate] = field(default_factory=dict)
    ledger: list[LedgerEntry] = field(default_factory=list)
    events: list[EventEntry] = field(default_factory=list)


class MemoryUnits:
    """Units of work on a :class:`MemoryJobRepository` (see the module docstring)."""

    def __init__(self, repo: MemoryJobRepository, publish: Publish | None) -> None:
        self._repo = repo
        self._publish = publish

    @contextmanager
    def begin(self, *, one_statement: bool = False) -> Iterator[UnitOfWork]:
        with self._repo.lock:
            kept = copy.copy(self._repo.state)
            kept.jobs, kept.deps = dict(kept.jobs), dict(kept.deps)
            kept.keys, kept.gates = dict(kept.keys), dict(kept.gates)
            kept.ledger, kept.events = list(kept.ledger), list(kept.events)
            unit = UnitOfWork(DETACHED)
            try:
                yield unit
            except BaseException:
                self._repo.state = kept
                raise
        self._repo.commits += 1
        if unit.pointers and self._publish is not None:
            self._publish(unit.pointers)


class MemoryJobRepository:
    """The job-queue contract in memory (see the module docstring)."""

    def __init__(
        self,
        *,
        clock: Clock = system_clock,
        leases: LeasePolicy | None = None,
        backoff_policy: BackoffPolicy = DEFAULT_BACKOFF,
        dispatch: bool = False,
        after_commit: Publish | None = None,
    ) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.state = _State()
        self.commits = 0
        self._leases = leases or LeasePolicy()
        self._backoff = backoff_policy
        self._dispatch = dispatch
        self._outbox_ids = iter(range(1, 2**62))
        self.units = MemoryUnits(self, after_commit)

    @property
    def dispatching(self) -> bool:
        return self._dispatch

    @property
    def ledger(self) -> tuple[LedgerEntry, ...]:
        """The ledger events appended, in order."""
        return tuple(self.state.ledger)

    @property
    def events(self) -> tuple[EventEntry, ...]:
        """The domain events emitted, in order."""
        return tuple(self.state.events)

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(self, request: EnqueueRequest) -> Enqueued:
        return self.enqueue_batch([request])[0]

    def enqueue_batch(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        with self.units.begin() as unit:
            return self.enqueue_batch_txn(unit, requests)

    def enqueue_txn(self, unit: UnitOfWork, request: EnqueueRequest) -> Enqueued:
        return self.enqueue_batch_txn(unit, [request])[0]

    def enqueue_batch_txn(
        self, unit: UnitOfWork, requests: Sequence[EnqueueRequest]
    ) -> list[Enqueued]:
        resolved: dict[UUID, UUID] = {}
        results = []
        for request in requests:
            enqueued = self._enqueue_one(unit, request, resolved)
            if request.job_id is not None:
                resolved[request.job_id] = enqueued.job.id
            results.append(enqueued)
        return results

    def _enqueue_one(
        self, unit: UnitOfWork, request: EnqueueRequest, resolved: Mapping[UUID, UUID]
    ) -> Enqueued:
        state = self.state
        depends_on = tuple(resolved.get(dep, dep) for dep in request.depends_on)
        missing = [
            d
            for d in depends_on
            if d not in state.jobs or state.jobs[d].project_id != request.project_id
        ]
        if missing:
            raise UnknownDependencyError(missing)
        existing = state.keys.get((request.project_id, request.idempotency_key))
        if existing is not None:
            return Enqueued(state.jobs[existing], created=False)
        now = self.clock()
        job = Job(
            id=request.job_id or uuid.uuid4(),
            project_id=request.project_id,
            cycle=request.cycle,
            kind=request.kind,
            subject=request.subject,
            idempotency_key=request.idempotency_key,
            state=JobState.READY,
            priority=request.priority,
            payload=dict(request.payload),
            result=None,
            run_after=now + request.delay,
            attempts=0,
            max_attempts=request.max_attempts,
            lease_timeout=self._leases.lease_for(request.kind, request.lease),
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            engine_id=None,
            last_error=None,
            failure_class=None,
            created_at=now,
            updated_at=now,
            settled_at=None,
            workflow_id=request.workflow_id,
            step=request.step,
        )
        state.jobs[job.id] = job
        state.deps[job.id] = depends_on
        state.keys[(job.project_id, job.idempotency_key)] = job.id
        if not depends_on:
            job = self._next_generation(unit, job)
        return Enqueued(job, created=True)

    def _next_generation(self, unit: UnitOfWork, job: Job, *, solo: bool = False) -> Job:
        """A new dispatch episode (dispatching only): the next generation and its pointer."""
        if not self._dispatch:
            return job
        job = self._put(replace(job, dispatch_seq=job.dispatch_seq + 1))
        pointer = OutboxRow(
            id=next(self._outbox_ids),
            key=f"dispatch:{job.id}:{job.dispatch_seq}",
            job_id=job.id,
            project_id=job.project_id,
            dispatch_seq=job.dispatch_seq,
            kind=job.kind,
            not_before=job.run_after,
            solo=solo,
            priority=job.priority,  # as the outbox trigger copies them (0010_project_routes)
            workflow_id=job.workflow_id,
        )
        unit.wrote([asdict(pointer)])
        return job

    # -- claims and fenced writes ----------------------------------------------------------

    def claimable(self, job: Job, now: datetime) -> bool:
        """Ready (or awaiting capacity), due, and every dependency succeeded."""
        return (
            job.state in (JobState.READY, JobState.AWAITING_CAPACITY)
            and job.run_after <= now
            and self.deps_met(job.id)
        )

    def deps_met(self, job_id: UUID) -> bool:
        jobs = self.state.jobs
        return all(jobs[d].state is JobState.SUCCEEDED for d in self.state.deps.get(job_id, ()))

    def claim(
        self, project_id: str, *, owner: str, limit: int = 1, kinds: Collection[str] | None = None
    ) -> list[Job]:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        with self.units.begin(one_statement=True):
            now = self.clock()
            ready = [
                j
                for j in self.state.jobs.values()
                if j.project_id == project_id
                and (kinds is None or j.kind in kinds)
                and self.claimable(j, now)
            ]
            ready.sort(key=lambda j: (-j.priority, j.run_after, j.id))
            return [self.lease_to(j, owner, now) for j in ready[:limit]]

    def lease_to(self, job: Job, owner: str, now: datetime) -> Job:
        """Lease ``job`` to ``owner`` under a new token (the claim's arithmetic)."""
        took_over = job.state is JobState.LEASED
        return self._put(
            replace(
                job,
                state=JobState.LEASED,
                attempts=job.attempts + 1,
                last_error=(
                    f"lease expired on attempt {job.attempts} of {job.max_attempts}"
                    if took_over
                    else job.last_error
                ),
                lease_expired=job.lease_expired or took_over,
                lease_owner=owner,
                lease_token=uuid.uuid4(),
                lease_expires_at=now + job.lease_timeout,
                updated_at=now,
            )
        )

    def _fenced(self, lease: Lease) -> Job | None:
        job = self.state.jobs.get(lease.job_id)
        if (
            job is None
            or job.state is not JobState.LEASED
            or job.lease_owner != lease.owner
            or job.lease_token != lease.token
            or job.lease_expires_at is None
            or job.lease_expires_at <= self.clock()
        ):
            return None
        return job

    def _put(self, job: Job) -> Job:
        self.state.jobs[job.id] = job
        return job

    def _released(self, job: Job, **changes: Any) -> Job:
        return replace(
            job,
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            updated_at=self.clock(),
            **changes,
        )

    def heartbeat(self, lease: Lease) -> Settled:
        with self.lock:
            job = self._fenced(lease)
            if job is None:
                return NOT_APPLIED
            expires = self.clock() + job.lease_timeout
            self._put(replace(job, lease_expires_at=expires, updated_at=self.clock()))
            return Settled(True, JobState.LEASED, lease_expires_at=expires)

    def ack(self, lease: Lease, *, result: JsonObject | None = None) -> Settled:
        with self.units.begin() as unit:
            return self.ack_txn(unit, lease, result=result)

    def ack_txn(
        self, unit: UnitOfWork, lease: Lease, *, result: JsonObject | None = None
    ) -> Settled:
        job = self._fenced(lease)
        if job is None:
            return NOT_APPLIED
        done = self._released(
            job,
            state=JobState.SUCCEEDED,
            result=None if result is None else dict(result),
            settled_at=self.clock(),
            last_error=None,
            failure_class=None,
            lease_expired=False,
        )
        self._put(done)
        for dependent, deps in self.state.deps.items():
            if job.id in deps and self.deps_met(dependent):
                waiting = self.state.jobs[dependent]
                if waiting.state is JobState.READY and waiting.dispatch_seq == 0:
                    self._next_generation(unit, waiting)
        return Settled(True, JobState.SUCCEEDED)

    def nack(
        self,
        lease: Lease,
        *,
        error: str,
        failure_class: FailureClass,
        retry_in: timedelta | None = None,
    ) -> Settled:
        with self.units.begin(one_statement=True) as unit:
            return self.nack_txn(
                unit, lease, error=error, failure_class=failure_class, retry_in=retry_in
            )

    def nack_txn(
        self,
        unit: UnitOfWork,
        lease: Lease,
        *,
        error: str,
        failure_class: FailureClass,
        retry_in: timedelta | None = None,
    ) -> Settled:
        job = self._fenced(lease)
        if job is None:
            return NOT_APPLIED
        if retry_in is None:
            attempt = max(lease.attempt, 1)
            retry_in = backoff(
                attempt, self._backoff, spread=jitter_fraction(lease.job_id, attempt)
            )
        spent = job.attempts >= job.max_attempts
        now = self.clock()
        settled = self._put(
            self._released(
                job,
                state=JobState.FAILED if spent else JobState.READY,
                run_after=job.run_after if spent else now + retry_in,
                settled_at=now if spent else None,
                last_error=error,
                failure_class=failure_class,
                lease_expired=False,
            )
        )
        if not spent:
            self._next_generation(unit, settled)
        return Settled(True, settled.state)

    def defer(
        self,
        lease: Lease,
        *,
        delay: timedelta,
        reason: str,
        capacity: bool = False,
        solo: bool = False,
    ) -> Settled:
        with self.units.begin(one_statement=True) as unit:
            return self.defer_txn(
                unit, lease, delay=delay, reason=reason, capacity=capacity, solo=solo
            )

    def defer_txn(
        self,
        unit: UnitOfWork,
        lease: Lease,
        *,
        delay: timedelta,
        reason: str,
        capacity: bool = False,
        solo: bool = False,
    ) -> Settled:
        job = self._fenced(lease)
        if job is None:
            return NOT_APPLIED
        settled = self._put(
            self._released(
                job,
                state=JobState.AWAITING_CAPACITY if capacity else JobState.READY,
                attempts=job.attempts - 1,  # a defer gives back the attempt its claim counted
                run_after=self.clock() + max(delay, timedelta(0)),
                last_error=reason,
                lease_expired=False,
                failure_class=FailureClass.CAPACITY if capacity else None,
            )
        )
        self._next_generation(unit, settled, solo=solo)
        return Settled(True, settled.state)

    def park(self, lease: Lease, gate: GateRequest) -> Settled:
        with self.units.begin() as unit:
            return self.park_txn(unit, lease, gate)

    def park_txn(self, unit: UnitOfWork, lease: Lease, gate: GateRequest) -> Settled:
        job = self._fenced(lease)
        if job is None:
            return NOT_APPLIED
        self._put(self._released(job, state=JobState.AWAITING_HUMAN))
        opened = self._open_gate(
            job,
            gate.kind,
            gate.prompt,
            answers=gate.answers,
            context=gate.context,
            schema=gate.schema,
        )
        return Settled(True, JobState.AWAITING_HUMAN, gate_id=opened.id)

    def _open_gate(
        self,
        job: Job,
        kind: str,
        prompt: str,
        *,
        answers: tuple[str, ...] = (),
        context: JsonObject | None = None,
        schema: JsonObject | None = None,
    ) -> Gate:
        gate = Gate(
            id=uuid.uuid4(),
            project_id=job.project_id,
            job_id=job.id,
            kind=kind,
            prompt=prompt,
            answers=tuple(answers),
            context=dict(context or {}),
            opened_at=self.clock(),
            answer=None,
            answered_by=None,
            answered_at=None,
            workflow_id=job.workflow_id,
            schema=dict(schema or {}),
        )
        self.state.gates[gate.id] = gate
        opened = {
            "gate_id": str(gate.id),
            "gate": None,
            "kind": kind,
            "question": prompt,
            "answers": list(answers),
            "job_id": str(job.id),
            "deadline_at": None,
            "on_deadline": None,
        }
        self.state.events.append(EventEntry(EventType.GATE_OPENED.value, opened))
        self._ledgered(job.id, job_gate_asked(gate.id, kind, prompt, answers, job.id))
        return gate

    def _ledgered(self, job_id: UUID, event: NewEvent) -> None:
        self.state.ledger.append(LedgerEntry(job_id, event.kind.value, dict(event.payload)))

    def grant(self, lease: Lease, *, max_attempts: int) -> Settled:
        with self.lock:
            job = self._fenced(lease)
            if job is None or job.max_attempts >= max_attempts:
                return NOT_APPLIED
            self._put(replace(job, max_attempts=max_attempts, updated_at=self.clock()))
            return Settled(True, JobState.LEASED)

    def assign(self, lease: Lease, *, engine_id: str) -> Settled:
        with self.lock:
            job = self._fenced(lease)
            if job is None:
                return NOT_APPLIED
            self._put(replace(job, engine_id=engine_id, updated_at=self.clock()))
            return Settled(True, JobState.LEASED)

    # -- gates and the reaper --------------------------------------------------------------

    def answer_gate(
        self, gate_id: UUID, *, answer: str, answered_by: str, grant_attempts: int = 0
    ) -> AnswerOutcome:
        with self.units.begin() as unit:
            return self.answer_gate_txn(
                unit, gate_id, answer=answer, answered_by=answered_by, grant_attempts=grant_attempts
            )

    def answer_gate_txn(
        self,
        unit: UnitOfWork,
        gate_id: UUID,
        *,
        answer: str,
        answered_by: str,
        grant_attempts: int = 0,
    ) -> AnswerOutcome:
        if grant_attempts < 0:
            raise ValueError("grant_attempts must not be negative")
        gate = self.state.gates.get(gate_id)
        if gate is None:
            return AnswerOutcome(AnswerStatus.UNKNOWN_GATE)
        if not gate.open:
            return AnswerOutcome(AnswerStatus.ALREADY_ANSWERED, gate)
        if ENGINE_GATES.problem(gate.kind, answer, answers=gate.answers, schema=gate.schema):
            return AnswerOutcome(AnswerStatus.INVALID_ANSWER, gate)
        answered = replace(gate, answer=answer, answered_by=answered_by, answered_at=self.clock())
        self.state.gates[gate_id] = answered
        if gate.job_id is not None:
            self._ledgered(gate.job_id, job_gate_answered(gate_id, answer, answered_by))
        job = None if gate.job_id is None else self.state.jobs.get(gate.job_id)
        if job is not None and job.state is JobState.AWAITING_HUMAN:
            kind = ENGINE_GATES.get(gate.kind)
            more = (0 if kind is None else kind.attempts_granted(answer)) + grant_attempts
            released = self._put(
                replace(
                    job,
                    state=JobState.READY,
                    run_after=self.clock(),
                    updated_at=self.clock(),
                    max_attempts=max(job.max_attempts, job.attempts + more),
                )
            )
            self._next_generation(unit, released)
        return AnswerOutcome(AnswerStatus.ANSWERED, answered)

    def reap(self) -> ReapResult:
        requeued = parked = 0
        with self.units.begin(one_statement=True) as unit:
            now = self.clock()
            expired = [
                j
                for j in self.state.jobs.values()
                if j.state is JobState.LEASED
                and j.lease_expires_at is not None
                and j.lease_expires_at <= now
            ]
            for job in expired:
                exhausted = job.attempts >= job.max_attempts
                back = self._put(
                    self._released(
                        job,
                        state=JobState.AWAITING_HUMAN if exhausted else JobState.READY,
                        last_error=f"lease expired on attempt {job.attempts} of {job.max_attempts}",
                        lease_expired=True,
                    )
                )
                if exhausted:
                    parked += 1
                    context = {"attempts": job.attempts}
                    self._open_gate(
                        back, DELIVERY_EXHAUSTED, DELIVERY_EXHAUSTED_PROMPT, context=context
                    )
                else:
                    requeued += 1
                    self._next_generation(unit, back, solo=True)
        return ReapResult(requeued=requeued, parked=parked)

    # -- reads -----------------------------------------------------------------------------

    def get(self, job_id: UUID) -> Job | None:
        return self.state.jobs.get(job_id)

    def get_gate(self, gate_id: UUID) -> Gate | None:
        return self.state.gates.get(gate_id)

    def gates_of(self, job_id: UUID) -> list[Gate]:
        """The job's gates, oldest first."""
        gates = [g for g in self.state.gates.values() if g.job_id == job_id]
        return sorted(gates, key=lambda g: g.opened_at)

    def open_gates(self, project_id: str | None = None) -> list[Gate]:
        gates = [
            g
            for g in self.state.gates.values()
            if g.open and (project_id is None or g.project_id == project_id)
        ]
        return sorted(gates, key=lambda g: (g.opened_at, g.id))

    def count_unsettled(
        self,
        project_id: str,
        *,
        cycle: int | None = None,
        kinds: Collection[str] | None = None,
        exclude: UUID | None = None,
    ) -> int:
        return sum(
            1
            for j in self.state.jobs.values()
            if j.project_id == project_id
            and j.state not in _UNSETTLED
            and (cycle is None or j.cycle == cycle)
            and (kinds is None or j.kind in kinds)
            and j.id != exclude
        )

    def queue_depth(self, project_id: str) -> Mapping[JobState, int]:
        depth = dict.fromkeys(JobState, 0)
        for job in self.state.jobs.values():
            if job.project_id == project_id:
                depth[job.state] += 1
        return depth

    def list_for_cycle(self, project_id: str, cycle: int) -> list[Job]:
        jobs = [
            j for j in self.state.jobs.values() if (j.project_id, j.cycle) == (project_id, cycle)
        ]
        return sorted(jobs, key=lambda j: (j.created_at, j.id))
