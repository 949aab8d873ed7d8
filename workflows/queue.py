"""The job-queue contract: what every queue backend promises, as a Protocol and its values.

Two backends implement :class:`JobRepository` (PostgreSQL now, RabbitMQ dispatch next); one
contract suite (``tests/contracts/test_job_queue_contract.py``) runs against each.

The promises:

* **Idempotent enqueue.** ``(project_id, idempotency_key)`` is unique for all time; enqueueing
  the same logical work again returns the existing job (``Enqueued.created`` is false).
* **Dependencies form a DAG.** A job is not claimable until every job it depends on has
  succeeded. A dependency must already exist (or come earlier in the same batch); an unknown
  one raises :class:`UnknownDependencyError` and nothing is written.
* **Fenced settles.** Every write made on behalf of a claim (heartbeat, ack, nack, defer, park,
  grant, assign) names its :class:`Lease` (owner plus a token minted per grant). A lease that
  expired by the store's clock, or was taken over, makes the write a no-op that returns
  ``Settled(applied=False)``; it never raises and never applies.
* **Bounded delivery.** A claim counts an attempt. An expired lease is returned to ready by
  ``reap()``, unless its attempts reached ``max_attempts``: then the job parks behind a
  ``delivery_exhausted`` gate, and each answer to that gate buys exactly one more attempt.

Exceptions::

    QueueError
    ├── UnknownDependencyError   a dependency id that does not exist in the project
    └── InvalidEnqueueError      a request that cannot be a job (bad values, unknown kind)
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from workflows.gates import DELIVERY_EXHAUSTED as DELIVERY_EXHAUSTED_GATE
from workflows.job import FailureClass, JobState, idempotency_key, valid_kind_name

DELIVERY_EXHAUSTED = DELIVERY_EXHAUSTED_GATE.name
DELIVERY_EXHAUSTED_PROMPT = (
    "This job's lease expired on every one of its attempts (its worker died or stalled each "
    "time). Answer anything to retry it with one more attempt."
)

JsonObject = Mapping[str, Any]


class QueueError(Exception):
    """Root of the queue contract's errors."""


class UnknownDependencyError(QueueError):
    def __init__(self, missing: Collection[UUID]) -> None:
        ids = ", ".join(sorted(str(m) for m in missing))
        super().__init__(f"unknown dependency job id(s): {ids}; nothing was enqueued")
        self.missing = frozenset(missing)


class InvalidEnqueueError(QueueError):
    pass


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """A job to create. ``job_id`` may be chosen by the caller so that later requests in the
    same batch can depend on it; when the request turns out to be a duplicate, the existing
    job's id stands in for it."""

    project_id: str
    kind: str
    subject: str = ""
    cycle: int = 0
    payload: JsonObject = field(default_factory=dict)
    priority: int = 0
    delay: timedelta = timedelta(0)
    depends_on: tuple[UUID, ...] = ()
    max_attempts: int = 5
    job_id: UUID | None = None
    workflow_id: UUID | None = None  # a workflow's step: the workflow and the step's name
    step: str | None = None
    lease: timedelta | None = None  # the kind's declared lease (None: the policy's default)

    def __post_init__(self) -> None:
        if (self.workflow_id is None) != (self.step is None):
            raise InvalidEnqueueError("a workflow step names both its workflow and its step")
        if not self.project_id:
            raise InvalidEnqueueError("project_id must not be empty")
        if not valid_kind_name(self.kind):
            raise InvalidEnqueueError(
                f"{self.kind!r} is not a kind name: dot-separated lowercase words such as "
                "'review.triage'"
            )
        if self.lease is not None and self.lease <= timedelta(0):
            raise InvalidEnqueueError("a declared lease must be positive")
        if self.max_attempts < 1:
            raise InvalidEnqueueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.delay < timedelta(0):
            raise InvalidEnqueueError("delay must not be negative")
        if self.cycle < 0:
            raise InvalidEnqueueError("cycle must not be negative")
        if self.job_id is not None and self.job_id in self.depends_on:
            raise InvalidEnqueueError("a job cannot depend on itself")

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.project_id, self.cycle, self.kind, self.subject)


@dataclass(frozen=True, slots=True)
class Lease:
    """The fence every settling write names: who holds the job, under which grant.

    ``attempt`` is the job's attempt count as of this grant (it sizes a nack's backoff);
    it is not part of the fence."""

    job_id: UUID
    owner: str
    token: UUID
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class Job:
    id: UUID
    project_id: str
    cycle: int
    kind: str
    subject: str
    idempotency_key: str
    state: JobState
    priority: int
    payload: JsonObject
    result: JsonObject | None
    run_after: datetime
    attempts: int
    max_attempts: int
    lease_timeout: timedelta
    lease_owner: str | None
    lease_token: UUID | None
    lease_expires_at: datetime | None
    engine_id: str | None
    last_error: str | None
    failure_class: FailureClass | None
    created_at: datetime
    updated_at: datetime
    settled_at: datetime | None
    dispatch_seq: int = 0
    workflow_id: UUID | None = None
    step: str | None = None
    lease_expired: bool = False  # its previous attempt's lease expired (its worker died)

    @property
    def lease(self) -> Lease:
        if self.lease_owner is None or self.lease_token is None:
            raise ValueError(f"job {self.id} holds no lease (state {self.state})")
        return Lease(
            job_id=self.id, owner=self.lease_owner, token=self.lease_token, attempt=self.attempts
        )


