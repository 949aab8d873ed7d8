"""The job queue on PostgreSQL: :class:`workflows.queue.JobRepository` as named SQL.

Each write comes in two forms: ``ack(lease)`` opens its own transaction,
``ack_txn(unit, lease)`` joins the caller's unit of work, so a step's settle can commit the
job, its history and its follow-ups in one transaction. A write that writes no outbox row and
that no unit of work composes (``claim_on``, ``heartbeat_on``, ``grant_on``, ``assign_on``)
takes the caller's connection instead (the ``_txn``/``_on`` convention: :mod:`store`). Every
settling write is one fenced statement (see ``store/sql/jobs.sql``); a write that lost its
lease returns :data:`workflows.queue.NOT_APPLIED`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar
from uuid import UUID

from psycopg import Cursor
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from store.db import Conn, Pool, fetch_all, fetch_one, statement, transaction
from store.events import emit_on
from store.gate_rows import gate_from_row
from store.ledger import append_on as ledger_append_on
from store.retry import retried, retrying
from store.sql import load
from store.unit_of_work import LockedClaim, Publish, UnitOfWork, Units
from workflows.events import Draft, EventType
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

Q = load("jobs.sql")
log = logging.getLogger(__name__)

ACKED = Settled(True, JobState.SUCCEEDED)  # an ack that applied
P = ParamSpec("P")
R = TypeVar("R")

REAP_BATCH = 500


class PostgresJobRepository:
    """The PostgreSQL backend of the job-queue contract."""

    def __init__(
        self,
        *,
        pool: Pool,
        leases: LeasePolicy | None = None,
        backoff_policy: BackoffPolicy = DEFAULT_BACKOFF,
        dispatch: bool = False,
        relay_id: str | None = None,
        after_commit: Publish | None = None,
    ) -> None:
        """``dispatch`` turns on dispatch generations and the outbox (the RabbitMQ backend):
        outbox rows are claimed for ``relay_id`` and kept by the unit of work that wrote them;
        ``units`` (a public method's, or a caller's composing ``*_txn`` forms) hands them to
        ``after_commit`` once its transaction committed."""
        self._pool = pool
        self._leases = leases or LeasePolicy()
        self._backoff = backoff_policy
        self._dispatch = dispatch
        self._relay_id = relay_id if dispatch else None
        # Who waits for ``vibey_job_ready``: the postgres backend's workers. Where a relay
        # publishes what a commit released (dispatching, ``after_commit``), the pointer is
        # the wakeup and nobody listens: no NOTIFY (it would serialise the commits).
        self._wake = not (dispatch and after_commit is not None)
        self.units = Units(pool=pool, publish=after_commit)

    @property
    def dispatching(self) -> bool:
        return self._dispatch

    def _dispatch_params(self) -> dict[str, Any]:
        return {"dispatch": self._dispatch, "relay": self._relay_id}

    def transaction(self) -> AbstractContextManager[Conn]:
        """A connection inside a transaction that commits on success and rolls back on error."""
        return transaction(self._pool)

    def _statement(self) -> AbstractContextManager[Conn]:
        return statement(self._pool)

    def _run_one(
        self, fn: Callable[Concatenate[Conn, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """``fn`` issues exactly one statement, which is atomic on its own."""

        def attempt() -> R:
            with self._statement() as conn:
                return fn(conn, *args, **kwargs)

        return retrying(attempt, what=fn.__name__, idempotent=False)

    # -- enqueue ---------------------------------------------------------------------------

    @retried("enqueue a job", idempotent=False)
    def enqueue(self, request: EnqueueRequest) -> Enqueued:
        with self.units.begin() as unit:
            return self.enqueue_txn(unit, request)

    @retried("enqueue jobs", idempotent=False)
    def enqueue_batch(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        with self.units.begin() as unit:
            return self.enqueue_batch_txn(unit, requests)

    def enqueue_txn(self, unit: UnitOfWork, request: EnqueueRequest) -> Enqueued:
        return self.enqueue_batch_txn(unit, [request])[0]

    def enqueue_batch_txn(
        self, unit: UnitOfWork, requests: Sequence[EnqueueRequest]
    ) -> list[Enqueued]:
        conn = unit.conn
        resolved: dict[UUID, UUID] = {}
        results: list[Enqueued] = []
        woken: set[str] = set()
        for request in requests:
            enqueued = self._enqueue_one(unit, request, resolved)
            if request.job_id is not None:
                resolved[request.job_id] = enqueued.job.id
            if enqueued.created:
                woken.add(request.project_id)
            results.append(enqueued)
        for project_id in sorted(woken) if self._wake else ():
            conn.execute(Q["notify_ready"], {"project_id": project_id})
        # Jobs with dependencies wait for them: dispatched once they all succeeded.
        created = [r.job.id for r in results if r.created and r.job.dispatch_seq == 0]
        if self._dispatch and created:
            released = self._dispatch_released(unit, ids=created)
            results = [
                replace(r, job=replace(r.job, dispatch_seq=1)) if r.job.id in released else r
                for r in results
            ]
        return results

    def enqueue_unread_txn(
        self, unit: UnitOfWork, requests: Sequence[EnqueueRequest], *, fresh: bool = False
    ) -> None:
        """Jobs sent without a read (:meth:`enqueue_batch_txn` reads each insert back): their
        outbox rows are read after the commit (:meth:`UnitOfWork.read_after_commit`), in the
        commit's round trip. The caller vouches for them (:func:`unread_batch`): each has an
        id of its own and, unless ``fresh``, no dependency, so nothing it writes is read
        before the commit (a duplicate's insert writes nothing: its key names a job that
        exists). ``fresh``: a new workflow's first jobs, whose subject names a workflow no job
        has yet, so every insert creates its row, and each waits only on jobs earlier in
        ``requests``, so none waiting is released now (its dependencies have not run). The
        job the unit's holder takes (:meth:`UnitOfWork.holding`) has its outbox row written
        released and becomes :attr:`UnitOfWork.held` at the read."""
        conn = unit.conn
        for request in requests:
            cur = conn.cursor(row_factory=dict_row)
            params = self._insert_params(request, request.job_id, request.depends_on)
            held = self._held(unit, request, params)
            if held:
                unit.hold_unread()
            cur.execute(Q["insert_job"].encode(), params)
            key = f"dispatch:{request.job_id}:1"  # the row insert_job writes, if it dispatches
            unit.read_after_commit(_outbox_reader(unit, cur, held=held), outbox_key=key)
            if fresh and request.depends_on:
                ids = list(request.depends_on)
                conn.execute(Q["insert_dependencies"], {"job_id": request.job_id, "ids": ids})
        for project_id in sorted({r.project_id for r in requests}) if self._wake else ():
            conn.execute(Q["notify_ready"], {"project_id": project_id})

    def _held(self, unit: UnitOfWork, request: EnqueueRequest, params: dict[str, Any]) -> bool:
        """Dispatched at once and due now: the unit's holder may run it next
        (:meth:`UnitOfWork.hold_next`), its outbox row then written released (``relay``
        None), for the holder or, if it dies, a drain."""
        held = (
            params["dispatch_now"]
            and request.delay <= timedelta(0)
            and unit.holding(request.kind, request.project_id)
        )
        if held:
            params["relay"] = None
        return held

    def _dispatch_released(
        self, unit: UnitOfWork, *, ids: Sequence[UUID] = (), parent: UUID | None = None
    ) -> set[UUID]:
        """Dispatch the jobs (or the parent's dependents) now claimable at generation 0;
        returns the ids of the jobs dispatched."""
        if parent is None:
            params = self._dispatch_params() | {"ids": list(ids)}
            written = fetch_all(unit.conn, Q["dispatch_released"], params)
        else:
            params = self._dispatch_params() | {"parent": parent}
            written = fetch_all(unit.conn, Q["dispatch_dependents"], params)
        unit.wrote(written)
        return {r["job_id"] for r in written}

    def _enqueue_one(
        self, unit: UnitOfWork, request: EnqueueRequest, resolved: Mapping[UUID, UUID]
    ) -> Enqueued:
        conn = unit.conn
        depends_on = [resolved.get(dep, dep) for dep in request.depends_on]
        if depends_on:
            missing = fetch_all(
                conn,
                Q["missing_dependencies"],
                {
                    "ids": depends_on,
                    "project_id": request.project_id,
                },
            )
            if missing:
                raise UnknownDependencyError([row["id"] for row in missing])
        job_id = request.job_id or uuid.uuid4()
        params = self._insert_params(request, job_id, depends_on)
        held = self._held(unit, request, params)
        row = fetch_one(conn, Q["insert_job"], params)
        if row is None:
            # A duplicate committed while the insert waited on it: this new statement (READ
            # COMMITTED) sees it.
            row = fetch_one(
                conn,
                Q["job_by_key"],
                {
                    "project_id": request.project_id,
                    "idempotency_key": request.idempotency_key,
                },
            )
            if row is None:  # pragma: no cover - the conflict guarantees the row
                raise RuntimeError(f"job with key {request.idempotency_key} vanished")
            return Enqueued(job=job_from_row(row), created=False)
        if not row["created"]:
            return Enqueued(job=job_from_row(row), created=False)
        unit.wrote_json(row["outbox_rows"], held=held)
        if depends_on:
            conn.execute(Q["insert_dependencies"], {"job_id": job_id, "ids": depends_on})
        return Enqueued(job=job_from_row(row), created=True)

    def _insert_params(
        self, request: EnqueueRequest, job_id: UUID | None, depends_on: Sequence[UUID]
    ) -> dict[str, Any]:
        """``insert_job``'s parameters for ``request`` as job ``job_id``."""
        return {
            "id": job_id,
            "project_id": request.project_id,
            "cycle": request.cycle,
            "kind": request.kind,
            "subject": request.subject,
            "idempotency_key": request.idempotency_key,
            "priority": request.priority,
            "payload": Jsonb(dict(request.payload)),
            "delay_s": request.delay.total_seconds(),
            "max_attempts": request.max_attempts,
            "lease_ms": _millis(self._leases.lease_for(request.kind, request.lease)),
            "workflow_id": request.workflow_id,
            "step": request.step,
            "dispatch_now": self._dispatch and not depends_on,
            "relay": self._relay_id,
        }

    # -- claim and fenced writes -----------------------------------------------------------

    @retried("claim jobs", idempotent=False)
    def claim(
        self, project_id: str, *, owner: str, limit: int = 1, kinds: Collection[str] | None = None
    ) -> list[Job]:
        return self._run_one(self.claim_on, project_id, owner=owner, limit=limit, kinds=kinds)

    def claim_on(
        self,
        conn: Conn,
        project_id: str,
        *,
        owner: str,
        limit: int = 1,
        kinds: Collection[str] | None = None,
    ) -> list[Job]:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        wanted = None if kinds is None else sorted(set(kinds))
        rows = fetch_all(
            conn,
            Q["claim"],
            {
                "project_id": project_id,
                "owner": owner,
                "limit": limit,
                "kinds": wanted,
            },
        )
        jobs = [job_from_row(row) for row in rows]
        jobs.sort(key=lambda j: (-j.priority, j.run_after, j.id))
        return jobs

    @retried("extend a lease", idempotent=True)
    def heartbeat(self, lease: Lease) -> Settled:
        with self._statement() as conn:
            return self.heartbeat_on(conn, lease)

    def heartbeat_on(self, conn: Conn, lease: Lease) -> Settled:
        row = fetch_one(conn, Q["heartbeat"], _fence(lease))
        if row is None:
            return NOT_APPLIED
        return Settled(True, JobState(row["state"]), lease_expires_at=row["lease_expires_at"])

    @retried("ack a job", idempotent=False)
    def ack(self, lease: Lease, *, result: JsonObject | None = None) -> Settled:
        one = not self._dispatch  # dispatching also releases dependents: three statements
        with self.units.begin(one_statement=one) as unit:
            return self.ack_txn(unit, lease, result=result)

    def ack_txn(
        self, unit: UnitOfWork, lease: Lease, *, result: JsonObject | None = None
    ) -> Settled:
        """Dispatching, an ack that says the job has dependents is followed by the lock on
        them and their release (a workflow's step seldom has any: two statements fewer). The
        release is fenced on its own (generation 0, every dependency succeeded). A dependent
        written by a transaction still open is the lost-dispatch sweep's, as it always was.
        The ack of a claim the unit locked is not read before the commit (:meth:`_ack_locked`)."""
        if unit.may_ack_unread(lease.job_id):
            return self._ack_locked(unit, lease, result)
        row = fetch_one(unit.conn, Q["ack"], self._ack(unit, lease, result))
        return self._acked(unit, lease, row)

    def _ack_locked(self, unit: UnitOfWork, lease: Lease, result: JsonObject | None) -> Settled:
        """The ack of a claim the unit locked and has not written (``dispatch.sql``'s
        ``lock_pointer``): the row lock, taken on the very fences the ack checks, holds till
        the commit and nothing of the unit writes the row before the ack, so it applies. It
        is read after the commit, in the commit's round trip, and the dependents it reports
        are released then, in a unit of their own (:meth:`release_dependents`; if that fails,
        a reconciler's lost-dispatch sweep releases them, as for any generation-0 job whose
        dependencies all succeeded)."""
        cur = unit.conn.cursor(row_factory=dict_row)
        cur.execute(Q["ack"].encode(), self._ack(unit, lease, result))
        job_id = lease.job_id

        def read() -> None:
            with cur:
                row = cur.fetchone()
            if row is None:  # pragma: no cover - the row lock makes it apply
                log.error("job %s: the ack of a claim locked in its unit missed", job_id)
            elif self._dispatch and row["dependents"]:
                unit.after_commit(lambda: self.release_dependents(job_id))

        unit.read_after_commit(read, outbox_key=None)
        return ACKED

    @retried("release a job's dependents", idempotent=True)
    def release_dependents(self, job_id: UUID) -> None:
        """The dependents of a committed ack that are now claimable, dispatched (fenced on
        generation 0 and on every dependency's success: run twice, it releases nothing)."""
        with self.units.begin() as unit:
            unit.conn.execute(Q["lock_dependents"], {"job_id": job_id})
            self._dispatch_released(unit, parent=job_id)

    def ack_unread_txn(
        self, unit: UnitOfWork, lease: Lease, *, result: JsonObject | None = None
    ) -> Callable[[], Settled]:
        """:meth:`ack_txn` sent now and read when the returned function is called: the
        statements the caller sends meanwhile travel with it (a pipeline's one round trip).
        Its dependents are released at the read. For a lease claimed in this same unit,
        whose fence holds till its commit: the caller writes as if it applied and checks
        before the commit. A claim the unit locked is not read before the commit at all
        (:meth:`_ack_locked`)."""
        if unit.may_ack_unread(lease.job_id):
            settled = self._ack_locked(unit, lease, result)
            return lambda: settled
        params = self._ack(unit, lease, result)
        cur = unit.conn.cursor(row_factory=dict_row)
        cur.execute(Q["ack"].encode(), params)

        def read() -> Settled:
            with cur:
                return self._acked(unit, lease, cur.fetchone())

        return read

    def _ack(self, unit: UnitOfWork, lease: Lease, result: JsonObject | None) -> dict[str, Any]:
        """The ack's parameters: fenced on the lease, or, for a claim the unit locked and has
        not written, the claim's columns, written with the ack's (``locked``)."""
        given = {"result": None if result is None else Jsonb(dict(result)), "wake": self._wake}
        claim = unit.take_claim(lease.job_id)
        if claim is None:
            fenced = {"locked": False, "seq": None, "attempts": None, "dispatched_at": None}
            return _fence(lease) | fenced | given
        return claim.params() | {"locked": True, "owner": None, "token": None} | given

    def _acked(self, unit: UnitOfWork, lease: Lease, row: DictRow | None) -> Settled:
        """An ack's row: its dependents released (dispatching), its result."""
        if self._dispatch and row is not None and row["dependents"]:
            unit.conn.execute(Q["lock_dependents"], {"job_id": lease.job_id})
            self._dispatch_released(unit, parent=lease.job_id)
        return _settled(row)

    @retried("nack a job", idempotent=False)
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
        _written(unit, lease)  # a claim the unit locked, before the fenced write
        if retry_in is None:
            attempt = max(lease.attempt, 1)
            retry_in = backoff(
                attempt, self._backoff, spread=jitter_fraction(lease.job_id, attempt)
            )
        params = (
            _fence(lease)
            | {
                "error": error,
                "failure_class": failure_class.value,
                "retry_s": retry_in.total_seconds(),
            }
            | self._dispatch_params()
        )
        return _settled(fetch_one(unit.conn, Q["nack"], params), unit)

    @retried("defer a job", idempotent=False)
    def defer(
        self,
        lease: Lease,
        *,
        delay: timedelta,
        reason: str,
        capacity: bool = False,
        solo: bool = False,
    ) -> Settled:
        """``solo`` (dispatching only): the next attempt runs with nothing else in flight in
        its worker process."""
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
        _written(unit, lease)  # a claim the unit locked, before the fenced write
        params = (
            _fence(lease)
            | {
                "delay_s": max(delay.total_seconds(), 0.0),
                "reason": reason,
                "capacity": capacity,
                "solo": solo,
            }
            | self._dispatch_params()
        )
        return _settled(fetch_one(unit.conn, Q["defer"], params), unit)

    @retried("park a job", idempotent=False)
    def park(self, lease: Lease, gate: GateRequest) -> Settled:
        """The fenced park, its gate, the gate's domain event and ledger question: one
        transaction."""
        with self.units.begin() as unit:
            return self.park_txn(unit, lease, gate)

    def park_txn(self, unit: UnitOfWork, lease: Lease, gate: GateRequest) -> Settled:
        _written(unit, lease)  # a claim the unit locked, before the fenced write
        conn = unit.conn
        params = _fence(lease) | {
            "gate_id": uuid.uuid4(),
            "kind": gate.kind,
            "prompt": gate.prompt,
            "answers": Jsonb(list(gate.answers)),
            "context": Jsonb(dict(gate.context)),
            "schema": Jsonb(dict(gate.schema)),
        }
        row = fetch_one(conn, Q["park"], params)
        if row is None:
            return NOT_APPLIED
        opened: dict[str, object] = {
            "gate_id": str(row["id"]),
            "gate": None,
            "kind": gate.kind,
            "question": gate.prompt,
            "answers": list(gate.answers),
            "job_id": str(lease.job_id),
            "deadline_at": None,
            "on_deadline": None,
        }
        _gate_opened_on(
            conn,
            opened,
            row["project_id"],
            row["workflow_id"],
            job_gate_asked(row["id"], gate.kind, gate.prompt, gate.answers, lease.job_id),
            job_id=lease.job_id,
        )
        return Settled(True, JobState.AWAITING_HUMAN, gate_id=row["id"])

    def grant(self, lease: Lease, *, max_attempts: int) -> Settled:
        return self._run_one(self.grant_on, lease, max_attempts=max_attempts)

    def grant_on(self, conn: Conn, lease: Lease, *, max_attempts: int) -> Settled:
        return _settled(fetch_one(conn, Q["grant"], _fence(lease) | {"max_attempts": max_attempts}))

    def assign(self, lease: Lease, *, engine_id: str) -> Settled:
        return self._run_one(self.assign_on, lease, engine_id=engine_id)

    def assign_on(self, conn: Conn, lease: Lease, *, engine_id: str) -> Settled:
        return _settled(fetch_one(conn, Q["assign"], _fence(lease) | {"engine_id": engine_id}))

    # -- gates and the reaper --------------------------------------------------------------

    @retried("answer a gate", idempotent=False)
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
        conn = unit.conn
        if grant_attempts < 0:
            raise ValueError("grant_attempts must not be negative")
        locked = fetch_one(conn, Q["lock_gate"], {"gate_id": gate_id})
        if locked is None:
            return AnswerOutcome(AnswerStatus.UNKNOWN_GATE)
        gate = gate_from_row(locked)
        if not gate.open:
            return AnswerOutcome(AnswerStatus.ALREADY_ANSWERED, gate)
        if ENGINE_GATES.problem(gate.kind, answer, answers=gate.answers, schema=gate.schema):
            return AnswerOutcome(AnswerStatus.INVALID_ANSWER, gate)
        answered = fetch_one(
            conn,
            Q["answer_gate"],
            {
                "gate_id": gate_id,
                "answer": answer,
                "answered_by": answered_by,
            },
        )
        if answered is None:  # pragma: no cover - the row lock above rules this out
            return AnswerOutcome(AnswerStatus.ALREADY_ANSWERED, gate)
        if gate.job_id is not None:
            ledger_append_on(
                conn,
                gate.project_id,
                [job_gate_answered(gate_id, answer, answered_by)],
                causation_id=f"gate:{gate_id}",
                correlation_id=None if gate.workflow_id is None else str(gate.workflow_id),
                job_id=gate.job_id,
                workflow_id=gate.workflow_id,
            )
            # What the answer grants is the gate kind's (a delivery_exhausted answer gives one
            # attempt back; a ladder_exhausted one the attempts it names).
            kind = ENGINE_GATES.get(gate.kind)
            granted = 0 if kind is None else kind.attempts_granted(answer)
            params = {"job_id": gate.job_id, "more": granted + grant_attempts}
            released = fetch_one(conn, Q["release_parked"], params | self._dispatch_params())
            if released is not None:
                if self._wake:
                    conn.execute(Q["notify_ready"], {"project_id": released["project_id"]})
                unit.wrote_json(released["outbox_rows"])
        return AnswerOutcome(AnswerStatus.ANSWERED, gate_from_row(answered))

    @retried("reap expired leases", idempotent=True)  # fenced on the expiry
    def reap(self) -> ReapResult:
        requeued = parked = 0
        while True:
            with transaction(self._pool) as conn:  # the gates' events and ledger with them
                row = fetch_one(
                    conn,
                    Q["reap"],
                    {"limit": REAP_BATCH, "prompt": DELIVERY_EXHAUSTED_PROMPT}
                    | self._dispatch_params(),
                )
                for gate in row["opened"] if row else ():
                    self._delivery_exhausted_on(conn, gate)
            batch_requeued = int(row["requeued"]) if row else 0
            batch_parked = int(row["parked"]) if row else 0
            requeued += batch_requeued
            parked += batch_parked
            if batch_requeued + batch_parked < REAP_BATCH:
                return ReapResult(requeued=requeued, parked=parked)

    @staticmethod
    def _delivery_exhausted_on(conn: Conn, gate: Mapping[str, Any]) -> None:
        """A gate the reaper opened: its ``gate.opened`` event and its ledger question."""
        opened: dict[str, object] = {
            "gate_id": gate["id"],
            "gate": None,
            "kind": "delivery_exhausted",
            "question": DELIVERY_EXHAUSTED_PROMPT,
            "answers": [],
            "job_id": gate["job_id"],
            "deadline_at": None,
            "on_deadline": None,
        }
        workflow = None if gate["workflow_id"] is None else UUID(gate["workflow_id"])
        asked = job_gate_asked(
            gate["id"], "delivery_exhausted", DELIVERY_EXHAUSTED_PROMPT, (), gate["job_id"]
        )
        _gate_opened_on(
            conn, opened, gate["project_id"], workflow, asked, job_id=UUID(gate["job_id"])
        )

    # -- reads -----------------------------------------------------------------------------

    @retried("read a job", idempotent=True)
    def get(self, job_id: UUID) -> Job | None:
        with self._statement() as conn:
            row = fetch_one(conn, Q["get_job"], {"job_id": job_id})
        return None if row is None else job_from_row(row)

    def lock_gate_txn(self, unit: UnitOfWork, gate_id: UUID) -> Gate | None:
        """The gate, locked until the caller's unit of work ends (``None``: no such gate)."""
        row = fetch_one(unit.conn, Q["lock_gate"], {"gate_id": gate_id})
        return None if row is None else gate_from_row(row)

    @retried("read a gate", idempotent=True)
    def get_gate(self, gate_id: UUID) -> Gate | None:
        with self._statement() as conn:
            row = fetch_one(conn, Q["get_gate"], {"gate_id": gate_id})
        return None if row is None else gate_from_row(row)

    @retried("read the open gates", idempotent=True)
    def open_gates(self, project_id: str | None = None) -> list[Gate]:
        with self._statement() as conn:
            return [
                gate_from_row(r)
                for r in fetch_all(conn, Q["open_gates"], {"project_id": project_id})
            ]

    @retried("count unsettled jobs", idempotent=True)
    def count_unsettled(
        self,
        project_id: str,
        *,
        cycle: int | None = None,
        kinds: Collection[str] | None = None,
        exclude: UUID | None = None,
    ) -> int:
        wanted = None if kinds is None else sorted(set(kinds))
        params = {"project_id": project_id, "cycle": cycle, "kinds": wanted, "exclude": exclude}
        with self._statement() as conn:
            row = fetch_one(conn, Q["count_unsettled"], params)
        return int(row["count"]) if row else 0

    @retried("read the queue depth", idempotent=True)
    def queue_depth(self, project_id: str) -> Mapping[JobState, int]:
        depth = dict.fromkeys(JobState, 0)
        with self._statement() as conn:
            for row in fetch_all(conn, Q["queue_depth"], {"project_id": project_id}):
                depth[JobState(row["state"])] = int(row["count"])
        return depth

    @retried("list a cycle's jobs", idempotent=True)
    def list_for_cycle(self, project_id: str, cycle: int) -> list[Job]:
        with self._statement() as conn:
            rows = fetch_all(conn, Q["list_for_cycle"], {"project_id": project_id, "cycle": cycle})
        return [job_from_row(r) for r in rows]


def write_claim(unit: UnitOfWork, claim: LockedClaim) -> None:
    """Write a claim the unit locked and has not written (``dispatch.sql``'s
    ``lock_pointer``), as the claim would have: sent with the next statement."""
    unit.conn.execute(Q["write_claim"].encode(), claim.params())


def _written(unit: UnitOfWork, lease: Lease) -> None:
    """The claim of ``lease``'s job, when the unit locked it and has not written it, written
    now: a fenced write other than the ack then finds the row as a claim leaves it."""
    claim = unit.take_claim(lease.job_id)
    if claim is not None:
        write_claim(unit, claim)


def _fence(lease: Lease) -> dict[str, Any]:
    return {"job_id": lease.job_id, "owner": lease.owner, "token": lease.token}


def _settled(row: DictRow | None, unit: UnitOfWork | None = None) -> Settled:
    if row is None:
        return NOT_APPLIED
    if unit is not None:
        unit.wrote_json(row.get("outbox_rows"))
    return Settled(True, JobState(row["state"]))


def _millis(duration: timedelta) -> int:
    return max(1, round(duration.total_seconds() * 1000))


def job_from_row(row: DictRow) -> Job:
    failure = row["failure_class"]
    return Job(
        id=row["id"],
        project_id=row["project_id"],
        cycle=row["cycle"],
        kind=row["kind"],
        subject=row["subject"],
        idempotency_key=row["idempotency_key"],
        state=JobState(row["state"]),
        priority=row["priority"],
        payload=row["payload"],
        result=row["result"],
        run_after=row["run_after"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        lease_timeout=timedelta(milliseconds=row["lease_ms"]),
        lease_owner=row["lease_owner"],
        lease_token=row["lease_token"],
        lease_expires_at=row["lease_expires_at"],
        engine_id=row["engine_id"],
        last_error=row["last_error"],
        failure_class=None if failure is None else FailureClass(failure),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        settled_at=row["settled_at"],
        dispatch_seq=row["dispatch_seq"],
        workflow_id=row.get("workflow_id"),
        step=row.get("step"),
        lease_expired=row.get("lease_expired", False),
    )


def _gate_opened_on(
    conn: Conn,
    opened: Mapping[str, object],
    project_id: str,
    workflow_id: UUID | None,
    asked: NewEvent,
    *,
    job_id: UUID,
) -> None:
    """A parked job's gate, in the transaction that opened it: the ``gate.opened`` domain
    event and the ledger's ``QuestionAsked`` (its answer appends the ``AnswerGiven``)."""
    correlation = None if workflow_id is None else str(workflow_id)
    emit_on(
        conn,
        project_id,
        [Draft(EventType.GATE_OPENED, dict(opened))],
        correlation_id=correlation,
        causation_id=str(job_id),
    )
    ledger_append_on(
        conn,
        project_id,
        [asked],
        causation_id=str(job_id),
        correlation_id=correlation,
        job_id=job_id,
        workflow_id=workflow_id,
    )


def _outbox_reader(unit: UnitOfWork, cur: Cursor[DictRow], *, held: bool) -> Callable[[], None]:
    """Read a job's insert once its unit committed: its outbox rows, if it created the job
    and dispatched it (``held``: the row the unit holds)."""

    def read() -> None:
        with cur:
            row = cur.fetchone()
        if row is not None and row["created"]:
            unit.wrote_json(row["outbox_rows"], held=held)

    return read


def unread_batch(requests: Sequence[EnqueueRequest], *, fresh: bool) -> bool:
    """Whether :meth:`PostgresJobRepository.enqueue_unread_txn` may take ``requests``: each
    has an id of its own and, for a new workflow's first steps (``fresh``), waits only on
    earlier ones; otherwise on none."""
    earlier: set[UUID] = set()
    for request in requests:
        if request.job_id is None or request.job_id in earlier:
            return False
        if any(dep not in earlier for dep in request.depends_on) or (
            request.depends_on and not fresh
        ):
            return False
        earlier.add(request.job_id)
    return True
