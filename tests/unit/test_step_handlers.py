"""The protocol's handlers (actors/handlers.py) reading the record store through
``store.memory_records.MemoryStepRecords``: the workdir lease's fence, the spend cap and what its
gates grant, the effort ladder's grants, and the integration lock (no PostgreSQL; the real
queries run in tests/integration/test_handlers.py and tests/acceptance)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from actors.agents import EngineVerdict, FakeEngine
from actors.handlers import BUSY_DELAY, HandlerContext, Steps
from store.memory import ManualClock, MemoryJobRepository
from store.memory_records import MemoryStepRecords
from workflows.gates import LADDER_EXHAUSTED, SPEND_EXHAUSTED
from workflows.job import FailureClass
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Defer, Failure, Park, Success

P = "shop"
FAKE = {"name": "fake"}


@pytest.fixture
def jobs() -> MemoryJobRepository:
    return MemoryJobRepository(clock=ManualClock())


@pytest.fixture
def records(jobs: MemoryJobRepository) -> MemoryStepRecords:
    return MemoryStepRecords(jobs)


def claimed(jobs: MemoryJobRepository, kind: str, *, subject: str = "s", **kw: Any) -> Job:
    payload = {"input": {"engine": FAKE, "cycle": 0, "phase": "build"}}
    request = EnqueueRequest(project_id=P, kind=kind, subject=subject, payload=payload, **kw)
    jobs.enqueue(request)
    [job] = jobs.claim(P, owner="worker", kinds=[kind])
    return job


def steps(tmp_path: Path, records: MemoryStepRecords, fake: FakeEngine, **kw: Any) -> Steps:
    context = HandlerContext(
        pool=None, workspace=tmp_path, engines={"fake": fake}, records=records, **kw
    )
    return Steps(context)


# -- the workdir lease's fence ---------------------------------------------------------------


@contextmanager
def held_elsewhere(lease_holder: Steps, directory: Path, job: Job, for_s: float) -> Iterator[None]:
    """Another attempt (job ``job``) holds ``directory``'s lease for ``for_s`` seconds."""
    ready = threading.Event()

    def hold() -> None:
        with lease_holder.leases.hold(directory, str(job.id), 1, str(job.lease_token)):
            ready.set()
            time.sleep(for_s)

    thread = threading.Thread(target=hold)
    thread.start()
    ready.wait(5)
    try:
        yield
    finally:
        thread.join(10)


