"""The command engine: any coding agent or script, run as a command, one step at a time.

For each task it writes ``plan.json`` (``{kind, project_id, cycle, subject, attempt,
input}``) to a fresh run directory and starts the command under the supervising wrapper
(:mod:`actors.agents.process`: it dies with the worker, and takes its process group with
it), with the task's workdir (else its worktree, else a per-project scratch directory) as the
working directory and these variables added to the environment it inherits:

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
and when it is not, the child inherits the worker's; either way the wrapper adds the
variables. The worktree lease the task holds (``task.lease``) is inherited by the engine
process and records its process group.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from actors.agents.base import STATUSES, EngineTask, EngineVerdict
from actors.agents.confine import Confinement
from actors.agents.process import Exit, run_supervised
from actors.worktrees import checked_name

TAIL_BYTES = 4000


class CommandEngine:
    def __init__(
        self,
        argv: Sequence[str],
        timeout: timedelta,
        *,
        scratch_root: Path | None = None,
        env: Mapping[str, str] | None = None,
        kill_grace: timedelta = timedelta(seconds=2),
        confinement: Confinement | None = None,
    ) -> None:
        self.argv = tuple(argv)
        self.timeout = timeout
        self._scratch_root = scratch_root
        self._env = dict(env) if env is not None else None
        self._grace = kill_grace
        self.confinement = confinement  # None: unconfined (the [engine] command of old)

    def run(self, task: EngineTask) -> EngineVerdict:
        if not self.argv:
            return _fault("no engine command configured: set [engine] command in vibey.toml")
        if shutil.which(self.argv[0]) is None:
            return _fault(f"the engine command {self.argv[0]!r} was not found or is not executable")
        found = self.confinement.mechanism if self.confinement is not None else None
        if found is not None and found.refused:
            return _fault(f"the engine command's confinement is {found.why}")
        with tempfile.TemporaryDirectory(prefix="vibey-run-") as tmp:
            run_dir = Path(tmp)
            plan, verdict = run_dir / "plan.json", run_dir / "verdict.json"
            plan.write_text(json.dumps(_plan(task), default=str), encoding="utf-8")
            cwd = self._cwd(task, run_dir)
            done = self._spawn(task, cwd, run_dir, plan, verdict)
            return _judge(done, verdict, run_dir)

    def _cwd(self, task: EngineTask, run_dir: Path) -> Path:
        if task.workdir is not None:
            return task.workdir
        if task.worktree is not None:
            return task.worktree
        if self._scratch_root is None:
            return run_dir
        scratch = self._scratch_root / checked_name(task.project_id, "project id") / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        return scratch

    def _spawn(self, task: EngineTask, cwd: Path, run_dir: Path, plan: Path, verdict: Path) -> Exit:
        variables = {
            "VIBEY_PLAN": str(plan),
            "VIBEY_VERDICT": str(verdict),
            "VIBEY_KIND": task.kind,
        }
        if task.effort:
            variables["VIBEY_EFFORT"] = task.effort
        held = task.lease
        with (run_dir / "stdout").open("wb") as out, (run_dir / "stderr").open("wb") as err:
            return run_supervised(
                self.argv,
                cwd=cwd,
                env=self._env,
                extra=variables,
                stdout=out,
                stderr=err,
                timeout=self.timeout.total_seconds(),
                grace=self._grace.total_seconds(),
                lock_fd=None if held is None else held.fd,
                on_start=None if held is None else held.started,
                confine=self.confinement,
                project=task.project_id,
                run_dir=run_dir,
            )


def _plan(task: EngineTask) -> dict[str, Any]:
    return {
        "kind": task.kind,
        "project_id": task.project_id,
        "cycle": task.cycle,
        "subject": task.subject,
        "attempt": task.attempt,
        "input": task.input,
    }


def _fault(detail: str, evidence: dict[str, Any] | None = None) -> EngineVerdict:
    return EngineVerdict("failed", evidence=evidence or {}, detail=detail, engine_fault=True)


def _tail(path: Path) -> str:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - TAIL_BYTES))
        return handle.read().decode("utf-8", errors="replace")


def _judge(done: Exit, verdict: Path, run_dir: Path) -> EngineVerdict:
    evidence = {
        "pid": done.pid,
        "exit_code": done.returncode,
        "stdout_tail": _tail(run_dir / "stdout"),
        "stderr_tail": _tail(run_dir / "stderr"),
    }
    if done.timed_out:
        return _fault("the engine command timed out; its process group was killed", evidence)
    if done.returncode < 0 or done.returncode > 128:
        signum = -done.returncode if done.returncode < 0 else done.returncode - 128
        return _fault(f"the engine command was killed by signal {signum}", evidence)
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
