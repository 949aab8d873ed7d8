"""The merge queue's git side through the handlers (actors/handlers.py, actors/worktrees.py),
on real repositories: three items, two of which edit the same line of one file. build.verify
merges the clean ones and reports the conflict (no tests run), build.integrate keeps the held
item out, build.resolve merges the integrated branch into the item's worktree and the engine
resolves it, and the next pass merges everything. A resolver that leaves conflict markers
fails the attempt and leaves the item's branch as it was."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

import pytest

from actors.agents import EngineVerdict, FakeEngine
from actors.handlers import HandlerContext, Steps
from actors.worktrees import Workspace, commit_all, head, item_branch
from store.memory import ManualClock, MemoryJobRepository
from store.memory_records import MemoryStepRecords
from workflows.job import FailureClass
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Failure, Success

P = "shop"
SCRIPTED = {"name": "scripted"}
PASSES = itertools.count()
ITEMS = {"a": "greet in English", "b": "greet in French", "c": "a footer"}


@pytest.fixture
def jobs() -> MemoryJobRepository:
    return MemoryJobRepository(clock=ManualClock())


def claimed(
    jobs: MemoryJobRepository,
    kind: str,
    given: dict[str, Any],
    engine: Any = None,
    subject: str = "",
) -> Job:
    payload = {"input": {"engine": engine or SCRIPTED, "cycle": 0, "phase": "build", **given}}
    subject = subject or f"pass{next(PASSES)}"  # a new job each time
    jobs.enqueue(EnqueueRequest(project_id=P, kind=kind, subject=subject, payload=payload))
    [job] = jobs.claim(P, owner="worker", kinds=[kind])
    return job


def built(tmp_path: Path, jobs: MemoryJobRepository, **engines: Any) -> tuple[Steps, Workspace]:
    """The project: ``app.txt`` on main, items a and b each rewrite its greeting line, c adds
    its own file; each committed on its branch."""
    workspace = Workspace(tmp_path / "ws")
    repo = workspace.repo(P)
    (repo / "app.txt").write_text("greeting = hello\nname = shop\n")
    commit_all(repo, "the app")
    for item, title in ITEMS.items():
        tree = workspace.worktree(P, 0, item)
        if item == "c":
            (tree / "footer.txt").write_text(f"{title}\n")
        else:
            (tree / "app.txt").write_text(f"greeting = {title}\nname = shop\n")
        commit_all(tree, f"implement {item}")
    context = HandlerContext(
        pool=None, workspace=tmp_path / "ws", engines=engines, records=MemoryStepRecords(jobs)
    )
    return Steps(context), workspace


def resolve_input(files: list[str]) -> dict[str, Any]:
    return {
        "item": {"id": "b", "title": ITEMS["b"]},
        "files": files,
        "against": [{"id": "a", "title": ITEMS["a"]}],
        "round": 1,
        "conflict": "conflict:0.b.1",
    }


def test_the_queue_merges_the_clean_items_and_the_engine_resolves_the_conflict(
    tmp_path: Path, jobs: MemoryJobRepository
) -> None:
    steps, workspace = built(tmp_path, jobs)
    verify = steps.run(claimed(jobs, "build.verify", {"items": ["a", "b", "c"]}))
    assert isinstance(verify, Success), verify
    assert verify.decided["passed"] is False
    assert verify.decided["merged"] == ["a", "c"]
    assert verify.decided["conflicts"] == [{"item": "b", "files": ["app.txt"], "against": ["a"]}]
    integrated = workspace.integrated(P)
    assert "English" in (integrated / "app.txt").read_text()
    assert (integrated / "footer.txt").is_file()  # c was not held back by b

    integrate = steps.integrate(claimed(jobs, "build.integrate", {"items": ["a", "b", "c"]}))
    assert isinstance(integrate, Success)
    assert integrate.decided["conflicts"][0]["item"] == "b"
    assert "pushed" not in integrate.decided

    resolve = steps.run(claimed(jobs, "build.resolve", resolve_input(["app.txt"]), subject="b"))
    assert isinstance(resolve, Success), resolve
    assert resolve.decided["resolved"] is True and resolve.decided["files"] == ["app.txt"]
    tree = workspace.worktree(P, 0, "b")
    text = (tree / "app.txt").read_text()
    assert "French" in text and "English" in text and "<<<<<<<" not in text
    assert resolve.decided["commit"] == head(tree)
    ancestor = ["git", "merge-base", "--is-ancestor", "vibey/integration", item_branch(0, "b")]
    assert subprocess.run(ancestor, cwd=tree, check=False).returncode == 0

    again = steps.run(claimed(jobs, "build.verify", {"items": ["a", "b", "c"]}))
    assert isinstance(again, Success) and again.decided["passed"] is True
    assert "conflicts" not in again.decided
    final = steps.integrate(claimed(jobs, "build.integrate", {"items": ["a", "b", "c"]}))
    assert isinstance(final, Success) and "conflicts" not in final.decided
    assert final.decided["merged"] == ["a", "b", "c"]
    merged = (integrated / "app.txt").read_text()
    assert "French" in merged and "English" in merged


def test_a_resolver_that_leaves_markers_fails_and_the_branch_is_as_it_was(
    tmp_path: Path, jobs: MemoryJobRepository
) -> None:
    lazy = FakeEngine(verdicts={"build.resolve": EngineVerdict("ok", result={"resolved": True})})
    steps, workspace = built(tmp_path, jobs, lazy=lazy)
    steps.run(claimed(jobs, "build.verify", {"items": ["a", "b", "c"]}))
    tree = workspace.worktree(P, 0, "b")
    before = head(tree)
    job = claimed(jobs, "build.resolve", resolve_input(["app.txt"]), {"name": "lazy"}, "b")
    failed = steps.run(job)
    assert isinstance(failed, Failure) and failed.failure_class is FailureClass.WORK
    assert "conflict markers are left in app.txt" in failed.detail
    assert head(tree) == before
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True, check=True
    )
    assert [ln for ln in status.stdout.splitlines() if ".vibey" not in ln] == []


def test_a_held_item_stays_out_of_the_pass_even_once_its_branch_merges(
    tmp_path: Path, jobs: MemoryJobRepository
) -> None:
    steps, workspace = built(tmp_path, jobs)
    steps.run(claimed(jobs, "build.verify", {"items": ["a", "b", "c"]}))
    tree = workspace.worktree(P, 0, "b")
    (tree / "app.txt").write_text("greeting = greet in English\nname = shop\n")  # a person
    commit_all(tree, "by hand")
    subprocess.run(["git", "merge", "-q", "-s", "ours", "vibey/integration"], cwd=tree, check=True)
    integrate = steps.integrate(claimed(jobs, "build.integrate", {"items": ["a", "b", "c"]}))
    assert isinstance(integrate, Success)
    assert integrate.decided["merged"] == ["a", "c"]  # b waits for the next pass's tests
    again = steps.run(claimed(jobs, "build.verify", {"items": ["a", "b", "c"]}))
    assert isinstance(again, Success) and again.decided["passed"] is True
