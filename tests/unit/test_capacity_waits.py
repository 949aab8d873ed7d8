"""Capacity waits are bounded in every kind, not only build.implement: a step refused for
capacity defers without spending an attempt until its ledger holds ``capacity_waits``
rejections since its last ``capacity_exhausted`` answer; then it parks behind that gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.agents import EngineVerdict, FakeEngine
from actors.handlers import CAPACITY_WAITS, HandlerContext, Steps
from store.memory import ManualClock, MemoryJobRepository
from store.memory_records import MemoryStepRecords
from workflows.gates import CAPACITY_EXHAUSTED, ENGINE_GATES, Grant
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Defer, Park

P = "shop"
CREDITS = EngineVerdict(
    "capacity", result={"capacity": {"state": "CreditsExhausted"}}, detail="credit balance low"
)


def claimed(jobs: MemoryJobRepository, kind: str) -> Job:
    payload = {"input": {"engine": {"name": "fake"}, "cycle": 0}}
    jobs.enqueue(EnqueueRequest(project_id=P, kind=kind, subject="s", payload=payload))
    [job] = jobs.claim(P, owner="worker", kinds=[kind])
    return job


@pytest.mark.parametrize("kind", ["design.spec", "review.triage", "deploy.execute"])
def test_a_kind_outside_build_parks_once_its_capacity_waits_are_spent(
    tmp_path: Path, kind: str
) -> None:
    jobs = MemoryJobRepository(clock=ManualClock())
    records = MemoryStepRecords(jobs)
    fake = FakeEngine(verdicts={kind: CREDITS})
    steps = Steps(
        HandlerContext(pool=None, workspace=tmp_path, engines={"fake": fake}, records=records)
    )
    job = claimed(jobs, kind)
    records.rejections[job.id] = CAPACITY_WAITS - 1
    waited = steps.run(job)
    assert isinstance(waited, Defer) and waited.capacity, waited
    records.rejections[job.id] = CAPACITY_WAITS
    parked = steps.run(job)
    assert isinstance(parked, Park), parked
    assert parked.gate.kind == CAPACITY_EXHAUSTED.name
    assert parked.gate.answers == ("retry",)
    assert f"refused for capacity {CAPACITY_WAITS} times" in parked.gate.prompt
    assert parked.gate.context["kind"] == kind


def test_the_bound_is_a_setting_of_the_handlers(tmp_path: Path) -> None:
    jobs = MemoryJobRepository(clock=ManualClock())
    records = MemoryStepRecords(jobs)
    fake = FakeEngine(verdicts={"design.spec": CREDITS})
    context = HandlerContext(
        pool=None, workspace=tmp_path, engines={"fake": fake}, records=records, capacity_waits=1
    )
    job = claimed(jobs, "design.spec")
    records.rejections[job.id] = 1
    assert isinstance(Steps(context).run(job), Park)


def test_the_gate_refunds_the_attempt_its_parked_claim_counted() -> None:
    assert ENGINE_GATES[CAPACITY_EXHAUSTED.name].grant is Grant.REFUND
    assert ENGINE_GATES.problem(CAPACITY_EXHAUSTED.name, "retry") is None