@dataclass(frozen=True, slots=True)
class Enqueued:
    job: Job
    created: bool


@dataclass(frozen=True, slots=True)
class Settled:
    """The result of a fenced write. ``applied`` is false when the lease was lost."""

    applied: bool
    state: JobState | None = None
    gate_id: UUID | None = None
    lease_expires_at: datetime | None = None


NOT_APPLIED = Settled(applied=False)


@dataclass(frozen=True, slots=True)
class GateRequest:
    """What a parked job asks a person. ``answers`` empty means ``schema`` decides (see
    ``workflows.engine.check_answer``); both empty accept any answer."""

    kind: str
    prompt: str
    answers: tuple[str, ...] = ()
    context: JsonObject = field(default_factory=dict)
    schema: JsonObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Gate:
    id: UUID
    project_id: str
    job_id: UUID | None
    kind: str
    prompt: str
    answers: tuple[str, ...]
    context: JsonObject
    opened_at: datetime
    answer: str | None
    answered_by: str | None
    answered_at: datetime | None
    workflow_id: UUID | None = None
    name: str | None = None  # a workflow's gate (answering it is a GateAnswered event)
    schema: JsonObject = field(default_factory=dict)
    evidence: JsonObject = field(default_factory=dict)
    deadline_at: datetime | None = None  # a workflow gate's deadline (OpenGate.deadline)
    on_deadline: str | None = None  # answer | escalate | fail
    default_answer: str | None = None
    answer_source: str | None = None  # person | default | closed (None: before 0011)

    @property
    def open(self) -> bool:
        return self.answered_at is None


class AnswerStatus(enum.StrEnum):
    ANSWERED = "answered"
    ALREADY_ANSWERED = "already_answered"
    INVALID_ANSWER = "invalid_answer"
    UNKNOWN_GATE = "unknown_gate"
    NOT_OPEN = "not_open"  # answered by name before the workflow asked: nothing recorded


@dataclass(frozen=True, slots=True)
class AnswerOutcome:
    status: AnswerStatus
    gate: Gate | None = None

    @property
    def applied(self) -> bool:
        return self.status is AnswerStatus.ANSWERED


@dataclass(frozen=True, slots=True)
class ReapResult:
    requeued: int
    parked: int


class JobRepository(Protocol):
    """The queue contract. See the module docstring for the promises each method keeps."""

    def enqueue(self, request: EnqueueRequest) -> Enqueued: ...

    def enqueue_batch(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        """All or nothing, in order; a request may depend on an earlier one's ``job_id``."""
        ...

    def claim(
        self, project_id: str, *, owner: str, limit: int = 1, kinds: Collection[str] | None = None
    ) -> list[Job]:
        """Lease up to ``limit`` claimable jobs of one project: highest priority first, then
        earliest ``run_after``, then id. Each claim counts an attempt."""
        ...

    def heartbeat(self, lease: Lease) -> Settled:
        """Extends the lease by the job's lease timeout, measured on the store's clock."""
        ...

    def ack(self, lease: Lease, *, result: JsonObject | None = None) -> Settled: ...

    def nack(
        self,
        lease: Lease,
        *,
        error: str,
        failure_class: FailureClass,
        retry_in: timedelta | None = None,
    ) -> Settled:
        """Back to ready after a backoff (or ``retry_in``); failed once attempts are spent."""
        ...

    def defer(
        self, lease: Lease, *, delay: timedelta, reason: str, capacity: bool = False
    ) -> Settled:
        """Release the lease without burning an attempt; ``capacity`` parks it as
        awaiting_capacity until the delay passes."""
        ...

    def park(self, lease: Lease, gate: GateRequest) -> Settled:
        """awaiting_human behind a new gate row (``Settled.gate_id``)."""
        ...

    def grant(self, lease: Lease, *, max_attempts: int) -> Settled:
        """Widen the job's attempt bound; a value at or below the current bound is a no-op."""
        ...

    def assign(self, lease: Lease, *, engine_id: str) -> Settled:
        """Record which engine this attempt uses."""
        ...

    def answer_gate(
        self, gate_id: UUID, *, answer: str, answered_by: str, grant_attempts: int = 0
    ) -> AnswerOutcome:
        """Answer an open gate and re-ready its parked job. A ``delivery_exhausted`` gate
        refunds exactly one attempt; ``grant_attempts`` adds more."""
        ...

    def reap(self) -> ReapResult:
        """Return expired leases to ready; park those whose attempts are spent."""
        ...

    def get(self, job_id: UUID) -> Job | None: ...

    def get_gate(self, gate_id: UUID) -> Gate | None: ...

    def open_gates(self, project_id: str | None = None) -> list[Gate]: ...

    def count_unsettled(
        self,
        project_id: str,
        *,
        cycle: int | None = None,
        kinds: Collection[str] | None = None,
        exclude: UUID | None = None,
    ) -> int:
        """Jobs not yet succeeded, failed or cancelled (parked jobs count as unsettled)."""
        ...

    def queue_depth(self, project_id: str) -> Mapping[JobState, int]:
        """The number of the project's jobs in each state (every state present, zeros too)."""
        ...

    def list_for_cycle(self, project_id: str, cycle: int) -> list[Job]: ...


class JobReadyNotifier(Protocol):
    """Wakes an idle worker when a job may have become claimable."""

    def wait(self, project_id: str, timeout: float) -> bool:
        """True when woken for ``project_id`` before ``timeout`` seconds passed."""
        ...

    def close(self) -> None: ...
