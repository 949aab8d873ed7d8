"""``[project] push``: build.integrate pushes the integrated branch to a remote (here a local
bare repository), a fast-forward each cycle, and says where in its result; the protocol records
that as ``ArtifactProduced``. A refused push fails the step naming the setting to fix. And
review.demo's result carries the integrated tree's diff stat (the feedback gate shows it)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from actors.agents import EngineVerdict, FakeEngine
from actors.handlers import HandlerContext, Steps
from actors.worktrees import commit_all, git
from store.memory import ManualClock, MemoryJobRepository
from store.memory_records import MemoryStepRecords
from vibey.settings import ProjectSettings, SettingsError, load_settings
from workflows.engine import StepSucceeded
from workflows.job import FailureClass
from workflows.ledger import EventKind
from workflows.protocol.ledger import events_for
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Failure, Success

P = "shop"
FAKE = {"name": "fake"}


def bare(tmp_path: Path) -> Path:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(remote)], check=True)
    return remote


def claimed(jobs: MemoryJobRepository, kind: str, cycle: int, step_input: dict[str, Any]) -> Job:
    payload = {"input": {"engine": FAKE, **step_input}}
    jobs.enqueue(EnqueueRequest(P, kind, subject=f"{kind}.{cycle}", cycle=cycle, payload=payload))
    [job] = jobs.claim(P, owner="worker", kinds=[kind])
    return job


def implemented(steps: Steps, cycle: int, item: str) -> None:
    tree = steps.workspace.worktree(P, cycle, item)
    (tree / f"{item}.txt").write_text(f"{item}\n")
    commit_all(tree, f"implement {item}")


def handlers(tmp_path: Path, jobs: MemoryJobRepository, **kw: Any) -> Steps:
    kw.setdefault("engines", {"fake": FakeEngine()})
    context = HandlerContext(
        pool=None, workspace=tmp_path / "work", records=MemoryStepRecords(jobs), **kw
    )
    return Steps(context)


@pytest.fixture
def jobs() -> MemoryJobRepository:
    return MemoryJobRepository(clock=ManualClock())


def test_integrate_pushes_the_integrated_branch_to_the_remote_each_cycle(
    tmp_path: Path, jobs: MemoryJobRepository
) -> None:
    remote = bare(tmp_path)
    steps = handlers(tmp_path, jobs, push_remote=str(remote), push_branch="vibey/{project}")
    for cycle, item in ((0, "api"), (1, "ui")):
        implemented(steps, cycle, item)
        outcome = steps.integrate(claimed(jobs, "build.integrate", cycle, {"items": [item]}))
        assert isinstance(outcome, Success), outcome
        pushed = outcome.result["pushed"]
        assert pushed == {"remote": str(remote), "branch": "vibey/shop", "commit": pushed["commit"]}
        assert pushed["commit"] == outcome.result["commit"]
        assert git(remote, "rev-parse", "refs/heads/vibey/shop") == pushed["commit"]
    files = git(remote, "ls-tree", "--name-only", "vibey/shop").splitlines()
    assert {"api.txt", "ui.txt"} <= set(files)


def test_the_push_is_recorded_as_an_artifact() -> None:
    pushed = {"remote": "/r.git", "branch": "vibey/shop", "commit": "c1"}
    result = {"branch": "vibey/integration", "merged": [], "commit": "c1", "pushed": pushed}
    events = events_for(StepSucceeded("build.integrate.0", result), (), lambda: frozenset())
    artifacts = [e.payload for e in events if e.kind is EventKind.ArtifactProduced]
    assert {"id": "build.integrate.0:push", "artifact": "push", **pushed} in artifacts


def test_without_push_nothing_is_pushed(tmp_path: Path, jobs: MemoryJobRepository) -> None:
    steps = handlers(tmp_path, jobs)
    implemented(steps, 0, "api")
    outcome = steps.integrate(claimed(jobs, "build.integrate", 0, {"items": ["api"]}))
    assert isinstance(outcome, Success), outcome
    assert "pushed" not in outcome.result


def test_a_refused_push_fails_naming_the_setting(tmp_path: Path, jobs: MemoryJobRepository) -> None:
    missing = tmp_path / "nowhere.git"
    steps = handlers(tmp_path, jobs, push_remote=str(missing))
    implemented(steps, 0, "api")
    outcome = steps.integrate(claimed(jobs, "build.integrate", 0, {"items": ["api"]}))
    assert isinstance(outcome, Failure), outcome
    assert outcome.failure_class is FailureClass.VIBEY
    assert f"the push to {missing} failed" in outcome.detail
    assert "fix [project] push" in outcome.detail


def test_push_settings_come_from_the_project_table_and_the_environment(tmp_path: Path) -> None:
    (tmp_path / "vibey.toml").write_text('[project]\npush = "/srv/app.git"\n')
    settings = load_settings({}, cwd=tmp_path)
    assert settings.project.push == "/srv/app.git"
    assert settings.project.branch_for("shop") == "vibey/shop"
    env = {"VIBEY_PROJECT_PUSH": "git@host:app.git", "VIBEY_PROJECT_PUSH_BRANCH": "ci/{project}"}
    overridden = load_settings(env, cwd=tmp_path).project
    assert (overridden.push, overridden.branch_for("shop")) == ("git@host:app.git", "ci/shop")
    with pytest.raises(SettingsError, match="not a branch name"):
        ProjectSettings(push="/r.git", push_branch="bad branch")


def test_review_demo_reports_the_integrated_diff_stat(
    tmp_path: Path, jobs: MemoryJobRepository
) -> None:
    steps = handlers(tmp_path, jobs)
    implemented(steps, 0, "api")
    assert isinstance(
        steps.integrate(claimed(jobs, "build.integrate", 0, {"items": ["api"]})), Success
    )
    outcome = steps.run(claimed(jobs, "review.demo", 0, {"branch": "vibey/integration"}))
    assert isinstance(outcome, Success), outcome
    assert outcome.result["diff_stat"] == "1 file changed, 1 insertion(+)"


def test_a_demo_that_reports_its_own_diff_stat_keeps_it(
    tmp_path: Path, jobs: MemoryJobRepository
) -> None:
    said = EngineVerdict("ok", result={"summary": "s", "diff_stat": "mine"})
    steps = handlers(tmp_path, jobs, engines={"fake": FakeEngine(verdicts={"review.demo": said})})
    outcome = steps.run(claimed(jobs, "review.demo", 0, {"branch": "vibey/integration"}))
    assert isinstance(outcome, Success), outcome
    assert outcome.result["diff_stat"] == "mine"
