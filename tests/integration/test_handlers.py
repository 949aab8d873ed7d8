"""The protocol's handlers on real git worktrees, with build.integrate serialised by a real
PostgreSQL advisory lock."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from actors.agents import EngineTask, EngineVerdict, FakeEngine
from actors.handlers import NO_COMMAND, HandlerContext, build_handlers
from tests.factories import leased_job
from workflows.job import FailureClass
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import Job
from workflows.steps import Defer, Failure, Handlers, Outcome, Success

P = "demo"
SCRIPT = {"build": {"work_items": [{"id": "api", "title": "HTTP API"}]}}
SCRIPTED = {"name": "scripted", "script": SCRIPT}
ITEMS = {"api": "HTTP API", "ui": "Web UI"}


def make_job(
    kind: str,
    *,
    subject: str = "",
    cycle: int = 0,
    attempts: int = 1,
    payload: Any = None,
    **inp: Any,
) -> Job:
    step_input = {"engine": SCRIPTED, "cycle": cycle, "phase": "build", **inp}
    if payload is None:
        payload = {"workflow_id": "w", "step": kind, "subject": subject, "input": step_input}
    return leased_job(kind, payload, project_id=P, subject=subject, cycle=cycle, attempts=attempts)


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def repo(root: Path) -> Path:
    return root / P / "repo"


def merges(root: Path) -> list[str]:
    return git(repo(root), "log", "--merges", "--format=%s", "vibey/integration").splitlines()


def implement(handlers: Handlers, item: str, *, cycle: int = 0, attempts: int = 1) -> Outcome:
    job = make_job(
        "build.implement",
        subject=item,
        cycle=cycle,
        attempts=attempts,
        item={"id": item, "title": ITEMS.get(item, item)},
    )
    return handlers["build.implement"](job)


def integrate(handlers: Handlers, items: list[str], cycle: int = 0) -> Outcome:
    return handlers["build.integrate"](make_job("build.integrate", cycle=cycle, items=items))


def in_threads(*calls: Callable[[], Outcome]) -> list[Outcome]:
    results: list[Outcome | None] = [None] * len(calls)

    def run(n: int) -> None:
        results[n] = calls[n]()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(r is not None for r in results), "a thread did not finish"
    return [r for r in results if r is not None]


@pytest.fixture
def handlers(pool: ConnectionPool, tmp_path: Path) -> Handlers:
    return build_handlers(HandlerContext(pool=pool, workspace=tmp_path))


def test_all_26_names_are_registered_and_aliases_share_their_kind_handler(
    handlers: Handlers,
) -> None:
    assert set(handlers) == STEP_KINDS.names() - {"workflow.timer"}
    assert len(handlers) == 26
    for alias, kind in STEP_KINDS.aliases.items():
        assert handlers[alias] == handlers[kind]


def test_implement_two_items_in_parallel_gives_two_worktrees_and_branches(
    handlers: Handlers, tmp_path: Path
) -> None:
    outcomes = in_threads(lambda: implement(handlers, "api"), lambda: implement(handlers, "ui"))
    for item, outcome in zip(["api", "ui"], outcomes, strict=True):
        assert isinstance(outcome, Success), outcome
        worktree = tmp_path / P / "worktrees" / f"c0-{item}"
        assert outcome.result["item"] == item
        assert outcome.result["status"] == "done"
        assert outcome.result["branch"] == f"vibey/c0/{item}"
        assert outcome.result["commit"] == git(repo(tmp_path), "rev-parse", f"vibey/c0/{item}")
        assert (worktree / "src" / f"{item}.txt").read_text() == f"{ITEMS[item]}\ncycle 0\n"
        assert git(worktree, "status", "--porcelain") == ""
    assert git(
        repo(tmp_path), "for-each-ref", "--format=%(refname:short)", "refs/heads/vibey"
    ).split() == [
        "vibey/c0/api",
        "vibey/c0/ui",
    ]


def test_a_retried_implement_reuses_its_worktree(handlers: Handlers, tmp_path: Path) -> None:
    first = implement(handlers, "api")
    assert isinstance(first, Success)
    worktree = tmp_path / P / "worktrees" / "c0-api"
    (worktree / "notes.txt").write_text("left by the first attempt\n")
    again = implement(handlers, "api", attempts=2)
    assert isinstance(again, Success)
    assert (worktree / "notes.txt").exists()  # reused, not made afresh
    assert again.result["branch"] == first.result["branch"]
    assert git(worktree, "show", "--name-only", "--format=", "HEAD") == "notes.txt"
    assert len(git(worktree, "worktree", "list").splitlines()) == 2  # repo + this one


def test_integrate_twice_merges_each_item_once(handlers: Handlers, tmp_path: Path) -> None:
    for item in ITEMS:
        assert isinstance(implement(handlers, item), Success)
    first = integrate(handlers, ["api", "ui"])
    assert isinstance(first, Success), first
    assert first.result["branch"] == "vibey/integration"
    assert first.result["merged"] == ["api", "ui"]
    again = integrate(handlers, ["api", "ui"])
    assert isinstance(again, Success)
    assert again.result["commit"] == first.result["commit"]
    assert first.result["commit"] == git(repo(tmp_path), "rev-parse", "vibey/integration")
    assert len(merges(tmp_path)) == 2
    tree = git(repo(tmp_path), "ls-tree", "-r", "--name-only", "vibey/integration").split()
    assert tree == ["src/api.txt", "src/ui.txt"]


def test_a_later_cycle_builds_on_the_integration_branch(handlers: Handlers, tmp_path: Path) -> None:
    for item in ITEMS:
        implement(handlers, item)
    integrate(handlers, ["api", "ui"])
    assert isinstance(implement(handlers, "api", cycle=1), Success)
    assert isinstance(integrate(handlers, ["api"], cycle=1), Success)
    shown = git(repo(tmp_path), "show", "vibey/integration:src/api.txt")
    assert shown == "HTTP API\ncycle 1"
    assert len(merges(tmp_path)) == 3


def test_concurrent_integrates_serialise(handlers: Handlers, tmp_path: Path) -> None:
    for item in ITEMS:
        implement(handlers, item)
    call = lambda: integrate(handlers, ["api", "ui"])  # noqa: E731
    outcomes = in_threads(call, call)
    assert all(isinstance(o, Success) for o in outcomes), outcomes
    commits = {o.result["commit"] for o in outcomes if isinstance(o, Success)}
    assert commits == {git(repo(tmp_path), "rev-parse", "vibey/integration")}
    assert sorted(merges(tmp_path)) == [
        "vibey: merge vibey/c0/api (cycle 0, item api)",
        "vibey: merge vibey/c0/ui (cycle 0, item ui)",
    ]


def _waiting_advisory_locks(pool: ConnectionPool) -> int:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_integrate_waits_for_the_project_and_cycle_advisory_lock(
    handlers: Handlers, pool: ConnectionPool, tmp_path: Path
) -> None:
    implement(handlers, "api")
    done: list[Outcome] = []
    with pool.connection() as holder, holder.transaction():
        holder.execute(
            "SELECT pg_advisory_xact_lock(hashtext('vibey.integrate:' || %s::text), %s::int)",
            (P, 0),
        )
        thread = threading.Thread(target=lambda: done.append(integrate(handlers, ["api"])))
        thread.start()
        deadline = time.monotonic() + 30
        while _waiting_advisory_locks(pool) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _waiting_advisory_locks(pool) == 1
        assert not done
        other_cycle = integrate(handlers, [], cycle=1)  # another cycle's lock is free
        assert isinstance(other_cycle, Success)
    thread.join(timeout=30)
    assert len(done) == 1
    assert isinstance(done[0], Success)
    assert len(merges(tmp_path)) == 1


def test_without_a_pool_integrate_serialises_in_process(tmp_path: Path) -> None:
    local = build_handlers(HandlerContext(pool=None, workspace=tmp_path))
    for item in ITEMS:
        implement(local, item)
    call = lambda: integrate(local, ["api", "ui"])  # noqa: E731
    assert all(isinstance(o, Success) for o in in_threads(call, call, call))
    assert len(merges(tmp_path)) == 2


def test_integrating_an_item_never_implemented_is_a_vibey_failure(handlers: Handlers) -> None:
    outcome = integrate(handlers, ["ghost"])
    assert isinstance(outcome, Failure)
    assert outcome.failure_class is FailureClass.VIBEY
    assert "vibey/c0/ghost" in outcome.detail


def _same_file(task: EngineTask) -> EngineVerdict:
    assert task.worktree is not None
    (task.worktree / "shared.txt").write_text(f"written by {task.subject}\n")
    return EngineVerdict("ok", result={"status": "done"})


def test_engine_changes_are_committed_and_a_conflict_goes_to_the_merge_queue(
    tmp_path: Path,
) -> None:
    fake = FakeEngine(respond=_same_file)
    context = HandlerContext(pool=None, workspace=tmp_path, engines={"scripted": fake})
    local = build_handlers(context)
    for item in ITEMS:
        outcome = implement(local, item)
        assert isinstance(outcome, Success)
        assert outcome.result["commit"] == git(repo(tmp_path), "rev-parse", f"vibey/c0/{item}")
    outcome = integrate(local, ["api", "ui"])
    assert isinstance(outcome, Success)  # not the work's failure: the queue resolves it
    assert outcome.result["merged"] == ["api"]
    [conflict] = outcome.result["conflicts"]
    assert conflict["item"] == "ui" and conflict["against"] == ["api"] and conflict["files"]
    assert len(merges(tmp_path)) == 1
    assert git(tmp_path / P / "worktrees" / "integration", "status", "--porcelain") == ""
    assert fake.kinds() == ["build.implement", "build.implement"]


@pytest.mark.parametrize(
    ("kind", "verdict", "expected"),
    [
        (
            "design.spec",
            EngineVerdict("ok", {"spec": "s"}, {"t": 1}),
            Success({"spec": "s", "evidence": {"t": 1}}),
        ),
        (
            "design.spec",
            EngineVerdict("capacity", detail="busy"),
            Defer(timedelta(seconds=60), "busy", capacity=True),
        ),
        ("build.verify", EngineVerdict("failed", detail="red"), Failure(FailureClass.WORK, "red")),
        (
            "deploy.graph",
            EngineVerdict("failed", detail="down"),
            Failure(FailureClass.WORK, "down"),
        ),
        (
            "design.spec",
            EngineVerdict("failed", detail="gave up"),
            Failure(FailureClass.ENGINE, "gave up"),
        ),
        (
            "build.verify",
            EngineVerdict("failed", detail="crashed", engine_fault=True),
            Failure(FailureClass.ENGINE, "crashed"),
        ),
    ],
)
def test_verdicts_map_to_outcomes(
    tmp_path: Path, kind: str, verdict: EngineVerdict, expected: Outcome
) -> None:
    fake = FakeEngine(respond=lambda task: verdict)
    local = build_handlers(HandlerContext(pool=None, workspace=tmp_path, engines={"fake": fake}))
    job = make_job(kind, round=0)
    job.payload["input"]["engine"] = {"name": "fake"}
    assert local[kind](job) == expected


def test_the_scripted_engine_runs_through_its_handler(handlers: Handlers) -> None:
    outcome = handlers["build.plan"](make_job("build.decompose", findings=[]))
    assert isinstance(outcome, Success)
    assert outcome.result["work_items"] == [{"id": "api", "title": "HTTP API"}]
    kinds = [e["kind"] for e in outcome.result["evidence"]["ledger"]]
    assert kinds == ["TurnRequested", "TurnCompleted", "BudgetSpent"]
    failed = handlers["build.verify"](make_job("build.verify", items=["api"], attempts=1))
    assert isinstance(failed, Success)  # this script has no verify failures


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, "has no input object"),
        ({"input": {"cycle": 0}}, "input.engine must be an object with a name"),
        ({"input": {"engine": {"name": "oracle"}}}, "names engine 'oracle'"),
        ({"input": {"engine": {"name": "command"}}}, NO_COMMAND),
        ({"input": {"engine": {"name": "scripted", "script": {"build": 3}}}}, "[build]"),
    ],
)
def test_unusable_input_is_a_vibey_failure(handlers: Handlers, payload: Any, message: str) -> None:
    outcome = handlers["build.decompose"](make_job("build.decompose", payload=payload))
    assert isinstance(outcome, Failure)
    assert outcome.failure_class is FailureClass.VIBEY
    assert message in outcome.detail


AGENT = """
import json, os, pathlib
plan = json.loads(pathlib.Path(os.environ["VIBEY_PLAN"]).read_text())
item = plan["input"]["item"]["id"]
pathlib.Path(f"{item}.py").write_text("print('hello')\\n")
verdict = {"status": "ok", "result": {"status": "done"}, "evidence": {"agent": "script"}}
pathlib.Path(os.environ["VIBEY_VERDICT"]).write_text(json.dumps(verdict))
"""


def test_the_command_engine_implements_in_the_worktree(
    pool: ConnectionPool, tmp_path: Path
) -> None:
    context = HandlerContext(pool=pool, workspace=tmp_path, command=(sys.executable, "-c", AGENT))
    job = make_job("build.implement", subject="api", item={"id": "api", "title": "HTTP API"})
    job.payload["input"]["engine"] = {"name": "command"}
    outcome = build_handlers(context)["build.implement"](job)
    assert isinstance(outcome, Success), outcome
    assert outcome.result["evidence"] == {"agent": "script"}
    assert outcome.result["branch"] == "vibey/c0/api"
    committed = git(repo(tmp_path), "show", "--name-only", "--format=", "vibey/c0/api")
    assert committed == "api.py"


def test_commit_all_refuses_a_directory_inside_another_repository(tmp_path: Path) -> None:
    from actors.worktrees import WorkspaceError, commit_all, git

    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "--quiet", "-b", "main")
    inner = outer / "not-a-worktree"
    inner.mkdir()
    (inner / "file.txt").write_text("x")
    with pytest.raises(WorkspaceError, match="not a git worktree of its own"):
        commit_all(inner, "must not happen")
    assert git(outer, "status", "--porcelain") == "?? not-a-worktree/"


def test_a_relative_workspace_root_makes_worktrees_where_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.worktrees import Workspace, git

    monkeypatch.chdir(tmp_path)
    workspace = Workspace(Path("rel/work"))
    path = workspace.worktree("proj", 0, "item")
    assert path == tmp_path / "rel" / "work" / "proj" / "worktrees" / "c0-item"
    assert (path / ".git").is_file()
    assert Path(git(path, "rev-parse", "--show-toplevel")) == path


@pytest.mark.parametrize(
    ("kind", "attempts", "effort"),
    [
        ("design.spec", 1, "HIGH"),
        ("review.triage", 3, "HIGH"),
        ("deploy.execute", 1, "LOW"),
        ("deploy.execute", 2, "STANDARD"),
        ("deploy.execute", 5, "HIGH"),
        ("build.verify", 1, "LOW"),
        ("build.verify", 3, "HIGH"),
    ],
)
def test_each_attempt_runs_at_its_phase_ladder_rung(
    tmp_path: Path, kind: str, attempts: int, effort: str
) -> None:
    from actors.agents import FakeEngine

    fake = FakeEngine()
    context = HandlerContext(pool=None, workspace=tmp_path, engines={"fake": fake})
    job = make_job(kind, attempts=attempts, items=["api"], engine={"name": "fake"})
    build_handlers(context)[kind](job)
    assert [t.effort for t in fake.tasks] == [effort]


def test_capacity_waits_are_counted_from_the_ledger_and_reset_by_an_answer(
    pool: ConnectionPool, tmp_path: Path
) -> None:
    from store.jobs import PostgresJobRepository
    from workflows.gates import CAPACITY_EXHAUSTED
    from workflows.queue import EnqueueRequest
    from workflows.steps import Park

    credits = EngineVerdict("capacity", result={"capacity": {"state": "CreditsExhausted"}})
    fake = FakeEngine(verdicts={"design.spec": credits})
    context = HandlerContext(
        pool=pool, workspace=tmp_path, engines={"fake": fake}, capacity_waits=2
    )
    run = build_handlers(context)["design.spec"]
    jobs = PostgresJobRepository(pool=pool)
    payload = {"input": {"engine": {"name": "fake"}, "cycle": 0}}
    jobs.enqueue(EnqueueRequest(project_id=P, kind="design.spec", subject="s", payload=payload))

    def attempt() -> Outcome:
        [job] = jobs.claim(P, owner="w", kinds=["design.spec"])
        outcome = run(job)
        if isinstance(outcome, Defer):
            assert jobs.defer(job.lease, delay=timedelta(0), reason=outcome.reason).applied
        elif isinstance(outcome, Park):
            assert jobs.park(job.lease, outcome.gate).applied
        return outcome

    assert isinstance(attempt(), Defer)  # one rejection ledgered
    parked = attempt()  # two: the bound
    assert isinstance(parked, Park) and parked.gate.kind == CAPACITY_EXHAUSTED.name
    assert parked.gate.context["waits"] == 2
    [gate] = jobs.open_gates(P)
    assert jobs.answer_gate(gate.id, answer="retry", answered_by="ann").applied
    assert isinstance(attempt(), Defer)  # the count started over with the answer
