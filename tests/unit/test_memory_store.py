"""The in-memory fakes (store/memory.py, store/memory_records.py) keep the promises the unit
tests lean on: a unit of work is all or nothing, enqueue is idempotent, dependencies hold a job
back, writes are fenced on the lease, and the records read answers as the named SQL does."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from store.memory import ManualClock, MemoryJobRepository
from store.memory_records import MemoryStepRecords
from store.unit_of_work import OutboxRow
from workflows.gates import GRANT_SCHEMA, SPEND_EXHAUSTED
from workflows.job import FailureClass, JobState
from workflows.queue import EnqueueRequest, GateRequest, UnknownDependencyError

P = "proj"


def req(subject: str, **kw: Any) -> EnqueueRequest:
    return EnqueueRequest(P, "design.interview", subject=subject, **kw)


def test_a_unit_that_raises_leaves_nothing_behind_and_publishes_nothing() -> None:
    published: list[OutboxRow] = []
    jobs = MemoryJobRepository(clock=ManualClock(), dispatch=True, after_commit=published.extend)
    with pytest.raises(RuntimeError), jobs.units.begin() as unit:
        jobs.enqueue_txn(unit, req("a"))
        raise RuntimeError("rolled back")
    assert sum(jobs.queue_depth(P).values()) == 0 and published == []
    with jobs.units.begin() as unit:
        job = jobs.enqueue_txn(unit, req("a")).job
    assert [(p.job_id, p.dispatch_seq) for p in published] == [(job.id, 1)]


def test_enqueue_is_idempotent_and_an_unknown_dependency_writes_nothing() -> None:
    jobs = MemoryJobRepository(clock=ManualClock())
    first = jobs.enqueue(req("a"))
    assert first.created and not jobs.enqueue(req("a")).created
    with pytest.raises(UnknownDependencyError):
        jobs.enqueue_batch([req("b"), req("c", depends_on=(uuid.uuid4(),))])
    assert jobs.queue_depth(P)[JobState.READY] == 1


def test_a_dependent_waits_for_its_dependency_to_succeed() -> None:
    jobs = MemoryJobRepository(clock=ManualClock())
    parent = jobs.enqueue(req("parent")).job
    jobs.enqueue(req("child", depends_on=(parent.id,)))
    [claimed] = jobs.claim(P, owner="w", limit=5)
    assert claimed.id == parent.id
    assert jobs.ack(claimed.lease).applied
    [child] = jobs.claim(P, owner="w")
    assert child.subject == "child"


def test_writes_are_fenced_on_a_live_lease() -> None:
    clock = ManualClock()
    jobs = MemoryJobRepository(clock=clock)
    jobs.enqueue(req("a"))
    [job] = jobs.claim(P, owner="w")
    clock.advance(seconds=job.lease_timeout.total_seconds() + 1)
    assert not jobs.ack(job.lease).applied
    assert jobs.reap().requeued == 1
    [again] = jobs.claim(P, owner="w2")
    assert again.attempts == 2 and again.lease_expired
    assert not jobs.nack(job.lease, error="old", failure_class=FailureClass.WORK).applied
    settled = jobs.nack(again.lease, error="x", failure_class=FailureClass.WORK)
    assert settled.applied and settled.state is JobState.READY
    assert jobs.claim(P, owner="w") == []  # backing off
    clock.advance(hours=1)
    assert len(jobs.claim(P, owner="w")) == 1


def test_spend_grants_add_up_by_bound_and_the_last_answer_is_the_latest() -> None:
    clock = ManualClock()
    jobs = MemoryJobRepository(clock=clock)
    records = MemoryStepRecords(jobs)
    jobs.enqueue(req("a", max_attempts=9))
    for answer, bound in (("2", "max_dollars"), ("3", "max_dollars"), ("5", "max_turns")):
        [job] = jobs.claim(P, owner="w")
        context = {"grant": bound}
        gate = GateRequest(SPEND_EXHAUSTED.name, "more?", context=context, schema=GRANT_SCHEMA)
        assert jobs.park(job.lease, gate).applied
        clock.advance(seconds=1)
        assert jobs.answer_gate(jobs.open_gates(P)[0].id, answer=answer, answered_by="a").applied
    assert records.spend_granted(job.id, SPEND_EXHAUSTED.name) == {
        "max_dollars": 5.0,
        "max_turns": 5.0,
    }
    assert records.attempts_granted(job.id, SPEND_EXHAUSTED.name) == 10
    last = records.last_answer(job.id, SPEND_EXHAUSTED.name)
    assert last is not None and (last.answer, last.context) == ("5", {"grant": "max_turns"})
    assert records.last_answer(job.id, "handoff") is None
    assert jobs.get(job.id) is not None
    assert records.lease_held(str(job.id), "anyone") is False
    [held] = jobs.claim(P, owner="w")
    assert records.lease_held(str(held.id), str(held.lease_token))
    assert jobs.defer(held.lease, delay=timedelta(0), reason="r").applied
    assert not records.lease_held(str(held.id), str(held.lease_token))
