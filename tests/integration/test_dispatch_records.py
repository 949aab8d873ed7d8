"""Dispatch generations and the outbox on the record store (the RabbitMQ backend's PostgreSQL
side): which transitions write a pointer, the fenced pointer claim, the sweep, dead-letter
parks, and the relay's claims."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from uuid import UUID

import pytest
from psycopg_pool import ConnectionPool

from store.dispatch import SWEEP_MAX_DOUBLINGS, DeadLetterOutcome, DispatchRecords
from store.jobs import PostgresJobRepository
from store.unit_of_work import OutboxRow, UnitOfWork
from workflows.job import FailureClass, JobState, LeasePolicy
from workflows.queue import EnqueueRequest, GateRequest, Job

P = "proj"
SHORT = LeasePolicy(default=timedelta(milliseconds=300), by_kind={})


class Handoff:
    """Stands in for the relay: records what each commit handed over."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, ...]] = []

    def __call__(self, rows: Sequence[OutboxRow]) -> None:
        self.batches.append(tuple(row.id for row in rows))

    @property
    def ids(self) -> list[int]:
        return [i for batch in self.batches for i in batch]


@pytest.fixture
def pool(pg_url: str) -> Iterator[ConnectionPool]:
    with ConnectionPool(
        pg_url, min_size=2, max_size=8, open=True, kwargs={"autocommit": True}
    ) as p:
        yield p


@pytest.fixture
def handoff() -> Handoff:
    return Handoff()


def repo_for(pool: ConnectionPool, handoff: Handoff, leases: LeasePolicy | None = None):
    return PostgresJobRepository(
        pool=pool, leases=leases, dispatch=True, relay_id="relay-1", after_commit=handoff
    )


def outbox(pool: ConnectionPool, job_id: UUID) -> list[tuple]:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT dispatch_seq, claimed_by, sent_at IS NOT NULL, not_before "
            "FROM job_outbox WHERE job_id = %s ORDER BY id",
            (job_id,),
        ).fetchall()


def req(subject: str, **kw) -> EnqueueRequest:
    return EnqueueRequest(project_id=P, kind="design.interview", subject=subject, **kw)


def pointer_claim(records: DispatchRecords, job: Job, seq: int, owner: str = "w") -> Job | None:
    return records.claim_pointer(job_id=job.id, project_id=P, seq=seq, owner=owner)


def test_enqueue_dispatches_generation_one_after_commit(pool, handoff) -> None:
    repo = repo_for(pool, handoff)
    job = repo.enqueue(req("a")).job
    assert job.dispatch_seq == 1
    assert outbox(pool, job.id) == [(1, "relay-1", False, job.run_after)]
    assert len(handoff.ids) == 1
    again = repo.enqueue(req("a"))
    assert not again.created and len(outbox(pool, job.id)) == 1 and len(handoff.ids) == 1


def test_a_blocked_job_is_dispatched_when_its_dependency_succeeds(pool, handoff) -> None:
    repo, records = repo_for(pool, handoff), DispatchRecords(pool=pool, relay_id="relay-1")
    parent = repo.enqueue(req("parent")).job
    child = repo.enqueue(req("child", depends_on=(parent.id,))).job
    assert child.dispatch_seq == 0 and outbox(pool, child.id) == []
    held = pointer_claim(records, parent, 1)
    assert held is not None
    assert repo.ack(held.lease).applied
    assert [row[0] for row in outbox(pool, child.id)] == [1]
    assert handoff.batches[-1] == tuple(handoff.ids[-1:])


def test_two_parents_acked_at_once_release_their_child_once(pool, handoff) -> None:
    repo, records = repo_for(pool, handoff), DispatchRecords(pool=pool, relay_id="relay-1")
    a, b = repo.enqueue(req("a")).job, repo.enqueue(req("b")).job
    child = repo.enqueue(req("child", depends_on=(a.id, b.id))).job
    held_a, held_b = pointer_claim(records, a, 1), pointer_claim(records, b, 1)
    assert held_a is not None and held_b is not None
    first_done = threading.Event()
    with repo.transaction() as conn:  # the first ack holds its transaction open…
        assert repo.ack_txn(UnitOfWork(conn), held_a.lease).applied

        def second() -> None:  # …while the second runs and must wait for it
            assert repo.ack(held_b.lease).applied
            first_done.set()

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.3)
        assert not first_done.is_set()
    thread.join(timeout=10)
    assert first_done.is_set()
    assert [row[0] for row in outbox(pool, child.id)] == [1]