def test_a_workdir_held_by_a_job_the_store_still_leases_defers_the_step(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    fake = FakeEngine()
    handlers = steps(tmp_path, records, fake)
    other = claimed(jobs, "design.interview", subject="other")
    mine = claimed(jobs, "design.interview", subject="mine")
    scratch = tmp_path / P / "scratch"
    scratch.mkdir(parents=True)
    with held_elsewhere(handlers, scratch, other, 0.5):
        outcome = handlers.run(mine)
    assert isinstance(outcome, Defer) and outcome.delay == BUSY_DELAY, outcome
    assert fake.tasks == []


def test_a_workdir_held_by_a_job_whose_lease_is_gone_is_taken_over(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    fake = FakeEngine()
    handlers = steps(tmp_path, records, fake)
    other = claimed(jobs, "design.interview", subject="other")
    mine = claimed(jobs, "design.interview", subject="mine")
    assert jobs.ack(other.lease).applied  # the store no longer leases it: the fence misses
    scratch = tmp_path / P / "scratch"
    scratch.mkdir(parents=True)
    with held_elsewhere(handlers, scratch, other, 0.5):
        outcome = handlers.run(mine)
    assert isinstance(outcome, Success), outcome
    assert [t.job_id for t in fake.tasks] == [str(mine.id)]


# -- the spend cap ---------------------------------------------------------------------------


def test_a_bounded_job_over_its_spend_cap_parks_before_it_runs(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    fake = FakeEngine()
    job = claimed(jobs, "build.verify")
    records.spend(job.id, dollars=1.5, turns=3)
    outcome = steps(tmp_path, records, fake, max_dollars=1.0).run(job)
    assert isinstance(outcome, Park), outcome
    gate = outcome.gate
    assert gate.kind == SPEND_EXHAUSTED.name
    assert dict(gate.context) == {
        "kind": "build.verify",
        "grant": "max_dollars",
        "spent": 1.5,
        "limit": 1.0,
    }
    assert fake.tasks == []


def test_what_a_spend_gate_answer_granted_raises_the_cap(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    fake = FakeEngine()
    handlers = steps(tmp_path, records, fake, max_dollars=1.0, max_turns=10)
    job = claimed(jobs, "build.verify")
    records.spend(job.id, dollars=1.5)
    parked = handlers.run(job)
    assert isinstance(parked, Park)
    assert jobs.park(job.lease, parked.gate).applied
    [gate] = jobs.open_gates(P)
    assert jobs.answer_gate(gate.id, answer="2", answered_by="ann").applied
    [again] = jobs.claim(P, owner="worker")
    outcome = handlers.run(again)  # 1.5 spent of 1 + 2 granted dollars
    assert isinstance(outcome, Success), outcome
    assert len(fake.tasks) == 1
    records.spend(job.id, dollars=1.5)  # 3.0 of 3.0: the cap is reached again
    assert isinstance(handlers.run(again), Park)


def test_a_turns_cap_parks_on_turns_only(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    job = claimed(jobs, "build.verify")
    records.spend(job.id, dollars=100.0, turns=4)
    handlers = steps(tmp_path, records, FakeEngine(), max_turns=4)
    outcome = handlers.run(job)
    assert isinstance(outcome, Park)
    assert (outcome.gate.context["grant"], outcome.gate.context["limit"]) == ("max_turns", 4)


# -- the effort ladder's grants --------------------------------------------------------------


def test_a_ladder_gate_answer_grants_attempts_at_the_top_rung(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    failing = EngineVerdict("failed", detail="the tests still fail")
    fake = FakeEngine(verdicts={"build.verify": failing})
    handlers = steps(tmp_path, records, fake)
    job = claimed(jobs, "build.verify", max_attempts=3)
    for _ in range(2):  # attempts 1 and 2 climb the ladder
        outcome = handlers.run(job)
        assert isinstance(outcome, Failure) and outcome.failure_class is FailureClass.WORK
        jobs.nack(job.lease, error="x", failure_class=FailureClass.WORK, retry_in=timedelta(0))
        [job] = jobs.claim(P, owner="worker")
    parked = handlers.run(job)  # attempt 3 fails at the top: the ladder is spent
    assert isinstance(parked, Park), parked
    assert parked.gate.kind == LADDER_EXHAUSTED.name
    assert (parked.gate.context["attempts"], parked.gate.context["granted"]) == (3, 0)
    assert jobs.park(job.lease, parked.gate).applied
    assert jobs.answer_gate(jobs.open_gates(P)[0].id, answer="2", answered_by="ann").applied
    [granted] = jobs.claim(P, owner="worker")
    assert (granted.attempts, granted.max_attempts) == (4, 5)
    outcome = handlers.run(granted)  # a granted attempt: it fails without parking
    assert isinstance(outcome, Failure), outcome
    assert [t.effort for t in fake.tasks] == ["LOW", "STANDARD", "HIGH", "HIGH"]


# -- the integration lock --------------------------------------------------------------------


def test_integrate_holds_the_records_lock_for_its_project_and_cycle(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    payload = {"input": {"engine": FAKE, "items": []}}
    jobs.enqueue(EnqueueRequest(P, "build.integrate", cycle=2, payload=payload))
    [job] = jobs.claim(P, owner="worker")
    outcome = steps(tmp_path, records, FakeEngine()).integrate(job)
    assert isinstance(outcome, Success), outcome
    assert records.locks_taken == [(P, 2)]
