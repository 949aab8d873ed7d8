"""The command engine: any coding agent or script, run as a command, one step at a time.

For each task it writes ``plan.json`` (``{kind, project_id, cycle, subject, attempt,
input}``) to a fresh run directory and starts the command in its own process group, with
the task's worktree (or a per-project scratch directory) as the working directory and these
variables added to the environment it inherits:

    VIBEY_PLAN      the plan file to read
    VIBEY_VERDICT   where to write the verdict:
                    {"status": "ok"|"failed"|"capacity", "result": {...}, "evidence": {...},
                     "detail": "..."}
    VIBEY_KIND      the step's kind
    VIBEY_EFFORT    the effort ladder's level (build.implement, build.verify)

A verdict the command writes is returned as it is. A command that exits non-zero, runs past
its timeout (its whole process group is killed: SIGTERM, then SIGKILL after a grace), or
writes no or a malformed verdict gives a ``failed`` verdict with ``engine_fault`` set, its
detail saying which, and the tails of its stdout and stderr as evidence. Processes the command
leaves behind in its group are killed when it exits.

The engine reads no environment itself: ``env`` (the child's whole environment) is passed in,
and when it is not, the child inherits the worker's; either way ``env(1)`` adds the three
variables (it execs the command, so the pid is the command's).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from actors.agents.base import STATUSES, EngineTask, EngineVerdict
from actors.worktrees import checked_name

TAIL_BYTES = 4000


@dataclass(frozen=True, slots=True)
class _Exit:
    pid: int
    returncode: int
    timed_out: bool


class CommandEngine:
    def __init__(
        self,
        argv: Sequence[str],
        timeout: timedelta,
        *,
        scratch_root: Path | None = None,
        env: Mapping[str, str] | None = None,
        kill_grace: timedelta = timedelta(seconds=2),
    ) -> None:
        self.argv = tuple(argv)
        self.timeout = timeout
        self._scratch_root = scratch_root
        self._env = dict(env) if env is not None else None
        self._grace = kill_grace

    def run(self, task: EngineTask) -> EngineVerdict:
        if not self.argv:
            return _fault("no engine command configured: set [engine] command in vibey.toml")
        if shutil.which(self.argv[0]) is None:
            return _fault(f"the engine command {self.argv[0]!r} was not found or is not executable")
        with tempfile.TemporaryDirectory(prefix="vibey-run-") as tmp:
            run_dir = Path(tmp)
            plan, verdict = run_dir / "plan.json", run_dir / "verdict.json"
            plan.write_text(json.dumps(_plan(task), default=str), encoding="utf-8")
            cwd = self._cwd(task, run_dir)
            done = self._spawn(task, cwd, run_dir, plan, verdict)
            return _judge(done, verdict, run_dir)

    def _cwd(self, task: EngineTask, run_dir: Path) -> Path:
        if task.worktree is not None:
            return task.worktree
        if self._scratch_root is None:
            return run_dir
        scratch = self._scratch_root / checked_name(task.project_id, "project id") / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        return scratch

    def _spawn(
        self, task: EngineTask, cwd: Path, run_dir: Path, plan: Path, verdict: Path
    ) -> _Exit:
        variables = [f"VIBEY_PLAN={plan}", f"VIBEY_VERDICT={verdict}", f"VIBEY_KIND={task.kind}"]
        if task.effort:
            variables.append(f"VIBEY_EFFORT={task.effort}")
        with (run_dir / "stdout").open("wb") as out, (run_dir / "stderr").open("wb") as err:
            process = subprocess.Popen(
                ["env", *variables, *self.argv],
                cwd=cwd,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                return _Exit(process.pid, process.wait(self.timeout.total_seconds()), False)
            except subprocess.TimeoutExpired:
                _stop(process, self._grace)
                return _Exit(process.pid, process.returncode, True)
            finally:
                _kill_group(process.pid)
                process.wait()


def _plan(task: EngineTask) -> dict[str, Any]:
    return {
        "kind": task.kind,
        "project_id": task.project_id,
        "cycle": task.cycle,
        "subject": task.subject,
        "attempt": task.attempt,
        "input": task.input,
    }


def _stop(process: subprocess.Popen[bytes], grace: timedelta) -> None:
    """SIGTERM to the group, SIGKILL after ``grace``; reaps the leader."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(grace.total_seconds())
    except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()


def _kill_group(pgid: int) -> None:
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    # ProcessLookupError: the group is empty; PermissionError: its id is someone else's now.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _fault(detail: str, evidence: dict[str, Any] | None = None) -> EngineVerdict:
    return EngineVerdict("failed", evidence=evidence or {}, detail=detail, engine_fault=True)


def _tail(path: Path) -> str:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - TAIL_BYTES))
        return handle.read().decode("utf-8", errors="replace")


def _judge(done: _Exit, verdict: Path, run_dir: Path) -> EngineVerdict:
    evidence = {
        "pid": done.pid,
        "exit_code": done.returncode,
        "stdout_tail": _tail(run_dir / "stdout"),
        "stderr_tail": _tail(run_dir / "stderr"),
    }
    if done.timed_out:
        return _fault("the engine command timed out; its process group was killed", evidence)
    if done.returncode < 0:
        return _fault(f"the engine command was killed by signal {-done.returncode}", evidence)
    if done.returncode != 0:
        return _fault(f"the engine command exited with status {done.returncode}", evidence)
    if not verdict.exists():
        return _fault("the engine command exited 0 but wrote no verdict to VIBEY_VERDICT", evidence)
    parsed = _parse(verdict)
    if isinstance(parsed, str):
        return _fault(f"malformed verdict: {parsed}", evidence)
    return parsed


def _parse(path: Path) -> EngineVerdict | str:
    """The verdict, or why it is malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return f"not JSON ({exc})"
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    status = data.get("status")
    if status not in STATUSES:
        return f"status must be one of ok, failed, capacity; got {status!r}"
    result, evidence, detail = (
        data.get("result", {}),
        data.get("evidence", {}),
        data.get("detail", ""),
    )
    if not isinstance(result, dict) or not isinstance(evidence, dict):
        return "result and evidence must be JSON objects"
    if not isinstance(detail, str):
        return f"detail must be a string, got {type(detail).__name__}"
    return EngineVerdict(status, result=result, evidence=evidence, detail=detail)