def test_the_pointer_claim_is_fenced_on_the_generation(pool, handoff) -> None:
    repo = repo_for(pool, handoff, SHORT)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("fenced")).job
    assert pointer_claim(records, job, 2) is None  # a generation from the future
    held = pointer_claim(records, job, 1)
    assert held is not None and held.attempts == 1
    assert pointer_claim(records, job, 1, owner="dup") is None  # a duplicate, lease live
    time.sleep(0.45)
    taken = pointer_claim(records, job, 1, owner="redelivered")  # the lease expired
    assert taken is not None and taken.attempts == 2 and taken.lease_owner == "redelivered"
    assert not repo.ack(held.lease).applied and repo.ack(taken.lease).applied
    assert pointer_claim(records, job, 1) is None  # terminal


def test_transitions_that_start_a_new_episode_bump_the_generation(pool, handoff) -> None:
    repo = repo_for(pool, handoff, SHORT)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("episodes", max_attempts=3)).job
    held = pointer_claim(records, job, 1)
    assert held is not None
    assert repo.nack(
        held.lease, error="e", failure_class=FailureClass.WORK, retry_in=timedelta(0)
    ).applied
    held = pointer_claim(records, job, 2)
    assert held is not None
    assert repo.defer(held.lease, delay=timedelta(0), reason="later").applied
    held = pointer_claim(records, job, 3)
    assert held is not None
    time.sleep(0.45)
    assert repo.reap().requeued == 1
    held = pointer_claim(records, job, 4)
    assert held is not None
    gate = repo.park(held.lease, GateRequest(kind="question", prompt="?")).gate_id
    assert gate is not None and len(outbox(pool, job.id)) == 4  # park writes no pointer
    assert repo.answer_gate(gate, answer="go", answered_by="ann").applied
    assert [row[0] for row in outbox(pool, job.id)] == [1, 2, 3, 4, 5]
    final = repo.get(job.id)
    assert final is not None and final.dispatch_seq == 5 and final.state is JobState.READY


def test_a_last_failed_attempt_writes_no_pointer(pool, handoff) -> None:
    repo, records = repo_for(pool, handoff), DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("last", max_attempts=1)).job
    held = pointer_claim(records, job, 1)
    assert held is not None
    assert (
        repo.nack(held.lease, error="e", failure_class=FailureClass.WORK).state is JobState.FAILED
    )
    assert len(outbox(pool, job.id)) == 1


def test_sweep_resends_lost_dispatches_once(pool, handoff) -> None:
    repo, records = repo_for(pool, handoff), DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("lost")).job
    records.mark_sent(handoff.ids)
    assert records.sweep_lost(redispatch_after=timedelta(hours=1)) == []
    time.sleep(0.05)
    swept = records.sweep_lost(redispatch_after=timedelta(0))
    assert len(swept) == 1
    assert records.sweep_lost(redispatch_after=timedelta(0)) == []  # unsent: the relay's now
    rows = outbox(pool, job.id)
    assert [r[0] for r in rows] == [1, 1] and rows[1][1] is None


def backdate_dispatch(pool: ConnectionPool, job_id: UUID, seconds: float) -> None:
    """As if the job's last dispatch and its due time were ``seconds`` ago."""
    with pool.connection() as conn:
        conn.execute(
            "UPDATE job SET dispatched_at = now() - make_interval(secs => %(s)s),"
            " updated_at = now() - make_interval(secs => %(s)s),"
            " run_after = now() - make_interval(secs => %(s)s) WHERE id = %(id)s",
            {"s": seconds, "id": job_id},
        )


