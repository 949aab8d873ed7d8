"""The contract's driver: the job repository the contract speaks, over the path workers run.

The contract states its promises as :class:`workflows.queue.JobRepository` calls (claim, then
settle). The fleet never calls ``claim`` and ``ack`` like that: a worker takes a job (a
delivered pointer on RabbitMQ, ``store.drive.claim_next`` in the drive loop), hands it to
:class:`actors.steps.StepRunner`, whose handler returns an outcome, and the runner writes the
one settle. This driver keeps the contract's words and runs the fleet's path underneath:

* ``claim(project, owner=…)`` takes jobs the way the backend's workers do and runs each
  through the StepRunner of the worker named ``owner``; the job the handler receives is the
  claim. On RabbitMQ a delivered pointer waits in its step actor until a claim names that
  worker (a worker process has one runner, which takes it at once); the drive loop's
  ``claim_next`` (and the fake's ``claim``) names the owner itself;
* ``ack``/``nack``/``defer``/``park`` with a lease a running step holds become that handler's
  outcome (``Success``/``Failure``/``Defer``/``Park``), and the runner's settle is the answer;
  a lease no running step holds (forged, or already settled) goes to the record store's fenced
  write, as a late or duplicate settle would;
* ``stall(owner)``: that worker's process froze: its heartbeat stops (``StepRunner.close``),
  so its leases run out while its steps still hold them; its owner name's next claim is a
  fresh worker's (a restarted process);
* heartbeats, grants, assignments, gate answers and reads are the record store's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Protocol
from uuid import UUID

from actors.steps import StepResult, StepRunner
from store.ports import SettlingJobRepository
from store.unit_of_work import OutboxRow
from workflows.job import FailureClass, JobState
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import (
    NOT_APPLIED,
    AnswerOutcome,
    Enqueued,
    EnqueueRequest,
    Gate,
    GateRequest,
    Job,
    JsonObject,
    Lease,
    ReapResult,
    Settled,
)
from workflows.steps import Defer, Failure, Handlers, Outcome, Park, Success

STEP_WAIT_S = 15.0  # a step's handler is reached, or its settle done, well within this


class Step:
    """One job on its way through a StepRunner: the handler hands over the job and waits for
    the outcome the test gives; the runner's result comes back when its settle is done."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.job: Job | None = None
        self.result: StepResult | None = None
        self.error: BaseException | None = None
        self._outcome: Outcome | None = None
        self._done = False
        self._changed = threading.Condition()

    # -- in the runner's thread ------------------------------------------------------------

    def handle(self, job: Job) -> Outcome:
        with self._changed:
            self.job = job
            self._changed.notify_all()
            while self._outcome is None:
                self._changed.wait()
            return self._outcome

    def finish(self, result: StepResult | None, error: BaseException | None = None) -> None:
        with self._changed:
            self.result, self.error, self._done = result, error, True
            self._changed.notify_all()

    # -- in the test's thread --------------------------------------------------------------

    def claimed(self) -> Job | None:
        """The job the handler got; None when the runner finished without calling it (a
        missed claim: dropped or re-delayed; or a job handed back to run alone)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.job is not None or self._done, STEP_WAIT_S):
                raise AssertionError(f"a step of worker {self.owner!r} neither ran nor ended")
            self._raise()
            return self.job

    def settle(self, outcome: Outcome) -> StepResult:
        with self._changed:
            if self._outcome is not None:
                raise AssertionError("this step was given its outcome already")
            self._outcome = outcome
            self._changed.notify_all()
            if not self._changed.wait_for(lambda: self._done, STEP_WAIT_S):
                raise AssertionError(f"the settle of job {self.job and self.job.id} never ended")
            self._raise()
            assert self.result is not None
            return self.result

    @property
    def open(self) -> bool:
        """Its handler waits for an outcome."""
        with self._changed:
            return self.job is not None and self._outcome is None and not self._done

    def release(self) -> None:
        """Teardown: an outcome for a handler nobody settled (the database goes anyway)."""
        with self._changed:
            if self._outcome is None:
                self._outcome = Failure(FailureClass.VIBEY, "the contract test ended")
                self._changed.notify_all()

    def wait_done(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._done, timeout)

    def _raise(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the step runner raised: {self.error!r}") from self.error


_current = threading.local()


def _handler(job: Job) -> Outcome:
    step: Step = _current.step
    return step.handle(job)


# One handler for every kind the contract enqueues: the protocol's kinds (their aliases too)
# and one no definition declares. A plain mapping, as a worker's handlers are: the graph's
# step runner (actors.graph.step_runner) instruments each one it is given.
CONTRACT_KINDS = (*STEP_KINDS, *STEP_KINDS.aliases, "orders.charge")
HANDLERS: Handlers = MappingProxyType(dict.fromkeys(CONTRACT_KINDS, _handler))

RunnerFactory = Callable[[str], StepRunner]  # owner -> a worker's StepRunner (HANDLERS)


class Workers:
    """The StepRunners of the workers the contract names, sharing one record store."""

    def __init__(self, jobs: SettlingJobRepository, make_runner: RunnerFactory) -> None:
        self.jobs = jobs
        self._make_runner = make_runner
        self._runners: dict[str, StepRunner] = {}
        self._stalled: list[StepRunner] = []
        self._held: dict[tuple[UUID, UUID, str], Step] = {}
        self._steps: list[Step] = []
        self._lock = threading.Lock()

    def runner(self, owner: str) -> StepRunner:
        with self._lock:
            runner = self._runners.get(owner)
            if runner is None:
                runner = self._runners[owner] = self._make_runner(owner)
            return runner

    def stall(self, owner: str) -> None:
        """The worker's process froze: no more heartbeats for what it holds."""
        with self._lock:
            runner = self._runners.pop(owner, None)
        if runner is not None:
            runner.close()
            self._stalled.append(runner)

    def step(self, owner: str) -> Step:
        step = Step(owner)
        with self._lock:
            self._steps.append(step)
        return step

    def run(self, step: Step, call: Callable[[StepRunner], StepResult]) -> None:
        """Run ``call`` on the worker's runner in this thread, the handler reporting to
        ``step``."""
        _current.step = step
        try:
            result = call(self.runner(step.owner))
        except Exception as exc:  # noqa: BLE001 - the test's thread raises it (Step.claimed)
            step.finish(None, exc)
        else:
            step.finish(result)
        finally:
            _current.step = None

    def run_in_thread(self, step: Step, call: Callable[[StepRunner], StepResult]) -> None:
        threading.Thread(
            target=self.run, args=(step, call), name=f"step-{step.owner}", daemon=True
        ).start()

    def took(self, step: Step) -> Job | None:
        """The job ``step``'s handler got, now held by the test (None: nothing to hold)."""
        job = step.claimed()
        if job is not None:
            assert job.lease_token is not None and job.lease_owner is not None
            with self._lock:
                self._held[(job.id, job.lease_token, job.lease_owner)] = step
        return job

    def settle(self, lease: Lease, outcome: Outcome) -> Settled | None:
        """The settle of the step holding ``lease``; None when no running step holds it."""
        with self._lock:
            step = self._held.pop((lease.job_id, lease.token, lease.owner), None)
        if step is None or not step.open:
            return None
        result = step.settle(outcome)
        return self._settled(lease.job_id, result)

    def _settled(self, job_id: UUID, result: StepResult) -> Settled:
        if result is StepResult.STALE:
            return NOT_APPLIED
        if result not in (
            StepResult.SUCCEEDED,
            StepResult.FAILED,
            StepResult.DEFERRED,
            StepResult.PARKED,
        ):
            raise AssertionError(f"a held step ended {result}")
        job = self.jobs.get(job_id)
        assert job is not None
        gate_id = None
        if result is StepResult.PARKED:
            gates = [g for g in self.jobs.open_gates(job.project_id) if g.job_id == job_id]
            gate_id = gates[-1].id if gates else None
        return Settled(True, job.state, gate_id=gate_id)

    def close(self) -> None:
        with self._lock:
            steps, self._held = list(self._steps), {}
            runners = [*self._runners.values(), *self._stalled]
            self._runners, self._stalled = {}, []
        for step in steps:
            step.release()
        for step in steps:
            step.wait_done(STEP_WAIT_S)
        for runner in runners:
            runner.close()


