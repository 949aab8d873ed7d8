"""build.implement's engines on real PostgreSQL (engine_health, the ledger, parked jobs and
their gates; no broker): rotation over the script's roster, the handoff when an engine runs
out of credits, the no-loss gate's escalation to full_transcript and then to a person, and
the rule that a capacity rejection outranks a completion claim."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from actors.agents import EngineTask, EngineVerdict, FakeEngine, ScriptedEngine
from actors.handlers import HandlerContext, build_handlers
from actors.handoff import settle
from store.engine_health import EngineHealthStore
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from tests.factories import leased_job
from workflows.capacity import CreditsExhausted, WindowExhausted
from workflows.circuit import CircuitStatus, Completed, OutOfCapacity
from workflows.ledger import EventKind, NewEvent, engine_events
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Defer, Outcome, Park, Success

P = "shop"
ITEM = {"id": "api", "title": "HTTP API"}


def script(failing_briefs: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "build": {"work_items": [ITEM]},
        "engines": {"roster": [{"id": "alpha", "weight": 2}, {"id": "beta", "weight": 1}]},
        "capacity": {"credits_exhausted": [{"engine": "alpha", "item": "api", "attempt": 1}]},
        "handoff": {"failing_briefs": failing_briefs},
        **extra,
    }


class Recording(ScriptedEngine):
    """The scripted engine, keeping every task it ran."""

    def __init__(self) -> None:
        self.tasks: list[EngineTask] = []

    def run(self, task: EngineTask) -> EngineVerdict:
        self.tasks.append(task)
        return super().run(task)


def make_job(step_input: dict[str, Any], *, item: dict[str, str] = ITEM, attempts: int = 1) -> Job:
    payload = {"step": "build.implement.0.0", "input": {**step_input, "item": item}}
    return leased_job(
        "build.implement", payload, project_id=P, subject=item["id"], attempts=attempts
    )


def scripted_input(raw: dict[str, Any]) -> dict[str, Any]:
    return {"engine": {"name": "scripted", "script": raw}, "cycle": 0, "phase": "build"}


def seed_ledger(pool: ConnectionPool) -> int:
    """What DESIGN left in the project's ledger: an open question, a decision, an open
    finding, the spec, and what it cost. Returns the number of events."""
    events = [
        NewEvent(EventKind.QuestionAsked, {"id": "design.q.0.db", "question": "Which DB?"}),
        NewEvent(EventKind.DecisionRecorded, {"id": "design.accept.0.0", "decision": "accept"}),
        NewEvent(EventKind.FindingRaised, {"id": "finding:f1", "text": "slow list"}),
        NewEvent(EventKind.ArtifactProduced, {"id": "design.spec.0.0", "artifact": "spec"}),
        NewEvent(EventKind.BudgetSpent, {"engine": "alpha", "turns": 4, "dollars": 0}),
    ]
    Ledger(pool).append(P, events)
    return len(events)


@pytest.fixture
def engine() -> Recording:
    return Recording()


@pytest.fixture
def implement(pool: ConnectionPool, tmp_path: Path, engine: Recording) -> Any:
    # The job repository a worker's graph hands its handlers (actors.worker.handler_context):
    # each attempt's engine is recorded on the job through it.
    jobs = PostgresJobRepository(pool=pool)
    handlers = build_handlers(
        HandlerContext(pool=pool, jobs=jobs, workspace=tmp_path, engines={"scripted": engine})
    )
    return handlers["build.implement"]


def kinds(outcome: Success) -> list[str]:
    return [e["kind"] for e in outcome.result["evidence"]["ledger"]]


def engine_row(pool: ConnectionPool, engine_id: str) -> tuple[Any, ...]:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT capacity_state, resets_at, circuit_state, probe_kind FROM engine_health "
            "WHERE engine_id = %s",
            (engine_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


# -- rotation ------------------------------------------------------------------------------


def test_each_new_item_is_a_boundary_where_the_roster_rotates_by_weight(
    pool: ConnectionPool, implement: Any
) -> None:
    raw = {**script(), "capacity": {}}
    chosen = []
    for n in range(6):
        item = {"id": f"i{n}", "title": f"item {n}"}
        outcome = implement(make_job(scripted_input(raw), item=item))
        assert isinstance(outcome, Success), outcome
        chosen.append(outcome.result["evidence"]["ledger"][0]["payload"]["engine"])
    assert chosen == ["alpha", "beta", "alpha"] * 2  # smooth weighted round robin, 2:1
    store = EngineHealthStore(pool=pool)
    assert {h.engine_id for h in store.all()} == {"alpha", "beta"}
    assert all(h.authenticated_at is not None for h in store.all())


# -- the handoff ---------------------------------------------------------------------------


def test_credits_exhausted_hands_off_through_the_gate_to_the_next_engine(
    pool: ConnectionPool, implement: Any, engine: Recording, tmp_path: Path
) -> None:
    events = seed_ledger(pool)
    outcome = implement(make_job(scripted_input(script())))
    assert isinstance(outcome, Success), outcome
    # The incoming engine's result is the step's: it implemented and committed the item.
    assert outcome.result["status"] == "done" and outcome.result["branch"] == "vibey/c0/api"
    assert kinds(outcome) == [
        "TurnRequested",
        "TurnCompleted",
        "BudgetSpent",
        "CapacityRejected",
        "HandoffInitiated",
        "HandoffAccepted",
        "TurnRequested",
        "TurnCompleted",
        "BudgetSpent",
    ]
    ledger = outcome.result["evidence"]["ledger"]
    engine_events(outcome.result["evidence"])  # every entry is one this vibey may write
    assert [e["payload"].get("engine") for e in ledger if e["kind"] == "TurnCompleted"] == [
        "alpha",
        "beta",
    ]
    initiated, accepted = ledger[4]["payload"], ledger[5]["payload"]
    assert (initiated["from"], initiated["to"], initiated["reason"]) == (
        "alpha",
        "beta",
        "CreditsExhausted",
    )
    assert (accepted["mode"], accepted["briefs"], accepted["rounds"]) == ("brief", 1, 1)
    [handoff] = outcome.result["evidence"]["handoffs"]
    assert handoff["briefs"] == [{"brief": 1, "by": "alpha", "mode": "brief", "failed": []}]
    # The seed: the brief, and the range as a file in the worktree that the prompt names.
    seeded = engine.tasks[-1]
    assert seeded.input["engine_id"] == "beta"
    seed = seeded.input["handoff"]
    worktree = tmp_path / P / "worktrees" / "c0-api"
    path = worktree / ".vibey" / "handoff" / "ledger.jsonl"
    assert seed["ledger_file"] == str(path) and str(path) in seed["prompt"]
    assert [i["id"] for i in seed["brief"]["open_questions"]] == ["design.q.0.db"]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["seq"] for line in lines] == list(range(1, events + 1))
    assert outcome.result["evidence"]["seed"]["ledger_events"] == events
    committed = git(worktree, "show", "--name-only", "--format=", "HEAD")
    assert committed == "src/api.txt"  # the ledger file is never committed
    # engine_health: the outgoing circuit is open on spent credits, with no reset time.
    assert engine_row(pool, "alpha") == ("CreditsExhausted", None, "open", "backoff")
    assert engine_row(pool, "beta") == ("Available", None, "closed", None)
    alpha = EngineHealthStore(pool=pool).get("alpha").circuit
    assert isinstance(alpha.capacity, CreditsExhausted) and alpha.is_open


def test_a_brief_that_keeps_failing_escalates_to_full_transcript(
    pool: ConnectionPool, implement: Any, engine: Recording, tmp_path: Path
) -> None:
    events = seed_ledger(pool)
    outcome = implement(make_job(scripted_input(script(failing_briefs=4))))
    assert isinstance(outcome, Success), outcome
    [handoff] = outcome.result["evidence"]["handoffs"]
    assert [(b["mode"], b["failed"]) for b in handoff["briefs"]] == [
        ("brief", ["R2"]),
        ("brief", ["R2"]),
        ("brief", ["R2"]),
        ("brief", ["R2"]),
        ("full_transcript", []),
    ]
    accepted = outcome.result["evidence"]["ledger"][5]["payload"]
    assert (accepted["mode"], accepted["briefs"]) == ("full_transcript", 5)
    seed = engine.tasks[-1].input["handoff"]
    path = tmp_path / P / "worktrees" / "c0-api" / ".vibey" / "handoff" / "ledger.jsonl"
    assert seed["mode"] == "full_transcript"
    assert str(path) in seed["prompt"]  # named in the seed prompt ...
    assert "Which DB?" not in seed["prompt"]  # ... and not inlined there
    assert len(path.read_text().splitlines()) == events


def test_still_failing_parks_behind_a_handoff_gate_and_retry_starts_a_new_round(
    pool: ConnectionPool, implement: Any
) -> None:
    seed_ledger(pool)
    jobs = PostgresJobRepository(pool=pool)
    raw = script(failing_briefs=5)
    jobs.enqueue(
        EnqueueRequest(
            project_id=P,
            kind="build.implement",
            subject="api",
            payload={"input": {**scripted_input(raw), "item": ITEM}},
        )
    )
    [job] = jobs.claim(P, owner="test")
    parked = implement(job)
    assert isinstance(parked, Park), parked
    gate = parked.gate
    assert (gate.kind, gate.answers) == ("handoff", ("retry", "cancel"))
    assert gate.context["failed_rules"] == ["R6"] and gate.context["mode"] == "full_transcript"
    assert [a["mode"] for a in gate.context["attempts"]] == ["brief"] * 4 + ["full_transcript"]
    assert (gate.context["outgoing"], gate.context["incoming"]) == ("alpha", "beta")
    assert "could not pass the no-loss gate" in gate.prompt
    # Parked, the step settles no evidence: the rejection and the handoff are written now.
    written = [e.kind_name for e in Ledger(pool).read(P) if e.job_id == job.id]
    assert written == [
        "TurnRequested",
        "TurnCompleted",
        "BudgetSpent",
        "CapacityRejected",
        "HandoffInitiated",
    ]
    assert jobs.park(job.lease, gate).applied
    gate_id = jobs.open_gates(P)[0].id
    jobs.answer_gate(gate_id, answer="retry", answered_by="test")
    [again] = jobs.claim(P, owner="test")
    assert again.attempts == 2
    outcome = implement(again)
    assert isinstance(outcome, Success), outcome
    assert kinds(outcome) == [
        "HandoffAccepted",
        "TurnRequested",
        "TurnCompleted",
        "BudgetSpent",
    ]  # alpha is not asked again: it has no credits
    accepted = outcome.result["evidence"]["ledger"][0]["payload"]
    assert (accepted["rounds"], accepted["briefs"], accepted["mode"]) == (2, 6, "brief")
    assert outcome.result["evidence"]["ledger"][1]["payload"]["engine"] == "beta"


def test_a_cancelled_handoff_waits_for_the_outgoing_engine(
    pool: ConnectionPool, implement: Any, engine: Recording
) -> None:
    jobs = PostgresJobRepository(pool=pool)
    raw = script(failing_briefs=99)
    payload = {"input": {**scripted_input(raw), "item": ITEM}}
    jobs.enqueue(
        EnqueueRequest(project_id=P, kind="build.implement", subject="api", payload=payload)
    )
    [job] = jobs.claim(P, owner="test")
    parked = implement(job)
    assert isinstance(parked, Park)
    jobs.park(job.lease, parked.gate)
    jobs.answer_gate(jobs.open_gates(P)[0].id, answer="cancel", answered_by="ops")
    [again] = jobs.claim(P, owner="test")
    ran = len(engine.tasks)
    waiting = implement(again)
    assert isinstance(waiting, Defer) and waiting.capacity, waiting
    assert "cancelled by ops" in waiting.reason and "alpha" in waiting.reason
    assert len(engine.tasks) == ran  # alpha's circuit is open: nobody ran, beta least of all


# -- a capacity rejection outranks a completion claim --------------------------------------


def _claims_done_but_was_refused(task: EngineTask) -> EngineVerdict:
    rejected = {"kind": "CapacityRejected", "payload": {"state": "CreditsExhausted"}}
    return EngineVerdict("ok", result={"status": "done"}, evidence={"ledger": [rejected]})


def test_a_capacity_rejection_outranks_a_completion_claim(
    pool: ConnectionPool, tmp_path: Path
) -> None:
    fake = FakeEngine(respond=_claims_done_but_was_refused)
    handlers = build_handlers(HandlerContext(pool=pool, workspace=tmp_path, engines={"fake": fake}))
    job = make_job({"engine": {"name": "fake"}, "cycle": 0, "phase": "build"})
    outcome: Outcome = handlers["build.implement"](job)
    assert not isinstance(outcome, Success)
    assert isinstance(outcome, Defer) and outcome.capacity
    assert "outranks a completion claim" in outcome.reason
    assert engine_row(pool, "fake") == ("CreditsExhausted", None, "open", "backoff")
    written = [e.kind_name for e in Ledger(pool).read(P)]
    assert written == ["CapacityRejected"]


def test_a_refused_claim_on_one_engine_is_completed_by_the_next() -> None:
    settled, verdict = settle("alpha", _claims_done_but_was_refused(_task()))
    assert isinstance(settled, OutOfCapacity) and isinstance(settled.state, CreditsExhausted)
    assert verdict.status == "capacity" and verdict.result["capacity"]["state"] == (
        "CreditsExhausted"
    )
    done, same = settle("beta", EngineVerdict("ok", result={"status": "done"}))
    assert isinstance(done, Completed) and same.status == "ok"
    # A capacity verdict naming no state is read as spent credits: no reset time to wait for.
    bare, _ = settle("gamma", EngineVerdict("capacity", detail="busy"))
    assert isinstance(bare, OutOfCapacity) and isinstance(bare.state, CreditsExhausted)


def _task() -> EngineTask:
    return EngineTask("build.implement", P, 0, "api", 1, {})


def test_a_rate_limit_window_defers_without_a_handoff(pool: ConnectionPool, tmp_path: Path) -> None:
    resets = datetime.now(UTC) + timedelta(minutes=5)
    window = {"state": "WindowExhausted", "resets_at": resets.isoformat(), "detail": "429"}
    fake = FakeEngine(respond=lambda task: EngineVerdict("capacity", {"capacity": window}))
    handlers = build_handlers(HandlerContext(pool=pool, workspace=tmp_path, engines={"fake": fake}))
    outcome = handlers["build.implement"](
        make_job({"engine": {"name": "fake"}, "cycle": 0, "phase": "build"})
    )
    assert isinstance(outcome, Defer) and outcome.capacity
    circuit = EngineHealthStore(pool=pool).get("fake").circuit
    assert circuit.status is CircuitStatus.OPEN
    assert isinstance(circuit.capacity, WindowExhausted) and circuit.capacity.resets_at == resets
    [rejected] = Ledger(pool).read(P)  # deferred, the step settles no evidence: written now
    assert rejected.kind_name == "CapacityRejected" and rejected.payload["state"] == (
        "WindowExhausted"
    )
    # The only engine's circuit is open: the next item waits for capacity, nobody runs it.
    again = handlers["build.implement"](
        make_job({"engine": {"name": "fake"}, "cycle": 0, "phase": "build"})
    )
    assert isinstance(again, Defer) and again.capacity and "no engine" in again.reason
    assert len(fake.tasks) == 1


def test_without_a_pool_the_roster_still_hands_off(tmp_path: Path) -> None:
    engine = Recording()
    handlers = build_handlers(
        HandlerContext(pool=None, workspace=tmp_path, engines={"scripted": engine})
    )
    outcome = handlers["build.implement"](make_job(scripted_input(script())))
    assert isinstance(outcome, Success), outcome
    assert [t.input["engine_id"] for t in engine.tasks] == ["alpha", "beta"]
    assert kinds(outcome)[3:6] == ["CapacityRejected", "HandoffInitiated", "HandoffAccepted"]


# -- an operator's rotation ------------------------------------------------------------------


def test_an_operator_rotation_moves_the_next_attempt_off_the_projects_last_engine(
    pool: ConnectionPool, implement: Any
) -> None:
    raw = {
        "build": {"work_items": [ITEM]},
        "engines": {"roster": [{"id": "alpha", "weight": 3}, {"id": "beta", "weight": 1}]},
    }
    jobs = PostgresJobRepository(pool=pool)
    store = EngineHealthStore(pool=pool)

    def attempt(n: int) -> str:
        item = {"id": f"i{n}", "title": f"item {n}"}
        payload = {"step": f"build.implement.0.{n}", "input": {**scripted_input(raw), "item": item}}
        jobs.enqueue(EnqueueRequest(P, "build.implement", subject=item["id"], payload=payload))
        [job] = jobs.claim(P, owner="w", kinds=["build.implement"])
        outcome = implement(job)
        assert isinstance(outcome, Success), outcome
        engine = str(outcome.result["evidence"]["ledger"][0]["payload"]["engine"])
        held = jobs.get(job.id)
        assert held is not None and held.engine_id == engine  # recorded on the job
        assert jobs.ack(job.lease, result={}).applied
        return engine

    assert store.take_rotation(P) is None
    assert attempt(0) == "alpha"  # 3:1 — left alone, the next pick is alpha again
    request = store.request_rotation(P, by="ops")
    assert (request.away_from, request.requested_by) == ("alpha", "ops")
    assert attempt(1) == "beta"  # the operator-request boundary, away from alpha
    assert store.take_rotation(P) is None  # the attempt took the request
    assert attempt(2) == "alpha"


def test_a_rotation_asked_before_any_engine_ran_names_none(pool: ConnectionPool) -> None:
    store = EngineHealthStore(pool=pool)
    first = store.request_rotation("fresh", by="ops")
    assert first.away_from is None
    again = store.request_rotation("fresh", by="lee")
    assert again.requested_by == "lee"  # asking again replaces the open request
    taken = store.take_rotation("fresh")
    assert taken is not None and taken.requested_by == "lee"
    assert store.take_rotation("fresh") is None
