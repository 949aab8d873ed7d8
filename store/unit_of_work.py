"""A unit of work: one transaction and the dispatch pointers it wrote, published after commit.

Every write that may release a job (enqueue, a settle, a gate answer, a workflow event) runs in
a :class:`UnitOfWork`. The statements that insert ``job_outbox`` rows return the rows' pointer
fields (``RETURNING``), and :meth:`UnitOfWork.wrote` keeps them; once the transaction has
committed, :meth:`Units.begin` hands them to the relay (``publish``), which sends them without
reading the outbox again. Nothing is handed over when the transaction rolls back: the relay
must never publish what might not exist.

A multi-statement unit runs in psycopg's pipeline mode: statements whose results nobody reads
(history appends, notifications, gate inserts) travel with the next one that is read, and the
``COMMIT`` with the last, so a transaction costs about as many round trips as it has reads.

    with units.begin() as unit:
        jobs.ack_txn(unit, lease)
        workflows.record_txn(unit, workflow_id, event)
    # committed; the pointers the two wrote are with the relay

A store call that joins a unit is named ``*_txn`` and takes the unit, never its bare
connection; one that takes a connection is named ``*_on`` (the convention: :mod:`store`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg

from store.db import Conn, Pool, pipelined_transaction, settle_pipeline, statement
from store.errors import CommitUnknown, DatabaseUnavailable
from store.resolve import unsent_rows
from store.sql import load

if TYPE_CHECKING:
    from store.workflow_reads import Workflow

log = logging.getLogger(__name__)

# The columns every outbox INSERT returns (``RETURNING`` + :data:`OUTBOX_RETURNING`).
OUTBOX_RETURNING = "id, key, job_id, project_id, dispatch_seq, kind, not_before, solo"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A dispatch pointer as the outbox holds it: what the relay publishes."""

    id: int
    key: str
    job_id: UUID
    project_id: str
    dispatch_seq: int
    kind: str
    not_before: datetime
    solo: bool = False
    priority: int = 0  # the job's; the message priority where the queue honours one
    workflow_id: UUID | None = None  # the message's correlation_id (else the job's id)
    traceparent: str | None = None  # the W3C trace context it continues (None: untraced)


def outbox_row(row: Mapping[str, Any]) -> OutboxRow:
    return OutboxRow(
        id=row["id"],
        key=row["key"],
        job_id=row["job_id"],
        project_id=row["project_id"],
        dispatch_seq=row["dispatch_seq"],
        kind=row["kind"],
        not_before=row["not_before"],
        solo=row["solo"],
        priority=row.get("priority") or 0,
        workflow_id=row.get("workflow_id"),
        traceparent=row.get("traceparent"),
    )


Q = load("dispatch.sql")


@dataclass(frozen=True, slots=True)
class LockedClaim:
    """A claim its unit of work locked and has not written (``store.dispatch``'s
    ``lock_pointer``): the columns the claim gives the job's row, written by the unit's
    settle, with the ack when it is one (``store.jobs``)."""

    job_id: UUID
    seq: int
    attempts: int
    last_error: str | None
    lease_expired: bool
    owner: str
    token: UUID
    expires_at: datetime
    dispatched_at: datetime | None
    dependents: bool = False  # jobs wait on this one (at the lock)

    def params(self) -> dict[str, Any]:
        """The claim's columns by name: the parameters of ``write_claim`` and a locked
        ``ack``."""
        return {name: getattr(self, name) for name in _CLAIM_FIELDS}


_CLAIM_FIELDS = tuple(f.name for f in fields(LockedClaim) if f.name != "dependents")


Publish = Callable[[Sequence[OutboxRow]], None]
MayHold = Callable[[str, str], bool]  # (kind, project): may this process run the job next