class Claims(Protocol):
    """How a backend's workers take jobs for the contract's ``claim``."""

    def claim(
        self, project_id: str, *, owner: str, limit: int, kinds: Collection[str] | None
    ) -> list[Job]: ...

    def reap(self) -> ReapResult: ...


class Producer(Protocol):
    def enqueue(self, request: EnqueueRequest) -> Enqueued: ...

    def enqueue_batch(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]: ...


class FleetRepository:
    """:class:`workflows.queue.JobRepository` over a backend's workers (module docstring).

    ``producer`` enqueues (with the lease policy the contract asked for; ``prepare`` adapts
    each request first); every other record-store call goes to ``workers.jobs``, the
    repository the runners settle through."""

    def __init__(
        self,
        *,
        workers: Workers,
        claims: Claims,
        producer: Producer,
        prepare: Callable[[EnqueueRequest], EnqueueRequest] | None = None,
    ) -> None:
        self._workers = workers
        self._claims = claims
        self._producer = producer
        self._jobs = workers.jobs
        self._prepare = prepare

    def enqueue(self, request: EnqueueRequest) -> Enqueued:
        return self._producer.enqueue(self._prepared(request))

    def enqueue_batch(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        return self._producer.enqueue_batch([self._prepared(r) for r in requests])

    def _prepared(self, request: EnqueueRequest) -> EnqueueRequest:
        return request if self._prepare is None else self._prepare(request)

    def claim(
        self, project_id: str, *, owner: str, limit: int = 1, kinds: Collection[str] | None = None
    ) -> list[Job]:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        claimed = self._claims.claim(project_id, owner=owner, limit=limit, kinds=kinds)
        return sorted(claimed, key=lambda j: (-j.priority, j.run_after, j.id))

    # -- settles: the held step's outcome, else the store's fenced write ------------------------

    def ack(self, lease: Lease, *, result: JsonObject | None = None) -> Settled:
        settled = self._workers.settle(lease, Success(result=dict(result or {})))
        return settled if settled is not None else self._jobs.ack(lease, result=result)

    def nack(
        self,
        lease: Lease,
        *,
        error: str,
        failure_class: FailureClass,
        retry_in: timedelta | None = None,
    ) -> Settled:
        outcome = Failure(failure_class, error, retry_in=retry_in)
        settled = self._workers.settle(lease, outcome)
        if settled is not None:
            return settled
        return self._jobs.nack(lease, error=error, failure_class=failure_class, retry_in=retry_in)

    def defer(
        self, lease: Lease, *, delay: timedelta, reason: str, capacity: bool = False
    ) -> Settled:
        outcome = Defer(delay=delay, reason=reason, capacity=capacity)
        settled = self._workers.settle(lease, outcome)
        if settled is not None:
            return settled
        return self._jobs.defer(lease, delay=delay, reason=reason, capacity=capacity)

    def park(self, lease: Lease, gate: GateRequest) -> Settled:
        settled = self._workers.settle(lease, Park(gate))
        return settled if settled is not None else self._jobs.park(lease, gate)

    # -- the record store's ------------------------------------------------------------------

    def heartbeat(self, lease: Lease) -> Settled:
        return self._jobs.heartbeat(lease)

    def grant(self, lease: Lease, *, max_attempts: int) -> Settled:
        return self._jobs.grant(lease, max_attempts=max_attempts)

    def assign(self, lease: Lease, *, engine_id: str) -> Settled:
        return self._jobs.assign(lease, engine_id=engine_id)

    def answer_gate(
        self, gate_id: UUID, *, answer: str, answered_by: str, grant_attempts: int = 0
    ) -> AnswerOutcome:
        return self._jobs.answer_gate(
            gate_id, answer=answer, answered_by=answered_by, grant_attempts=grant_attempts
        )

    def reap(self) -> ReapResult:
        return self._claims.reap()

    def get(self, job_id: UUID) -> Job | None:
        return self._jobs.get(job_id)

    def get_gate(self, gate_id: UUID) -> Gate | None:
        return self._jobs.get_gate(gate_id)

    def open_gates(self, project_id: str | None = None) -> list[Gate]:
        return self._jobs.open_gates(project_id)

    def count_unsettled(
        self,
        project_id: str,
        *,
        cycle: int | None = None,
        kinds: Collection[str] | None = None,
        exclude: UUID | None = None,
    ) -> int:
        return self._jobs.count_unsettled(project_id, cycle=cycle, kinds=kinds, exclude=exclude)

    def queue_depth(self, project_id: str) -> Mapping[JobState, int]:
        return self._jobs.queue_depth(project_id)

    def list_for_cycle(self, project_id: str, cycle: int) -> list[Job]:
        return self._jobs.list_for_cycle(project_id, cycle)


# -- how each backend's workers take jobs ----------------------------------------------------


class TakenClaims:
    """A claim made by a statement (the drive loop's ``claim_next``, the fake's ``claim``),
    each job then run by its worker's runner as the drive loop does (``run_claimed``)."""

    def __init__(
        self,
        workers: Workers,
        *,
        take: Callable[[str, str, int, Collection[str] | None], list[Job]],
        reap: Callable[[], ReapResult],
    ) -> None:
        self._workers = workers
        self._take = take
        self._reap = reap

    def claim(
        self, project_id: str, *, owner: str, limit: int, kinds: Collection[str] | None
    ) -> list[Job]:
        held = []
        for job in self._take(project_id, owner, limit, kinds):
            step = self._workers.step(owner)
            self._workers.run_in_thread(step, _run_claimed(job))
            taken = self._workers.took(step)
            assert taken is not None and taken.id == job.id
            held.append(taken)
        return held

    def reap(self) -> ReapResult:
        return self._reap()


def _run_claimed(job: Job) -> Callable[[StepRunner], StepResult]:
    return lambda runner: runner.run_claimed(job)


class _Pending:
    """A pointer a step actor received, waiting for a claim to name the worker that runs it."""

    def __init__(self, pointer: Mapping[str, Any]) -> None:
        self.pointer = dict(pointer)
        self.step: Step | None = None
        self.go = threading.Event()


class Deliveries:
    """The body of the fleet's step actors (``run_step@<queue>``) for the contract: each
    delivered pointer waits until a claim names the worker whose runner takes it
    (``StepRunner.run``, on the Dramatiq thread that holds the delivery, which Dramatiq
    acknowledges once the run returned). Also the wakeup: a pointer was delivered."""

    def __init__(self, workers: Workers, *, reap: Callable[[], ReapResult]) -> None:
        self._workers = workers
        self._reap = reap
        self._pending: dict[str, list[_Pending]] = {}
        self._arrived = threading.Condition()
        self._closed = False

    def actor(self, *, trace: Mapping[str, str] | None = None, **pointer: Any) -> None:
        pending = _Pending(pointer)
        with self._arrived:
            if self._closed:
                return
            self._pending.setdefault(str(pointer["project_id"]), []).append(pending)
            self._arrived.notify_all()
        pending.go.wait()
        if pending.step is not None:
            self._workers.run(pending.step, lambda runner: runner.run(**pending.pointer))

    def claim(
        self, project_id: str, *, owner: str, limit: int, kinds: Collection[str] | None
    ) -> list[Job]:
        held: list[Job] = []
        while len(held) < limit and (pending := self._next(project_id, kinds)) is not None:
            pending.step = self._workers.step(owner)
            pending.go.set()
            job = self._workers.took(pending.step)
            if job is not None:
                held.append(job)
        return held

    def _next(self, project_id: str, kinds: Collection[str] | None) -> _Pending | None:
        with self._arrived:
            waiting = self._pending.get(project_id, [])
            for n, pending in enumerate(waiting):
                if kinds is None or pending.pointer["kind"] in kinds:
                    return waiting.pop(n)
        return None

    def reap(self) -> ReapResult:
        return self._reap()

    def wait(self, project_id: str, timeout: float) -> bool:
        return self.waiting(project_id, 1, timeout)

    def waiting(self, project_id: str, n: int, timeout: float) -> bool:
        """Whether ``n`` of the project's pointers wait unclaimed, within ``timeout``."""
        with self._arrived:
            return self._arrived.wait_for(
                lambda: len(self._pending.get(project_id, ())) >= n, timeout
            )

    def close(self) -> None:
        """Every waiting pointer's actor returns (unclaimed)."""
        with self._arrived:
            self._closed = True
            waiting = [p for ps in self._pending.values() for p in ps]
            self._pending = {}
        for pending in waiting:
            pending.go.set()


class PointerWakeup:
    """The in-memory fake's wakeup: a committed unit's pointers (its ``after_commit``) wake
    a wait for their project, as the relay's publish wakes a consumer."""

    def __init__(self) -> None:
        self._arrived: dict[str, int] = {}
        self._changed = threading.Condition()

    def submit(self, pointers: Sequence[OutboxRow]) -> None:
        with self._changed:
            for pointer in pointers:
                self._arrived[pointer.project_id] = self._arrived.get(pointer.project_id, 0) + 1
            self._changed.notify_all()

    def wait(self, project_id: str, timeout: float) -> bool:
        with self._changed:
            if not self._changed.wait_for(lambda: self._arrived.get(project_id, 0) > 0, timeout):
                return False
            self._arrived[project_id] = 0
            return True

    def close(self) -> None:
        """Nothing to close."""
