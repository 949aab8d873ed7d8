"""Every adapter against its fake CLI (tests/agents/fake_cli.py), one scenario at a time:
success with FileEdited and BudgetSpent recorded; a window limit with the CLI's reset time; spent
credits; a failed login; a crash; a hang (the group killed within the timeout and grace);
garbage; and "exit 0, nothing changed", which is not a success."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from actors.agents import EngineTask, EngineVerdict
from actors.agents.adapters import engine_for
from actors.agents.lease import WorktreeLease
from actors.agents.roster import AgentSpec
from actors.worktrees import Workspace
from tests.agents.fake_cli import RESET, SOURCE, install
from workflows.capacity import (
    AuthenticationFailed,
    CreditsExhausted,
    WindowExhausted,
    rejection_from_payload,
)

ADAPTERS = {"claude-code": "claude", "codex": "codex", "gemini": "gemini", "aider": "aider"}
# A scenario that ends on its own has room on a saturated box (the suite's parallel tier on 2
# cores: a fake CLI's start alone can take seconds); a hang is killed at HANG_TIMEOUT.
TIMEOUT = 30.0
HANG_TIMEOUT = 3.0
GRACE = 2.0


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return install(tmp_path_factory.mktemp("bin"))


def run(
    fakes: dict[str, Path],
    tmp_path: Path,
    adapter: str,
    scenario: str,
    kind: str = "build.implement",
    *,
    stream: Any = None,
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT,
) -> EngineVerdict:
    spec = AgentSpec(
        read_allow=(SOURCE,),
        id=f"{adapter}-1",
        adapter=adapter,
        binary=str(fakes[ADAPTERS[adapter]]),
        env={"FAKE_SCENARIO": scenario, **(env or {})},
        timeout_seconds=timeout,
        effort={"LOW": ("--model", "small")},
    )
    engine = engine_for(spec, worker_env=dict(os.environ), state_dir=tmp_path / "state")
    workspace = Workspace(tmp_path / "work")
    item = {"id": "core", "title": "Core"}
    if kind == "build.implement":
        workdir = workspace.worktree("demo", 0, "core")
        step_input: dict[str, Any] = {"item": item}
    else:
        workdir = workspace.integrated("demo")
        step_input = {"answers": {}}
    step_input["engine"] = {"name": "roster", "script": {}}
    with WorktreeLease().hold(workdir, "job-1", 1, "claim-1") as held:
        task = EngineTask(
            kind,
            "demo",
            0,
            "core",
            1,
            step_input,
            workdir if kind == "build.implement" else None,
            effort="LOW",
            workdir=workdir,
            lease=held,
            job_id="job-1",
            stream=stream,
        )
        return engine.run(task)


def kinds(verdict: EngineVerdict) -> list[str]:
    return [entry["kind"] for entry in verdict.evidence.get("ledger", [])]


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_success_edits_files_and_records_the_turn(
    fakes: dict[str, Path], tmp_path: Path, adapter: str
) -> None:
    verdict = run(fakes, tmp_path, adapter, "success")
    assert verdict.status == "ok", verdict.detail
    assert verdict.result["status"] == "done"
    ledger = verdict.evidence["ledger"]
    edited = [e["payload"]["path"] for e in ledger if e["kind"] == "FileEdited"]
    assert "src/core.txt" in edited
    spent = next(e["payload"] for e in ledger if e["kind"] == "BudgetSpent")
    assert spent["input_tokens"] > 0 and spent["output_tokens"] > 0
    assert ("dollars" in spent) is (adapter in ("claude-code", "aider"))
    transcript = next(e["payload"] for e in ledger if e["kind"] == "TranscriptRecorded")
    assert hashlib.sha256(Path(transcript["path"]).read_bytes()).hexdigest() == transcript["sha256"]
    assert {"TurnRequested", "TurnCompleted"} <= set(kinds(verdict))


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_non_implement_kind_reports_its_result(
    fakes: dict[str, Path], tmp_path: Path, adapter: str
) -> None:
    verdict = run(fakes, tmp_path, adapter, "success", kind="design.research")
    assert verdict.status == "ok", verdict.detail
    assert isinstance(verdict.result.get("notes"), str)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_window_limit_is_window_exhausted_with_the_reset(
    fakes: dict[str, Path], tmp_path: Path, adapter: str
) -> None:
    verdict = run(fakes, tmp_path, adapter, "window")
    assert verdict.status == "capacity", verdict.detail
    state = rejection_from_payload(verdict.result["capacity"])
    assert isinstance(state, WindowExhausted)
    if adapter == "aider":  # "try again in 60s"
        assert 0 < (state.resets_at - datetime.now(UTC)).total_seconds() <= 61
    elif adapter == "gemini":  # "retryDelay: 3600s"
        assert 3500 < (state.resets_at - datetime.now(UTC)).total_seconds() <= 3601
    elif adapter == "codex":  # "try again at Mar 17th, 2030 5:46 PM.": the minute, local time
        assert state.resets_at == datetime.fromtimestamp(RESET - RESET % 60, UTC)
    else:
        assert state.resets_at == datetime.fromtimestamp(RESET, UTC)
    assert "CapacityRejected" in kinds(verdict)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_spent_credits_are_credits_exhausted_without_a_deadline(
    fakes: dict[str, Path], tmp_path: Path, adapter: str
) -> None:
    verdict = run(fakes, tmp_path, adapter, "credits")
    assert verdict.status == "capacity", verdict.detail
    assert isinstance(rejection_from_payload(verdict.result["capacity"]), CreditsExhausted)
    assert "resets_at" not in verdict.result["capacity"]


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_failed_login_is_authentication_failed(
    fakes: dict[str, Path], tmp_path: Path, adapter: str
) -> None:
    verdict = run(fakes, tmp_path, adapter, "auth")
    assert verdict.status == "capacity", verdict.detail
    assert isinstance(rejection_from_payload(verdict.result["capacity"]), AuthenticationFailed)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_crash_mid_stream_is_an_engine_failure(
    fakes: dict[str, Path], tmp_path: Path, adapter: str
) -> None:
    verdict = run(fakes, tmp_path, adapter, "crash")
    assert verdict.status == "failed" and verdict.engine_fault
    assert "signal 9" in verdict.detail


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_hang_is_killed_within_the_timeout_and_grace(
    fakes: dict[str, Path], tmp_path: Path, adapter: str
) -> None:
    started = time.monotonic()
    verdict = run(fakes, tmp_path, adapter, "hang", timeout=HANG_TIMEOUT)
    assert time.monotonic() - started < HANG_TIMEOUT + 2 * GRACE + 3
    assert verdict.status == "failed" and verdict.engine_fault
    assert "timeout" in verdict.detail


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_garbage_is_an_engine_failure(fakes: dict[str, Path], tmp_path: Path, adapter: str) -> None:
    verdict = run(fakes, tmp_path, adapter, "garbage")
    assert verdict.status == "failed" and verdict.engine_fault
    expected = "reported no result" if adapter == "aider" else "malformed output"
    assert expected in verdict.detail


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_exit_0_having_changed_nothing_is_not_a_success(
    fakes: dict[str, Path], tmp_path: Path, adapter: str
) -> None:
    verdict = run(fakes, tmp_path, adapter, "noop")
    assert verdict.status == "failed" and verdict.engine_fault
    assert "changed nothing" in verdict.detail


def test_a_missing_binary_is_an_engine_failure(tmp_path: Path) -> None:
    spec = AgentSpec(id="c", adapter="claude-code", binary="no-such-claude-here")
    engine = engine_for(spec, worker_env={"PATH": str(tmp_path)}, state_dir=tmp_path)
    task = EngineTask("design.research", "demo", 0, "", 1, {}, workdir=tmp_path)
    verdict = engine.run(task)
    assert verdict.engine_fault and "not installed" in verdict.detail


def test_the_engine_gets_only_its_own_environment(tmp_path: Path) -> None:
    spec = AgentSpec(id="c", adapter="codex", env={"CODEX_API_KEY": "k"})
    env = spec.environment({"PATH": "/bin", "VIBEY_PG_URL": "postgresql://secret", "HOME": "/h"})
    assert env == {"PATH": "/bin", "HOME": "/h", "CODEX_API_KEY": "k"}


def test_effort_saturates_onto_the_nearest_given_level() -> None:
    spec = AgentSpec(id="c", adapter="claude-code", effort={"LOW": ("-l",), "HIGH": ("-h",)})
    assert spec.effort_args("TRIVIAL") == ("-l",)
    assert spec.effort_args("STANDARD") == ("-l",)
    assert spec.effort_args("MAX") == ("-h",)
    assert AgentSpec(id="d", adapter="aider").effort_args("MAX") == ()


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_evidence_is_streamed_as_the_cli_reports_it_and_not_repeated(
    fakes: dict[str, Path], tmp_path: Path, adapter: str
) -> None:
    arrived: list[tuple[float, str, str]] = []

    def sink(entries: Any) -> bool:
        for entry in entries:
            detail = entry["payload"].get("path") or entry["payload"].get("tool") or ""
            arrived.append((time.monotonic(), entry["kind"], detail))
        return True

    pause = {"FAKE_PAUSE": "2"}
    verdict = run(fakes, tmp_path, adapter, "success", stream=sink, env=pause, timeout=60)
    ended = time.monotonic()
    assert verdict.status == "ok", verdict.detail
    streamed = [(kind, detail) for _, kind, detail in arrived]
    assert streamed[0][0] == "TurnRequested"
    assert ("FileEdited", "src/core.txt") in streamed
    edited_at = next(at for at, kind, d in arrived if (kind, d) == ("FileEdited", "src/core.txt"))
    assert ended - edited_at > 1.0  # it came while the CLI still worked, not after it exited
    left = [(e["kind"], e["payload"].get("path")) for e in verdict.evidence["ledger"]]
    assert ("FileEdited", "src/core.txt") not in left
    assert "TurnRequested" not in kinds(verdict)
    assert {"TurnCompleted", "BudgetSpent", "TranscriptRecorded"} <= set(kinds(verdict))
    assert verdict.evidence["streamed"] == len(arrived)


def test_a_sink_that_refuses_leaves_the_evidence_to_the_verdict(
    fakes: dict[str, Path], tmp_path: Path
) -> None:
    verdict = run(fakes, tmp_path, "claude-code", "success", stream=lambda _: False, timeout=60)
    assert verdict.status == "ok", verdict.detail
    assert {"TurnRequested", "FileEdited", "ToolInvoked"} <= set(kinds(verdict))
    assert verdict.evidence["streamed"] == 0
