"""The command engine runs a real process: a verdict it writes comes back as it is; an exit,
a timeout or a bad verdict is a failed verdict marked as the engine's fault."""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from actors.agents import CommandEngine, EngineTask
from actors.handlers import to_outcome
from workflows.job import FailureClass
from workflows.steps import Defer, Failure, Success

WRITE_VERDICT = """
import json, os, pathlib
plan = json.loads(pathlib.Path(os.environ["VIBEY_PLAN"]).read_text())
verdict = {
    "status": "ok",
    "result": {"passed": True, "plan": plan, "kind": os.environ["VIBEY_KIND"], "cwd": os.getcwd()},
    "evidence": {"log": "all green"},
    "detail": "",
}
pathlib.Path(os.environ["VIBEY_VERDICT"]).write_text(json.dumps(verdict))
"""

CAPACITY = """
import json, os, pathlib
verdict = {"status": "capacity", "detail": "rate limited until 12:00"}
pathlib.Path(os.environ["VIBEY_VERDICT"]).write_text(json.dumps(verdict))
"""

EXIT_NON_ZERO = """
import sys
print("working on it")
print("Traceback: the agent crashed", file=sys.stderr)
sys.exit(3)
"""

GARBAGE = """
import os, pathlib
pathlib.Path(os.environ["VIBEY_VERDICT"]).write_text("{not json")
"""

WRONG_STATUS = """
import json, os, pathlib
pathlib.Path(os.environ["VIBEY_VERDICT"]).write_text(json.dumps({"status": "great"}))
"""

NO_VERDICT = "print('done, I think')"

# Leaves a grandchild in its process group, records both pids, then outlives the timeout.
SLEEP_PAST_TIMEOUT = """
import os, pathlib, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
pathlib.Path("pids").write_text(f"{os.getpid()} {child.pid}")
time.sleep(60)
"""


def task(worktree: Path | None = None, kind: str = "build.verify") -> EngineTask:
    step_input = {"engine": {"name": "command"}, "items": ["api"], "cycle": 2}
    return EngineTask(kind, "web", 2, "verify", 1, step_input, worktree)


def engine(script: str, timeout: float = 30.0, scratch: Path | None = None) -> CommandEngine:
    return CommandEngine(
        [sys.executable, "-c", script], timedelta(seconds=timeout), scratch_root=scratch
    )


def alive(pid: int) -> bool:
    """A zombie (killed, not yet reaped by its new parent) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_written_verdict_comes_back_with_the_plan_in_the_worktree(tmp_path: Path) -> None:
    verdict = engine(WRITE_VERDICT).run(task(tmp_path))
    assert verdict.status == "ok"
    assert not verdict.engine_fault
    assert verdict.evidence == {"log": "all green"}
    assert verdict.result["kind"] == "build.verify"
    assert verdict.result["cwd"] == str(tmp_path)
    assert verdict.result["plan"] == {
        "kind": "build.verify",
        "project_id": "web",
        "cycle": 2,
        "subject": "verify",
        "attempt": 1,
        "input": {"engine": {"name": "command"}, "items": ["api"], "cycle": 2},
    }
    outcome = to_outcome("build.verify", verdict)
    assert isinstance(outcome, Success)
    assert outcome.result["passed"] is True
    assert outcome.result["evidence"] == {"log": "all green"}


def test_without_a_worktree_the_command_runs_in_the_project_scratch_dir(tmp_path: Path) -> None:
    verdict = engine(WRITE_VERDICT, scratch=tmp_path).run(task())
    assert verdict.result["cwd"] == str(tmp_path / "web" / "scratch")


def test_capacity_is_a_capacity_defer() -> None:
    verdict = engine(CAPACITY).run(task())
    assert (verdict.status, verdict.detail) == ("capacity", "rate limited until 12:00")
    outcome = to_outcome("build.verify", verdict)
    assert outcome == Defer(timedelta(seconds=60), "rate limited until 12:00", capacity=True)


def test_a_non_zero_exit_fails_with_the_stderr_tail() -> None:
    verdict = engine(EXIT_NON_ZERO).run(task())
    assert verdict.status == "failed"
    assert verdict.engine_fault
    assert verdict.detail == "the engine command exited with status 3"
    assert verdict.evidence["exit_code"] == 3
    assert "the agent crashed" in verdict.evidence["stderr_tail"]
    assert "working on it" in verdict.evidence["stdout_tail"]
    outcome = to_outcome("build.verify", verdict)
    assert isinstance(outcome, Failure)
    assert outcome.failure_class is FailureClass.ENGINE
    assert "the agent crashed" in outcome.detail


@pytest.mark.parametrize(
    ("script", "detail"),
    [
        (GARBAGE, "malformed verdict: not JSON"),
        (WRONG_STATUS, "malformed verdict: status must be one of ok, failed, capacity"),
        (NO_VERDICT, "exited 0 but wrote no verdict"),
    ],
)
def test_a_missing_or_malformed_verdict_fails(script: str, detail: str) -> None:
    verdict = engine(script).run(task())
    assert verdict.status == "failed"
    assert verdict.engine_fault
    assert detail in verdict.detail
    outcome = to_outcome("deploy.execute", verdict)
    assert isinstance(outcome, Failure)
    assert outcome.failure_class is FailureClass.ENGINE


def test_a_missing_command_fails_without_starting_anything() -> None:
    verdict = CommandEngine(["no-such-vibey-agent"], timedelta(seconds=5)).run(task())
    assert verdict.engine_fault
    assert "'no-such-vibey-agent' was not found" in verdict.detail


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    verdict = engine(SLEEP_PAST_TIMEOUT, timeout=1.0).run(task(tmp_path))
    assert time.monotonic() - started < 30
    assert verdict.status == "failed"
    assert verdict.engine_fault
    assert "timed out" in verdict.detail
    pid, grandchild = (int(p) for p in (tmp_path / "pids").read_text().split())
    assert verdict.evidence["pid"] != pid  # the supervising wrapper's, which leads the group
    assert not alive(verdict.evidence["pid"])
    assert not alive(pid)
    deadline = time.monotonic() + 10  # the orphaned grandchild is reaped by its new parent
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


def test_the_verdict_file_is_the_only_channel(tmp_path: Path) -> None:
    """stdout that looks like a verdict is not one."""
    printed = "import json; print(json.dumps({'status': 'ok'}))"
    verdict = engine(printed).run(task(tmp_path))
    assert verdict.engine_fault
    assert json.loads(verdict.evidence["stdout_tail"]) == {"status": "ok"}