def sweeps(pool: ConnectionPool, job_id: UUID) -> int:
    with pool.connection() as conn:
        row = conn.execute("SELECT sweeps FROM job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return int(row[0])


def test_sweep_backs_off_per_job_and_a_claim_resets_it(pool, handoff) -> None:
    repo, records = repo_for(pool, handoff), DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("late")).job
    records.mark_sent(handoff.ids)
    after = timedelta(seconds=4)
    backdate_dispatch(pool, job.id, 5)
    assert len(records.sweep_lost(redispatch_after=after)) == 1  # 5 s > 4 s
    assert sweeps(pool, job.id) == 1
    records.mark_sent([outbox_id for outbox_id, *_ in unsent_outbox(pool, job.id)])
    backdate_dispatch(pool, job.id, 7)
    assert records.sweep_lost(redispatch_after=after) == []  # the second waits 8 s
    backdate_dispatch(pool, job.id, 9)
    assert len(records.sweep_lost(redispatch_after=after)) == 1
    records.mark_sent([outbox_id for outbox_id, *_ in unsent_outbox(pool, job.id)])
    capped = 4 * 2**SWEEP_MAX_DOUBLINGS + 1
    for _ in range(SWEEP_MAX_DOUBLINGS):  # the third, fourth, fifth resends: 16 s, then 32 s
        records.mark_sent([outbox_id for outbox_id, *_ in unsent_outbox(pool, job.id)])
        backdate_dispatch(pool, job.id, capped)
        assert len(records.sweep_lost(redispatch_after=after)) == 1
    assert sweeps(pool, job.id) == 2 + SWEEP_MAX_DOUBLINGS
    assert pointer_claim(records, job, seq=1) is not None
    assert sweeps(pool, job.id) == 0


def unsent_outbox(pool: ConnectionPool, job_id: UUID) -> list[tuple]:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT id FROM job_outbox WHERE job_id = %s AND sent_at IS NULL", (job_id,)
        ).fetchall()


def test_outbox_claims_reclaim_and_mark_sent(pool, handoff) -> None:
    repo = repo_for(pool, handoff)
    mine = DispatchRecords(pool=pool, relay_id="relay-1")
    other = DispatchRecords(pool=pool, relay_id="relay-2")
    job = repo.enqueue(req("x")).job
    assert other.claim_outbox(limit=10, reclaim_after=timedelta(minutes=1)) == []
    time.sleep(0.05)
    (row,) = other.claim_outbox(limit=10, reclaim_after=timedelta(0))  # relay-1 "died"
    assert (row.job_id, row.dispatch_seq) == (job.id, 1)
    other.release([row.id])
    (again,) = mine.claim_outbox(limit=10, reclaim_after=timedelta(minutes=1))
    mine.mark_sent([again.id])
    assert mine.claim_outbox(limit=10, reclaim_after=timedelta(0)) == []
    assert mine.backlog().unsent == 0
    with pool.connection() as conn:
        dispatched = conn.execute(
            "SELECT dispatched_at FROM job WHERE id = %s", (job.id,)
        ).fetchone()
    assert dispatched is not None and dispatched[0] is not None


def test_the_relay_never_skips_a_row_that_commits_late(pool, handoff) -> None:
    repo = repo_for(pool, handoff)
    records = DispatchRecords(pool=pool, relay_id="relay-9")
    with repo.transaction() as slow:  # takes the lower outbox id, commits last
        repo.enqueue_txn(UnitOfWork(slow), req("slow"))
        repo.enqueue(req("fast"))
        first = records.claim_outbox(limit=10, reclaim_after=timedelta(0))
        records.mark_sent([r.id for r in first])
    late = records.claim_outbox(limit=10, reclaim_after=timedelta(0))
    assert [r.id for r in late] and all(r.id < first[0].id for r in late)


def test_a_dead_letter_parks_only_a_spent_job_of_its_own_generation(pool, handoff) -> None:
    repo, records = repo_for(pool, handoff, SHORT), DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("poison", max_attempts=1)).job
    held = pointer_claim(records, job, 1)
    assert held is not None and held.attempts == 1  # it killed its consumer: the lease expires
    time.sleep(0.45)
    stale = records.park_dead_letter(job_id=job.id, project_id=P, seq=7, reason="limit")
    assert stale is DeadLetterOutcome.MOVED_ON
    parked = records.park_dead_letter(job_id=job.id, project_id=P, seq=1, reason="limit")
    assert parked is DeadLetterOutcome.PARKED
    after = repo.get(job.id)
    assert after is not None and after.state is JobState.AWAITING_HUMAN
    (gate,) = repo.open_gates(P)
    assert gate.kind == "delivery_exhausted" and gate.context["reason"] == "limit"
    again = records.park_dead_letter(job_id=job.id, project_id=P, seq=1, reason="again")
    assert again is DeadLetterOutcome.MOVED_ON


