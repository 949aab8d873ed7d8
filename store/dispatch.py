"""The record-store side of dispatch on RabbitMQ: fenced pointer claims, the lost-dispatch
sweep, dead letters as parks, and the outbox the relay drains.

A pointer is (job id, project, dispatch generation). The claim takes the row only at that
generation, so a duplicate or stale pointer changes nothing. The outbox is drained by
``sent_at IS NULL`` with ``FOR UPDATE SKIP LOCKED``; a row claimed by a relay that died is
reclaimed after ``reclaim_after``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from store.db import Conn, Pool, fetch_all, fetch_one, pipelined_transaction, statement
from store.jobs import job_from_row, write_claim
from store.retry import retried
from store.sql import load
from store.unit_of_work import LockedClaim, OutboxRow, UnitOfWork, outbox_row
from store.workflow_reads import workflow_from_row
from workflows.job import JobState
from workflows.queue import DELIVERY_EXHAUSTED_PROMPT, Job

Q = load("dispatch.sql")

# The lost-dispatch sweep's patience doubles with each resend of one wait, at most this often:
# at the default 120 s, a pointer still unclaimed is resent after 2, 4, 8, then every 16 min.
SWEEP_MAX_DOUBLINGS = 3


@dataclass(frozen=True, slots=True)
class PointerRow:
    """What a consumer's miss policy needs to know about a pointer's job, as of ``now``
    (the database clock)."""

    state: JobState
    dispatch_seq: int
    run_after: datetime
    lease_expires_at: datetime | None
    deps_met: bool
    now: datetime


class DeadLetterOutcome(enum.StrEnum):
    PARKED = "parked"
    REDISPATCHED = "redispatched"
    MOVED_ON = "moved_on"


@dataclass(frozen=True, slots=True)
class OutboxBacklog:
    unsent: int
    claimed: int


class DispatchRecords:
    """Dispatch-side statements on the record store. ``*_txn`` forms join the caller's unit
    of work; the others run on their own (one statement each)."""

    def __init__(self, *, pool: Pool, relay_id: str) -> None:
        self._pool = pool
        self.relay_id = relay_id

    def _conn(self) -> AbstractContextManager[Conn]:
        return statement(self._pool)

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
        """``sent``: the outbox row of a pointer this process held (``UnitOfWork.hold``),
        marked sent by the same statement, claim or miss.

        ``locked``: the caller settles the job in this same unit (a short step), so the
        row is locked and not written (``lock_pointer``): the unit's settle writes the claim,
        with the ack when it is one, and the row is written once instead of twice. The job
        returned is as the claim makes it either way."""
        params = {
            "job_id": job_id,
            "project_id": project_id,
            "seq": seq,
            "owner": owner,
            "sent": sent,
        }
        if not locked:
            row = fetch_one(unit.conn, Q["claim_pointer"], params)
            return None if row is None else job_from_row(row)
        workflow = unit.locks_workflow_with_claim(job_id)
        row = fetch_one(
            unit.conn,
            Q["lock_pointer"],
            params | {"workflow": workflow},
            then=unit.claim_sent if workflow else None,  # read under the lock, this round trip
        )
        if workflow:
            found = row is not None and row["w_id"] is not None
            unit.claim_locked_workflow(workflow_from_row(row, "w_") if row and found else None)
        if row is None:
            return None
        claim = LockedClaim(
            job_id=row["id"],
            seq=row["dispatch_seq"],
            attempts=row["claim_attempts"],
            last_error=row["claim_last_error"],
            lease_expired=row["claim_lease_expired"],
            owner=owner,
            token=row["claim_token"],
            expires_at=row["claim_expires_at"],
            dispatched_at=row["claim_dispatched_at"],
            dependents=row["claim_dependents"],
        )
        if row["state"] == JobState.LEASED:  # an expired lease taken over: written at once
            write_claim(unit, claim)
        else:
            unit.lock_claim(claim)
        return job_from_row(
            row
            | {
                "state": JobState.LEASED,
                "attempts": claim.attempts,
                "last_error": claim.last_error,
                "lease_expired": claim.lease_expired,
                "lease_owner": owner,
                "lease_token": claim.token,
                "lease_expires_at": claim.expires_at,
                "updated_at": row["claim_at"],
            }
        )

    @retried("claim a pointer", idempotent=False)  # an unknown commit: read the row
    def claim_pointer(self, *, job_id: UUID, project_id: str, seq: int, owner: str) -> Job | None:
        with self._conn() as conn:  # one statement, its own transaction: no outbox row
            return self.claim_pointer_txn(
                UnitOfWork(conn), job_id=job_id, project_id=project_id, seq=seq, owner=owner
            )

    @retried("read a pointer's job", idempotent=True)
    def snapshot(self, *, job_id: UUID, project_id: str) -> PointerRow | None:
        with self._conn() as conn:
            row = fetch_one(conn, Q["snapshot"], {"job_id": job_id, "project_id": project_id})
        if row is None:
            return None
        return PointerRow(
            state=JobState(row["state"]),
            dispatch_seq=row["dispatch_seq"],
            run_after=row["run_after"],
            lease_expires_at=row["lease_expires_at"],
            deps_met=row["deps_met"],
            now=row["now"],
        )

    @retried("sweep lost dispatches", idempotent=True)  # outbox keys are unique
    def sweep_lost(self, *, redispatch_after: timedelta, limit: int = 500) -> list[int]:
        """Write outbox rows for claimable jobs whose dispatch was lost; their ids. A job's
        n-th resend of one wait comes redispatch_after x 2^min(n-1, SWEEP_MAX_DOUBLINGS) after
        the previous dispatch, so a backlog is not multiplied by its own resends."""
        params = {
            "after_s": redispatch_after.total_seconds(),
            "max_doublings": SWEEP_MAX_DOUBLINGS,
            "limit": limit,
        }
        with self._conn() as conn:
            return [int(r["id"]) for r in fetch_all(conn, Q["sweep_lost"], params)]

    @retried("park a dead letter", idempotent=True)  # fenced on the generation
    def park_dead_letter(
        self, *, job_id: UUID, project_id: str, seq: int, reason: str
    ) -> DeadLetterOutcome:
        """A pointer past the delivery limit, for a row still at that generation and ready or
        holding an expired lease: park it behind a delivery_exhausted gate when its attempts
        are spent, else dispatch it again at a new generation (it was only co-delivered with a
        consumer-killer). Anything else: the job moved on, nothing to do."""
        params = {
            "job_id": job_id,
            "project_id": project_id,
            "seq": seq,
            "reason": reason,
            "prompt": DELIVERY_EXHAUSTED_PROMPT,
        }
        with self._conn() as conn:
            row = fetch_one(conn, Q["park_dead_letter"], params)
        if row is None:
            return DeadLetterOutcome.MOVED_ON
        return DeadLetterOutcome.PARKED if row["spent"] else DeadLetterOutcome.REDISPATCHED

    # -- the outbox ------------------------------------------------------------------------

    @retried("claim outbox rows", idempotent=True)  # lost claims are reclaimed
    def claim_outbox(self, *, limit: int, reclaim_after: timedelta) -> list[OutboxRow]:
        params = {
            "relay": self.relay_id,
            "limit": limit,
            "reclaim_s": reclaim_after.total_seconds(),
        }
        with self._conn() as conn:
            return [outbox_row(r) for r in fetch_all(conn, Q["claim_outbox"], params)]

    @retried("read outbox rows", idempotent=True)
    def outbox_rows(self, ids: Sequence[int]) -> list[OutboxRow]:
        """The unsent rows among ``ids`` (rows this process wrote, already claimed for it)."""
        with self._conn() as conn:
            return [outbox_row(r) for r in fetch_all(conn, Q["outbox_rows"], {"ids": list(ids)})]

    @retried("mark outbox rows sent", idempotent=True)
    def mark_sent(self, ids: Sequence[int]) -> None:
        """Committed without waiting for its WAL flush (``synchronous_commit = off``, one
        round trip in a pipeline): the mark is bookkeeping, and one lost to a PostgreSQL crash
        only sends those pointers again at a drain's reclaim, which their fenced claims turn
        into no-ops. The step's own commit, which wrote the row, stays durable."""
        if ids:
            with pipelined_transaction(self._pool) as conn:
                conn.execute(b"SET LOCAL synchronous_commit = off")
                conn.execute(Q["mark_sent"].encode(), {"ids": list(ids)})

    @retried("release outbox rows", idempotent=True)
    def release(self, ids: Sequence[int]) -> None:
        if ids:
            with self._conn() as conn:
                conn.execute(Q["release_outbox"].encode(), {"ids": list(ids)})

    @retried("read the outbox backlog", idempotent=True)
    def backlog(self) -> OutboxBacklog:
        with self._conn() as conn:
            row = fetch_one(conn, Q["outbox_backlog"], {})
        return (
            OutboxBacklog(int(row["unsent"]), int(row["claimed"])) if row else OutboxBacklog(0, 0)
        )
