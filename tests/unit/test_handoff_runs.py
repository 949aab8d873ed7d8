"""build.implement's handoff (actors/handoff.py) on the in-memory fakes: the handoff gate's
answer is read through ``store.memory_records.MemoryStepRecords`` from a ``MemoryJobRepository``
where the job parked and was answered (tests/integration/test_handoff.py runs the same flows
on PostgreSQL, with engine_health and the ledger)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.agents import EngineTask, EngineVerdict, ScriptedEngine
from actors.handoff import Handoffs
from actors.worktrees import Workspace
from store.memory import ManualClock, MemoryJobRepository
from store.memory_records import MemoryStepRecords
from store.step_records import GateAnswer
from workflows.phases import Phase
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Defer, Park

P = "shop"
ITEM = {"id": "api", "title": "HTTP API"}


def script(failing_briefs: int = 0, exhausted: tuple[int, ...] = (1,)) -> dict[str, Any]:
    return {
        "build": {"work_items": [ITEM]},
        "engines": {"roster": [{"id": "alpha", "weight": 2}, {"id": "beta", "weight": 1}]},
        "capacity": {
            "credits_exhausted": [
                {"engine": "alpha", "item": "api", "attempt": n} for n in exhausted
            ]
        },
        "handoff": {"failing_briefs": failing_briefs},
    }


class Recording(ScriptedEngine):
    def __init__(self) -> None:
        self.tasks: list[EngineTask] = []

    def run(self, task: EngineTask) -> EngineVerdict:
        self.tasks.append(task)
        return super().run(task)

    def ran(self) -> list[str]:
        return [str(t.input["engine_id"]) for t in self.tasks]


@pytest.fixture
def jobs() -> MemoryJobRepository:
    return MemoryJobRepository(clock=ManualClock())


@pytest.fixture
def engine() -> Recording:
    return Recording()


def enqueue(jobs: MemoryJobRepository, raw: dict[str, Any]) -> Job:
    step_input = {"engine": {"name": "scripted", "script": raw}, "cycle": 0, "phase": "build"}
    payload = {"input": {**step_input, "item": ITEM}}
    jobs.enqueue(EnqueueRequest(P, "build.implement", subject="api", payload=payload))
    [job] = jobs.claim(P, owner="worker")
    return job


def attempt(handoffs: Handoffs, job: Job, engine: Recording, tmp_path: Path) -> Any:
    worktree = Workspace(tmp_path).worktree(P, 0, "api")  # the scripted engine commits
    task = EngineTask(
        "build.implement",
        P,
        0,
        "api",
        job.attempts,
        job.payload["input"],
        worktree,
        workdir=worktree,
        job_id=str(job.id),
    )
    return handoffs.run(job, task, engine, phase=Phase.BUILD)


def entries(verdict: EngineVerdict) -> list[str]:
    return [e["kind"] for e in verdict.evidence["ledger"]]


def parked_then_answered(
    jobs: MemoryJobRepository, handoffs: Handoffs, engine: Recording, tmp_path: Path, answer: str
) -> Job:
    """The job's first attempt parks behind a handoff gate, which ``answer`` answers; the
    job claimed again."""
    job = enqueue(jobs, script(failing_briefs=99, exhausted=(1, 2)))
    parked = attempt(handoffs, job, engine, tmp_path)
    assert isinstance(parked, Park), parked
    assert jobs.park(job.lease, parked.gate).applied
    [gate] = jobs.open_gates(P)
    assert jobs.answer_gate(gate.id, answer=answer, answered_by="ops").applied
    [again] = jobs.claim(P, owner="worker")
    return again


def test_spent_credits_hand_the_item_to_the_next_engine(
    jobs: MemoryJobRepository, engine: Recording, tmp_path: Path
) -> None:
    handoffs = Handoffs(None, records=MemoryStepRecords(jobs), jobs=jobs)
    job = enqueue(jobs, script())
    verdict = attempt(handoffs, job, engine, tmp_path)
    assert isinstance(verdict, EngineVerdict) and verdict.status == "ok", verdict
    assert engine.ran() == ["alpha", "beta"]
    held = jobs.get(job.id)  # each attempt's engine recorded on the job, the last one kept
    assert held is not None and held.engine_id == "beta"
    assert "HandoffInitiated" in entries(verdict) and "HandoffAccepted" in entries(verdict)
    seed = engine.tasks[-1].input["handoff"]
    assert (seed["from"], seed["to"]) == ("alpha", "beta")
    worktree = tmp_path / P / "worktrees" / "c0-api"
    assert seed["ledger_file"] == str(worktree / ".vibey" / "handoff" / "ledger.jsonl")


def test_no_passing_brief_parks_behind_a_handoff_gate(
    jobs: MemoryJobRepository, engine: Recording, tmp_path: Path
) -> None:
    handoffs = Handoffs(None, records=MemoryStepRecords(jobs))  # no job repository given:
    job = enqueue(jobs, script(failing_briefs=99))
    parked = attempt(handoffs, job, engine, tmp_path)
    assert isinstance(parked, Park), parked
    held = jobs.get(job.id)
    assert held is not None and held.engine_id is None  # ...no engine recorded
    gate = parked.gate
    assert (gate.kind, gate.answers) == ("handoff", ("retry", "cancel"))
    context = gate.context
    assert (context["outgoing"], context["incoming"], context["attempt"]) == ("alpha", "beta", 1)
    assert engine.ran() == ["alpha"]  # beta is never run on a brief that did not pass


def test_a_retry_answer_starts_a_new_round_from_the_same_outgoing_engine(
    jobs: MemoryJobRepository, engine: Recording, tmp_path: Path
) -> None:
    handoffs = Handoffs(None, records=MemoryStepRecords(jobs))
    again = parked_then_answered(jobs, handoffs, engine, tmp_path, "retry")
    assert again.attempts == 2
    ran = len(engine.tasks)
    outcome = attempt(handoffs, again, engine, tmp_path)
    # The new round's briefs fail too (failing_briefs=99): it parks again, round 2, and the
    # outgoing engine is not run again for it.
    assert isinstance(outcome, Park), outcome
    assert outcome.gate.context["rounds"] == 2 and outcome.gate.context["attempt"] == 2
    assert len(engine.tasks) == ran


def test_a_cancel_answer_waits_for_the_outgoing_engine_and_hands_off_to_nobody(
    jobs: MemoryJobRepository, engine: Recording, tmp_path: Path
) -> None:
    handoffs = Handoffs(None, records=MemoryStepRecords(jobs))
    again = parked_then_answered(jobs, handoffs, engine, tmp_path, "cancel")
    waiting = attempt(handoffs, again, engine, tmp_path)
    assert isinstance(waiting, Defer) and waiting.capacity, waiting
    assert "cancelled by ops" in waiting.reason and "refused again" in waiting.reason
    assert engine.ran() == ["alpha", "alpha"]  # only the outgoing engine, never beta


def test_an_answer_to_an_older_attempt_is_not_this_attempts(
    jobs: MemoryJobRepository, engine: Recording, tmp_path: Path
) -> None:
    records = MemoryStepRecords(jobs)
    handoffs = Handoffs(None, records=records)
    job = enqueue(jobs, script())
    stale = GateAnswer("cancel", "ops", {"outgoing": "alpha", "attempt": job.attempts - 2})
    records.answers.append((job.id, "handoff", stale))
    verdict = attempt(handoffs, job, engine, tmp_path)
    assert isinstance(verdict, EngineVerdict) and verdict.status == "ok"
    assert engine.ran() == ["alpha", "beta"]  # a fresh attempt: rotation, then the handoff
    current = GateAnswer("cancel", "ops", {"outgoing": "alpha", "attempt": job.attempts - 1})
    records.answers.append((job.id, "handoff", current))
    assert isinstance(attempt(handoffs, job, engine, tmp_path), Defer)  # now it applies