def test_a_dead_letter_with_attempts_left_is_dispatched_afresh(pool, handoff) -> None:
    repo, records = repo_for(pool, handoff), DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("innocent")).job  # co-delivered with a killer, never claimed
    outcome = records.park_dead_letter(job_id=job.id, project_id=P, seq=1, reason="limit")
    assert outcome is DeadLetterOutcome.REDISPATCHED
    after = repo.get(job.id)
    assert after is not None and after.state is JobState.READY and after.dispatch_seq == 2
    assert [row[0] for row in outbox(pool, job.id)] == [1, 2] and repo.open_gates(P) == []


def test_snapshot_reports_what_the_miss_policy_needs(pool, handoff) -> None:
    repo, records = repo_for(pool, handoff), DispatchRecords(pool=pool, relay_id="relay-1")
    parent = repo.enqueue(req("p")).job
    child = repo.enqueue(req("c", depends_on=(parent.id,), delay=timedelta(minutes=5))).job
    snap = records.snapshot(job_id=child.id, project_id=P)
    assert snap is not None and not snap.deps_met and snap.dispatch_seq == 0
    assert snap.run_after > snap.now and snap.state is JobState.READY
    assert records.snapshot(job_id=child.id, project_id="elsewhere") is None


# --- a short step's claim: locked, written once by its settle (lock_pointer) -------------------


def locked_claim(records: DispatchRecords, unit: UnitOfWork, job: Job, **kw) -> Job | None:
    return records.claim_pointer_txn(
        unit, job_id=job.id, project_id=P, seq=1, owner="w", locked=True, **kw
    )


def job_updates(unit: UnitOfWork) -> int:
    """Rows of ``job`` this transaction updated so far (PostgreSQL's own count)."""
    row = unit.conn.execute("SELECT pg_stat_get_xact_tuples_updated('job'::regclass)").fetchone()
    assert row is not None
    return int(row[0])


def test_a_locked_claim_writes_nothing_and_its_ack_writes_the_row_once(pool, handoff) -> None:
    repo = repo_for(pool, handoff)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("once")).job
    with repo.units.begin() as unit:
        claimed = locked_claim(records, unit, job)
        assert claimed is not None and claimed.state is JobState.LEASED
        assert (claimed.attempts, claimed.lease_owner) == (1, "w")
        row = unit.conn.execute("SELECT state, attempts FROM job WHERE id = %s", (job.id,))
        assert row.fetchone() == ("ready", 0) and job_updates(unit) == 0  # locked, not written
        assert repo.ack_txn(unit, claimed.lease, result={"ok": 1}).applied
        assert job_updates(unit) == 1  # the claim's columns and the ack's in one write
    done = repo.get(job.id)
    assert done is not None and done.state is JobState.SUCCEEDED
    assert (done.attempts, done.result, done.lease_owner) == (1, {"ok": 1}, None)


def test_a_locked_claim_holds_the_row_against_another_claim(pool, handoff) -> None:
    repo = repo_for(pool, handoff)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("held")).job
    with repo.units.begin() as unit:
        assert locked_claim(records, unit, job) is not None
        with pool.connection() as other:
            other.execute("SET lock_timeout = '200ms'")
            with pytest.raises(Exception, match="lock timeout"):
                other.execute("UPDATE job SET updated_at = now() WHERE id = %s", (job.id,))


def test_a_locked_claim_is_written_before_a_settle_other_than_an_ack(pool, handoff) -> None:
    repo = repo_for(pool, handoff, SHORT)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("nacked", max_attempts=3)).job
    with repo.units.begin() as unit:
        claimed = locked_claim(records, unit, job)
        assert claimed is not None
        failed = repo.nack_txn(unit, claimed.lease, error="boom", failure_class=FailureClass.WORK)
        assert failed.applied and job_updates(unit) == 2  # the claim, then the nack
    again = repo.get(job.id)
    assert again is not None and again.state is JobState.READY
    assert (again.attempts, again.last_error, again.dispatch_seq) == (1, "boom", 2)


