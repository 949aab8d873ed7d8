"""An engine's conformance check: what makes a configured engine eligible for rotation.

:func:`check` runs, against the engine's real binary and with its own environment:

1. ``installed``: the binary is found on the engine's PATH;
2. ``version``: ``<binary> --version`` exits 0 within ``VERSION_TIMEOUT_S``;
3. ``headless task``: a tiny scripted task — build.implement of an item ``conformance``
   ("create CONFORMANCE.txt containing ok") in a fresh git repository — through the adapter,
   as a step would run it: the verdict must be ``ok`` and the worktree must show a changed file
   (FileEdited).

:func:`record` writes the result to ``engine_health`` (registered as configured; a pass
authenticates the engine, a failure de-authenticates it). Rotation admits an engine only with
a recorded pass within ``RotationPolicy.doctor_ttl`` (24 h by default): ``vibey doctor
--conformance --engine <id> --record``.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path

from actors.agents.adapters import CLI_ADAPTERS, engine_for
from actors.agents.base import EngineTask
from actors.agents.lease import WorktreeLease
from actors.agents.roster import AgentSpec, installed
from actors.agents.run_client import EngineQueueSaturated, RunClient
from actors.worktrees import Workspace
from store.db import Pool, transaction
from store.engine_health import EngineHealthStore
from workflows.protocol.kinds import BUILD_IMPLEMENT
from workflows.runs import RunStatus

VERSION_TIMEOUT_S = 30.0
ITEM = {"id": "conformance", "title": "Create CONFORMANCE.txt containing the word ok"}


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Conformance:
    engine_id: str
    checks: tuple[Check, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


def check(
    spec: AgentSpec,
    *,
    worker_env: Mapping[str, str],
    runs: RunClient | None = None,
    root: Path | None = None,
) -> Conformance:
    """The checks in order; the first that fails ends the run. An engine with invocation =
    "service" is checked where its runs run: a probe of its loop service stands for the two
    binary checks, and the headless task runs through it in a directory under ``root``."""
    checks: list[Check] = []
    steps: tuple[Callable[[AgentSpec, Mapping[str, str]], Check], ...] = (
        _installed,
        _version,
        _task,
    )
    if spec.as_service:
        service_root = root or Path(tempfile.gettempdir())
        steps = (
            partial(_probe, runs=runs, root=service_root),
            partial(_task, runs=runs, root=service_root),
        )
    for step in steps:
        result = step(spec, worker_env)
        checks.append(result)
        if not result.passed:
            break
    return Conformance(spec.id, tuple(checks))


def record(
    pool: Pool,
    spec: AgentSpec,
    result: Conformance,
    at: datetime,
    worker_env: Mapping[str, str] | None = None,
) -> None:
    health = EngineHealthStore(pool=pool)
    with transaction(pool) as conn:
        health.register_on(
            conn,
            spec.id,
            installed=installed(spec, worker_env),
            local=spec.local,
            weight=spec.weight,
            capabilities=spec.capabilities,
        )
        health.record_doctor_on(conn, spec.id, passed=result.passed, at=at)


def _installed(spec: AgentSpec, worker_env: Mapping[str, str]) -> Check:
    if spec.adapter == "scripted":
        return Check("installed", True, "vibey's own")
    found = installed(spec, worker_env)
    return Check("installed", found, spec.binary if found else f"{spec.binary!r} not found")


def _version(spec: AgentSpec, worker_env: Mapping[str, str]) -> Check:
    if spec.adapter == "scripted":
        return Check("version", True, "vibey's own")
    try:
        done = subprocess.run(
            [spec.binary, "--version"],
            env=spec.environment(worker_env),
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("version", False, str(exc)[:300])
    text = (done.stdout or done.stderr).strip().splitlines()
    return Check(
        "version", done.returncode == 0, text[0][:200] if text else f"exit {done.returncode}"
    )


def _probe(
    spec: AgentSpec, worker_env: Mapping[str, str], *, runs: RunClient | None, root: Path
) -> Check:
    if runs is None:
        return Check("service probe", False, "no broker: set VIBEY_AMQP_URL")
    version = CLI_ADAPTERS[spec.adapter](spec, worker_env={}, transcripts=root).version_argv()
    try:
        result = runs.probe(spec, root, version, wait=VERSION_TIMEOUT_S)
    except EngineQueueSaturated as exc:
        return Check("service probe", False, str(exc)[:300])
    text = result.detail.strip().splitlines()
    passed = result.status is RunStatus.EXITED and result.exit_code == 0
    return Check("service probe", passed, text[0][:200] if text else str(result.status))


def _task(
    spec: AgentSpec,
    worker_env: Mapping[str, str],
    *,
    runs: RunClient | None = None,
    root: Path | None = None,
) -> Check:
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vibey-conformance-", dir=root) as tmp:
        root = Path(tmp)
        workdir = Workspace(root / "work").worktree("conformance", 0, ITEM["id"])
        engine = engine_for(spec, worker_env=worker_env, state_dir=root / "state", runs=runs)
        step_input = {"item": ITEM, "engine": {"name": "roster", "script": {}}}
        with WorktreeLease().hold(workdir, "conformance", 1, "conformance") as held:
            task = EngineTask(
                BUILD_IMPLEMENT,
                "conformance",
                0,
                ITEM["id"],
                1,
                step_input,
                workdir,
                effort="TRIVIAL",
                workdir=workdir,
                lease=held,
                job_id="conformance",
            )
            verdict = engine.run(task)
    edited = [e for e in verdict.evidence.get("ledger", []) if e.get("kind") == "FileEdited"]
    if verdict.status != "ok":
        return Check("headless task", False, verdict.detail[:300])
    if not edited and spec.adapter not in ("scripted", "command"):
        return Check("headless task", False, "the task reported success but edited no file")
    return Check("headless task", True, f"ok, {len(edited)} file(s) edited")