class UnitOfWork:
    """One open transaction (``conn``) and the outbox rows written in it so far."""

    __slots__ = (
        "_after",
        "_claim",
        "_failed_as",
        "_hold_unread",
        "_may_hold",
        "_pointers",
        "_savepoints",
        "_sent_with_claim",
        "_traced",
        "_unread",
        "_with_claim",
        "_workflow",
        "_workflow_of",
        "conn",
        "held",
    )

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._pointers: list[OutboxRow] = []
        self._unread: list[tuple[Callable[[], None], str | None]] = []  # (read, its outbox key)
        self._traced: str | None = None  # the traceparent of the rows read after the commit
        self.held: OutboxRow | None = None  # kept from the relay: this process runs it next
        self._may_hold: MayHold | None = None  # offered the next job dispatched at once
        self._savepoints = 0  # savepoint blocks open (:meth:`savepoint`)
        self._claim: LockedClaim | None = None  # locked, not written (:meth:`lock_claim`)
        self._hold_unread = False  # the held row's insert is read after the commit
        self._after: list[Callable[[], None]] = []  # run once the unit committed
        self._failed_as: Callable[[Exception], Exception] | None = None  # see fail_as
        self._workflow_of: UUID | None = None  # the job whose claim locks its workflow
        self._workflow: Workflow | None = None  # what that claim's lock read
        self._with_claim: Callable[[], Any] | None = None  # sends what goes behind that claim
        self._sent_with_claim: Any = None  # what it sent, till taken (sent_with_claim)

    def lock_workflow_with_claim(
        self, job_id: UUID, *, then: Callable[[], Any] | None = None
    ) -> None:
        """The locked claim of ``job_id`` (``store.dispatch``'s ``claim_pointer_txn`` with
        ``locked``), the unit's next statement, locks the job's workflow first, in the same
        statement: :meth:`claimed_workflow` then gives it. ``then`` sends what must be read
        under that lock, behind the claim and before the claim is read, so that it travels
        in the claim's round trip (:meth:`claim_sent`); what it returns (a cursor, sent and
        not read) is :meth:`sent_with_claim`'s."""
        self._workflow_of, self._workflow, self._with_claim = job_id, None, then
        self._sent_with_claim = None

    def claim_sent(self) -> None:
        """The claim that locks the workflow is sent, not yet read: send what travels with it
        (once)."""
        then, self._with_claim = self._with_claim, None
        if then is not None:
            self._sent_with_claim = then()

    def sent_with_claim(self) -> Any:
        """What was sent behind the claim (:meth:`lock_workflow_with_claim`'s ``then``), once;
        else None."""
        sent, self._sent_with_claim = self._sent_with_claim, None
        return sent

    def locks_workflow_with_claim(self, job_id: UUID) -> bool:
        """Whether the claim of ``job_id`` is to lock its workflow too."""
        return self._workflow_of == job_id

    def claim_locked_workflow(self, workflow: Workflow | None) -> None:
        """The claim locked the job's workflow: ``workflow`` (None: a plain job, or a claim
        that missed)."""
        self._workflow_of, self._workflow = None, workflow

    def claimed_workflow(self, job_id: UUID) -> tuple[bool, Workflow | None]:
        """(whether the claim of ``job_id`` locked its workflow, the workflow it locked)."""
        if self._workflow_of == job_id:
            return False, None
        return True, self._workflow

    def lock_claim(self, claim: LockedClaim) -> None:
        """``claim``'s row is locked in this unit and not written: the unit's first fenced
        write on that job writes it (:meth:`take_claim`)."""
        self._claim = claim

    def may_ack_unread(self, job_id: UUID) -> bool:
        """The ack of ``job_id`` may be read after the commit: this unit locked its claim and
        has not written it (:meth:`lock_claim`),
        and no job waited on ``job_id`` at the lock."""
        claim = self._claim
        return claim is not None and claim.job_id == job_id and not claim.dependents

    def take_claim(self, job_id: UUID) -> LockedClaim | None:
        """The claim of ``job_id`` this unit locked and has not written, now the caller's
        to write (None: none, or written already)."""
        claim = self._claim
        if claim is None or claim.job_id != job_id:
            return None
        self._claim = None
        return claim

    def hold(self, row: OutboxRow) -> None:
        """Keep ``row`` from the relay after the commit: the caller runs its job in place and
        marks it sent in that step's unit (its claim does: ``store.dispatch``'s
        ``claim_pointer_txn`` with ``sent``). In this transaction the row
        is released, so if the caller dies first a reconciler's drain sends it at its next
        pass, as it sends any unsent row nobody holds. (A row chosen before its insert,
        :meth:`hold_next`, is written released: no statement of its own.)"""
        self.conn.execute(Q["release_held"].encode(), {"id": row.id})
        self.held = row

    def hold_next(self, may_hold: MayHold) -> None:
        """Offer the next job this unit inserts dispatched at once (due now, no dependency)
        to ``may_hold`` (its kind and project): the first it takes has its outbox row written
        released (unclaimed, as :meth:`hold` leaves a row) in its insert, and held."""
        self._may_hold = may_hold

    def holding(self, kind: str, project_id: str) -> bool:
        """Whether the job about to be inserted (dispatched at once, due now) is the one held
        (:meth:`hold_next`): its insert then writes its outbox row released and passes it to
        :meth:`wrote_json` with ``held``. Offered once: the first job taken uses the offer."""
        may_hold = self._may_hold
        if may_hold is None or self.holds or not may_hold(kind, project_id):
            return False
        self._may_hold = None
        return True

    @property
    def holds(self) -> bool:
        """A row is held (:attr:`held`), or will be once its insert is read after the commit
        (:meth:`hold_unread`)."""
        return self.held is not None or self._hold_unread

    def hold_unread(self) -> None:
        """The job :meth:`holding` took is inserted by a statement read after the commit
        (:meth:`read_after_commit`): its row becomes :attr:`held` then (:meth:`wrote_json`
        with ``held``)."""
        self._hold_unread = True

    def after_commit(self, run: Callable[[], None]) -> None:
        """Run ``run`` once the unit committed and its pointers went to the relay (a unit
        that rolls back, or whose commit was cut off, never runs it). It must leave nothing
        undone that a reconciler's pass would not do: a failure there is logged, not raised."""
        self._after.append(run)

    def fail_as(self, failed: Callable[[Exception], Exception]) -> None:
        """A statement of this unit that fails at its commit (its result read after the
        commit, :meth:`read_after_commit`, so its error comes back with the COMMIT's) raises
        ``failed(error)`` out of :meth:`Units.begin`, the unit rolled back: the caller's
        name for it (a workflow's decision that took no savepoint)."""
        self._failed_as = failed

    def failed(self, exc: Exception) -> Exception | None:
        """What :meth:`fail_as` names ``exc`` (None: nothing, it is raised as it is)."""
        return None if self._failed_as is None else self._failed_as(exc)

    def run_after_commit(self) -> None:
        """Run what :meth:`after_commit` was given (the unit has committed)."""
        after, self._after = self._after, []
        for run in after:
            try:
                run()
            except Exception:  # left to a reconciler's pass
                log.exception("work after a unit's commit failed; a reconciler's pass does it")

    def wrote(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Keep outbox rows a statement returned (their pointer fields)."""
        self._pointers.extend(outbox_row(r) for r in rows)

    def read_after_commit(self, read: Callable[[], None], *, outbox_key: str | None) -> None:
        """Read a statement's result once the unit committed, not now: the outbox row it may
        have written (key ``outbox_key``, None: it writes none; ``read`` keeps it with
        :meth:`wrote_json`) comes back with the COMMIT's results, in the one round trip,
        instead of costing one of its own. Only for a statement whose rows decide nothing
        before the commit (a job's insert with no dependency, an ack fenced by its row's
        lock)."""
        self._unread.append((read, outbox_key))

    def unread_keys(self) -> list[str]:
        """The outbox keys of the reads :meth:`read_after_commit` put off, not run yet."""
        return [key for _, key in self._unread if key is not None]

    def read_unread(self) -> None:
        """Run the reads :meth:`read_after_commit` put off (their results are in)."""
        unread, self._unread = self._unread, []
        kept = len(self._pointers)
        for read, _ in unread:
            read()
        if self._traced is not None:
            traced = [replace(p, traceparent=self._traced) for p in self._pointers[kept:]]
            self._pointers[kept:] = traced

    def wrote_json(self, rows: Iterable[Mapping[str, Any]] | None, *, held: bool = False) -> None:
        """Outbox rows aggregated by a statement as ``jsonb_agg`` (``None``: none); ``held``:
        the one row of a job :meth:`holding` took, written released, is :attr:`held`."""
        for row in rows or ():
            self._pointers.append(
                OutboxRow(
                    id=int(row["id"]),
                    key=row["key"],
                    job_id=UUID(row["job_id"]),
                    project_id=row["project_id"],
                    dispatch_seq=int(row["dispatch_seq"]),
                    kind=row["kind"],
                    not_before=datetime.fromisoformat(row["not_before"]),
                    solo=bool(row["solo"]),
                    priority=int(row.get("priority") or 0),
                    workflow_id=UUID(row["workflow_id"]) if row.get("workflow_id") else None,
                )
            )
            if held:
                self.held, self._hold_unread = self._pointers[-1], False

    def trace(self, traceparent: str | None) -> None:
        """Mark the rows written so far with the W3C ``traceparent`` their pointers continue
        (a traced workflow event's span: ``store.event_spans``), in this transaction, so a
        relay sends it with them, a reconciler's drain included. None: nothing to mark."""
        if traceparent is None:
            return
        if self._pointers:
            ids = [p.id for p in self._pointers]
            params = {"traceparent": traceparent, "ids": ids}
            self.conn.execute(Q["trace_outbox"].encode(), params)
            self._pointers = [replace(p, traceparent=traceparent) for p in self._pointers]
        if keys := self.unread_keys():  # rows not read yet: by their keys
            params = {"traceparent": traceparent, "keys": keys}
            self.conn.execute(Q["trace_outbox_keys"].encode(), params)
            self._traced = traceparent

    @property
    def pointers(self) -> tuple[OutboxRow, ...]:
        return tuple(self._pointers)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A savepoint: an exception in the block undoes the block's statements (and their
        outbox rows) and propagates. Plain ``SAVEPOINT``/``RELEASE`` commands, which travel in
        the pipeline: psycopg's nested ``transaction()`` syncs a pipeline four times.

        One name for every savepoint: PostgreSQL keeps a shadowed savepoint, and ``ROLLBACK
        TO``/``RELEASE`` take the most recent of that name, which nesting makes this block's.
        Fixed texts are prepared once per connection, as every other statement is.

        Only a nested block releases its savepoint (else the enclosing block's ``ROLLBACK
        TO`` would take it). An outermost one's is left to the ``COMMIT``, one statement
        fewer: a later block's ``SAVEPOINT`` shadows it, so nothing can roll back to it."""
        kept, unread, after = len(self._pointers), len(self._unread), len(self._after)
        held, may_hold, claim = self.held, self._may_hold, self._claim
        hold_unread = self._hold_unread
        nested = self._savepoints > 0
        self._savepoints += 1
        self.conn.execute(b"SAVEPOINT unit")
        try:
            yield
            if len(self._unread) > unread:  # their statements' errors raise here, in the block
                with self.conn.pipeline():  # a nested pipeline's exit is a sync
                    pass
        except BaseException:
            settle_pipeline(self.conn)
            self.conn.execute(b"ROLLBACK TO SAVEPOINT unit")
            del self._pointers[kept:]
            del self._unread[unread:]  # their statements were rolled back
            del self._after[after:]
            self.held, self._may_hold = held, may_hold  # a row held in the block is gone
            self._hold_unread = hold_unread
            self._claim = claim  # a claim written in the block is unwritten again
            raise
        finally:
            self._savepoints -= 1
        if nested:
            self.conn.execute(b"RELEASE SAVEPOINT unit")


class Units:
    """Opens units of work on a pool; hands each one's pointers to ``publish`` after its
    commit (no ``publish``: the rows wait for a reconciler's drain)."""

    def __init__(self, *, pool: Pool, publish: Publish | None = None) -> None:
        self._pool = pool
        self._publish = publish

    @contextmanager
    def begin(self, *, one_statement: bool = False) -> Iterator[UnitOfWork]:
        """A unit in a transaction (pipelined), or, for a write that is one statement, on an
        autocommit connection where the statement is its own transaction (one round trip)."""
        scope = statement(self._pool) if one_statement else pipelined_transaction(self._pool)
        unit: UnitOfWork | None = None
        try:
            with scope as conn:
                unit = UnitOfWork(conn)
                yield unit
        except CommitUnknown:
            if unit is not None:
                keys = unit.unread_keys()
                with contextlib.suppress(Exception):  # a read the broken pipeline lost
                    unit.read_unread()
                self._publish_landed(unit.pointers, keys)
            raise
        except psycopg.Error as exc:
            failed = None if unit is None else unit.failed(exc)
            if failed is None:
                raise
            raise failed from exc
        unit.read_unread()
        held = None if unit.held is None else unit.held.id
        sent = [p for p in unit.pointers if p.id != held]
        if sent and self._publish is not None:
            self._publish(sent)
        unit.run_after_commit()

    def hand_over(self, rows: Sequence[OutboxRow]) -> None:
        """Give committed outbox rows to the relay (a held row its holder did not run)."""
        if rows and self._publish is not None:
            self._publish(rows)

    def _publish_landed(self, pointers: Sequence[OutboxRow], unread: Sequence[str]) -> None:
        """After a commit cut off mid-flight: the outbox rows that exist (so the commit
        landed) go to the relay now, not at a reconciler's reclaim: the pointers the unit read
        back, by id, and the rows it had not read yet (``unread``, their keys: their results
        were lost with the connection). One statement reads both.

        When PostgreSQL cannot say, every pointer read back goes: a pointer is a hint, and
        the fenced claim drops one whose commit did not land (no such job, or another
        generation), while waiting for the reclaim would stand a landed step still for up to a
        minute after PostgreSQL answers. The unread rows then stay claimed by this relay till
        a drain's reclaim: a pointer cannot be built without its row."""
        if self._publish is None or not (pointers or unread):
            return
        try:
            rows = unsent_rows(self._pool, [p.id for p in pointers], unread)
        except DatabaseUnavailable:
            landed = list(pointers)
        else:
            landed = [outbox_row(r) for r in rows]
        if landed:
            self._publish(landed)