def test_a_locked_claim_taking_over_an_expired_lease_is_written_at_once(pool, handoff) -> None:
    repo = repo_for(pool, handoff, SHORT)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("taken")).job
    assert pointer_claim(records, job, 1, owner="died") is not None
    time.sleep(0.45)  # its lease (300 ms) expires
    with repo.units.begin() as unit:
        taken = locked_claim(records, unit, job)
        assert taken is not None and taken.lease_expired and taken.attempts == 2
        row = unit.conn.execute("SELECT lease_owner, attempts FROM job WHERE id = %s", (job.id,))
        assert row.fetchone() == ("w", 2)  # written, as claim_pointer writes a takeover
        assert repo.ack_txn(unit, taken.lease).applied
    done = repo.get(job.id)
    assert done is not None and done.state is JobState.SUCCEEDED and done.attempts == 2


def test_a_locked_claim_of_a_held_pointer_marks_it_sent_and_stamps_the_dispatch(
    pool, handoff
) -> None:
    repo = repo_for(pool, handoff)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("held-pointer")).job
    with pool.connection() as conn:
        row = conn.execute("SELECT id FROM job_outbox WHERE job_id = %s", (job.id,)).fetchone()
    assert row is not None
    with repo.units.begin() as unit:
        claimed = locked_claim(records, unit, job, sent=row[0])
        assert claimed is not None
        assert repo.ack_txn(unit, claimed.lease).applied
    assert outbox(pool, job.id)[0][2]  # sent
    with pool.connection() as conn:
        stamped = conn.execute("SELECT dispatched_at FROM job WHERE id = %s", (job.id,))
        assert stamped.fetchone()[0] is not None


def test_the_ack_of_a_locked_claim_is_read_after_the_commit(pool, handoff) -> None:
    """Its row lock fences it till the commit: the ack is sent, not read, and the unit's
    COMMIT brings its result back."""
    repo = repo_for(pool, handoff)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    job = repo.enqueue(req("unread")).job
    with repo.units.begin() as unit:
        claimed = locked_claim(records, unit, job)
        assert claimed is not None
        assert repo.ack_txn(unit, claimed.lease).applied
        assert unit.unread_keys() == [] and len(unit._unread) == 1  # read after the commit
    done = repo.get(job.id)
    assert done is not None and done.state is JobState.SUCCEEDED


def test_a_locked_claim_with_dependents_releases_them_in_its_unit(pool, handoff) -> None:
    repo = repo_for(pool, handoff)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    parent = repo.enqueue(req("parent-in-unit")).job
    child = repo.enqueue(req("child-in-unit", depends_on=(parent.id,))).job
    with repo.units.begin() as unit:
        claimed = locked_claim(records, unit, parent)
        assert claimed is not None
        assert repo.ack_txn(unit, claimed.lease).applied
        assert [p.job_id for p in unit.pointers] == [child.id]  # released before the commit
    assert [row[0] for row in outbox(pool, child.id)] == [1]


def test_a_dependent_written_after_the_lock_is_released_after_the_commit(pool, handoff) -> None:
    """A job that starts waiting on the parent after the parent's claim locked it (and
    before its ack) is released once the ack committed, in a unit of its own."""
    repo = repo_for(pool, handoff)
    records = DispatchRecords(pool=pool, relay_id="relay-1")
    parent = repo.enqueue(req("parent-late")).job
    with repo.units.begin() as unit:
        claimed = locked_claim(records, unit, parent)
        assert claimed is not None
        # Another writer: its enqueue sees the parent not yet succeeded, so keeps it waiting.
        child = repo.enqueue(req("child-late", depends_on=(parent.id,))).job
        assert child.dispatch_seq == 0
        assert repo.ack_txn(unit, claimed.lease).applied
        assert unit.pointers == ()  # nothing released in the unit
    assert [row[0] for row in outbox(pool, child.id)] == [1]
    released = repo.get(child.id)
    assert released is not None and released.dispatch_seq == 1
