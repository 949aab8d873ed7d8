"""The Claude Code adapter against the messages the real ``claude`` 2.1.332 prints (captured
from it against tests/real_cli/anthropic_api.py): each fault class from its error channel only,
the first decisive ``api_retry`` stopping the run, and one FileEdited per file, however the CLI
and git spell its path."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.agents import EngineTask
from actors.agents.adapters import engine_for
from actors.agents.claude_code import ClaudeCodeAdapter
from actors.agents.cli import Reading, edited
from actors.agents.lease import WorktreeLease
from actors.agents.roster import AgentSpec
from actors.worktrees import Workspace
from tests.agents.fake_cli import install
from workflows.capacity import AuthenticationFailed, CreditsExhausted, WindowExhausted

RESET = 1_900_000_000
INIT = {"type": "system", "subtype": "init", "session_id": "s", "cwd": "/w/billing-api-401"}


def _adapter() -> ClaudeCodeAdapter:
    spec = AgentSpec("claude", "claude-code")
    return ClaudeCodeAdapter(spec, worker_env={}, transcripts=Path("/nonexistent"))


def _read(*events: dict[str, Any], stderr: str = "") -> Reading:
    stdout = "".join(json.dumps(e) + "\n" for e in (INIT, *events))
    return _adapter().read(stdout, stderr, 1)


def _retry(error: str, status: int | None, attempt: int = 1) -> dict[str, Any]:
    return {
        "type": "system",
        "subtype": "api_retry",
        "attempt": attempt,
        "max_retries": 10,
        "retry_delay_ms": 608,
        "error_status": status,
        "error": error,
        "session_id": "s",
    }


def _api_error(error: str, text: str, status: int | None, **more: Any) -> list[dict[str, Any]]:
    message = {
        "model": "<synthetic>",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
    }
    assistant: dict[str, Any] = {"type": "assistant", "message": message, "error": error}
    assistant |= {"is_api_error_message": True, "api_error_status": status, **more}
    result: dict[str, Any] = {"type": "result", "subtype": "success", "is_error": True}
    result |= {"result": text, "api_error_status": status, "num_turns": 1, "usage": {}}
    return [assistant, result]


def test_a_refused_key_decides_the_run_at_its_first_retry() -> None:
    reading = _read(_retry("authentication_failed", 401))
    assert reading.decided
    assert isinstance(reading.capacity, AuthenticationFailed)
    assert "HTTP 401" in reading.capacity.detail
    assert reading.malformed is None  # no result event: the run was stopped, not broken


def test_a_bare_401_retry_decides_it_too() -> None:
    reading = _read(_retry("unknown", 401))
    assert reading.decided and isinstance(reading.capacity, AuthenticationFailed)


@pytest.mark.parametrize(
    ("error", "status"),
    [("overloaded", 529), ("server_error", 500), ("unknown", None), ("rate_limit", 429)],
)
def test_a_transient_retry_decides_nothing(error: str, status: int | None) -> None:
    reading = _read(_retry(error, status))
    assert not reading.decided
    assert reading.capacity is None


def test_the_refused_key_after_its_retries_is_authentication_failed() -> None:
    events = [_retry("authentication_failed", 401, n) for n in (1, 2)]
    events += _api_error("authentication_failed", "Invalid API key · Fix external API key", 401)
    reading = _read(*events)
    assert isinstance(reading.capacity, AuthenticationFailed)


def test_not_logged_in_is_authentication_failed() -> None:
    reading = _read(*_api_error("authentication_failed", "Not logged in · Please run /login", None))
    assert isinstance(reading.capacity, AuthenticationFailed)


def test_a_credit_balance_too_low_is_credits_exhausted() -> None:
    reading = _read(*_api_error("billing_error", "Credit balance is too low", 400))
    assert isinstance(reading.capacity, CreditsExhausted)
    assert not reading.decided  # it did not retry: it is ending anyway


def test_a_subscription_window_carries_the_clis_reset_time() -> None:
    info = {"status": "rejected", "resetsAt": RESET, "rateLimitType": "five_hour"}
    text = "You've hit your 5-hour limit · resets Mar 17, 2030, 5:46pm (UTC)"
    reading = _read(
        {"type": "rate_limit_event", "rate_limit_info": {**info, "isUsingOverage": False}},
        *_api_error("rate_limit", text, 429),
    )
    assert isinstance(reading.capacity, WindowExhausted)
    assert reading.capacity.resets_at == datetime.fromtimestamp(RESET, UTC)


def test_an_api_key_rate_limit_without_a_reset_is_a_window_of_unknown_end() -> None:
    text = "API Error: Request rejected (429) · This request would exceed the rate limit"
    before = datetime.now(UTC)
    reading = _read(*_api_error("rate_limit", text, 429, api_error_type="rate_limit_error"))
    assert isinstance(reading.capacity, WindowExhausted)
    assert before + timedelta(minutes=14) < reading.capacity.resets_at
    assert reading.capacity.resets_at < before + timedelta(minutes=16)


def test_a_connection_error_to_a_path_with_401_and_billing_is_an_engine_error() -> None:
    text = "API Error: Connection refused (http://127.0.0.1:9/billing-api/401) (ECONNREFUSED)"
    reading = _read(*_api_error("server_error", text, None))
    assert reading.capacity is None
    assert reading.error is not None and reading.error.startswith("server_error")


def test_the_models_words_never_classify() -> None:
    """A failed run whose final text is the model's (max turns), naming billing and 401."""
    result = {"type": "result", "subtype": "error_max_turns", "is_error": True, "num_turns": 9}
    result |= {"result": "Edited billing-api/auth_401.py; quota exceeded tests pass", "usage": {}}
    tool = {"type": "tool_use", "id": "t", "name": "Write", "input": {"file_path": "billing/401"}}
    reading = _read({"type": "assistant", "message": {"content": [tool]}}, result)
    assert reading.capacity is None
    assert reading.error is not None and reading.error.startswith("error_max_turns")


def test_stderr_paths_never_classify() -> None:
    reading = _read(stderr="Error: ENOENT: no such file '/srv/billing-api/401/x.json'\n")
    assert reading.capacity is None
    assert reading.malformed == "the stream ended without a result event"


def test_a_success_records_tools_files_and_cost() -> None:
    write = {"type": "tool_use", "id": "t1", "name": "Write", "input": {"file_path": "/w/a.txt"}}
    bash = {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "ls"}}
    result = {"type": "result", "subtype": "success", "is_error": False, "num_turns": 3}
    result |= {"result": "Done", "total_cost_usd": 0.5, "usage": {"input_tokens": 7}}
    reading = _read(
        {"type": "assistant", "message": {"content": [write]}},
        {"type": "assistant", "message": {"content": [bash]}},
        result,
    )
    assert (reading.tools, reading.files) == (["Write", "Bash"], ["/w/a.txt"])
    assert (reading.dollars, reading.input_tokens, reading.capacity) == (0.5, 7, None)


# -- one path per edited file ----------------------------------------------------------------

segment = st.text(alphabet="abcxyz019_-.", min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..")
)
relative = st.lists(segment, min_size=1, max_size=3).map(lambda parts: "/".join(parts))


@given(st.lists(relative, min_size=1, max_size=6))
def test_absolute_and_relative_spellings_of_a_file_are_one_path(paths: list[str]) -> None:
    root = Path("/tmp/vibey-edited-root")
    spelt = [str(root / p) if i % 2 else p for i, p in enumerate(paths)]
    spelt += [f"./{p}" for p in paths] + [str(root / p) for p in paths]
    names = edited(root, spelt)
    assert names == list(dict.fromkeys(os.path.normpath(p) for p in paths))
    assert edited(root, names) == names  # already normal


def test_a_path_outside_the_workdir_stays_absolute(tmp_path: Path) -> None:
    inside = tmp_path / "work"
    inside.mkdir()
    assert edited(inside, [str(tmp_path / "elsewhere.txt"), str(inside / "src" / "a.txt")]) == [
        str(tmp_path / "elsewhere.txt"),
        "src/a.txt",
    ]


def test_vibeys_own_files_are_no_edit(tmp_path: Path) -> None:
    verdict = str(tmp_path / ".vibey" / "verdicts" / "job-1.json")
    assert edited(tmp_path, [verdict, "src/a.txt", ".vibey/plans/job-1.md"]) == ["src/a.txt"]


def test_a_symlinked_workdir_still_gives_one_path(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert edited(
        tmp_path / "link", [str(real / "a.txt"), "a.txt", str(tmp_path / "link/a.txt")]
    ) == ["a.txt"]


# -- against the fake CLI --------------------------------------------------------------------


def _run(tmp_path: Path, env: dict[str, str], timeout: float = 120.0) -> tuple[Any, float]:
    fakes = install(tmp_path / "bin")
    spec = AgentSpec(
        "claude", "claude-code", binary=str(fakes["claude"]), env=env, timeout_seconds=timeout
    )
    engine = engine_for(spec, worker_env=dict(os.environ), state_dir=tmp_path / "state")
    workdir = Workspace(tmp_path / "work").worktree("demo", 0, "core")
    step_input = {
        "item": {"id": "core", "title": "Core"},
        "engine": {"name": "roster", "script": {}},
    }
    with WorktreeLease().hold(workdir, "job-1", 1, "claim-1") as held:
        task = EngineTask(
            "build.implement",
            "demo",
            0,
            "core",
            1,
            step_input,
            workdir,
            workdir=workdir,
            lease=held,
            job_id="job-1",
        )
        started = time.monotonic()
        verdict = engine.run(task)
    return verdict, time.monotonic() - started


def test_a_refused_key_stops_the_cli_instead_of_waiting_out_its_retries(tmp_path: Path) -> None:
    """The fake retries ten times 30 s apart (five minutes), as the real one does a 401."""
    verdict, took = _run(tmp_path, {"FAKE_SCENARIO": "auth", "FAKE_RETRY_DELAY": "30"})
    assert verdict.status == "capacity"
    assert verdict.result["capacity"]["state"] == "AuthenticationFailed"
    assert took < 15, f"waited {took:.1f} s"
    completed = [e for e in verdict.evidence["ledger"] if e["kind"] == "TurnCompleted"]
    assert completed[0]["payload"]["status"] == "stopped"


def test_a_success_records_each_edited_file_once(tmp_path: Path) -> None:
    """The fake reports ``<worktree>/src/core.txt`` (absolute, as Claude Code's Write does)
    and git shows ``src/core.txt``: one FileEdited."""
    verdict, _ = _run(tmp_path, {"FAKE_SCENARIO": "success"})
    assert verdict.status == "ok", verdict.detail
    files = [e["payload"]["path"] for e in verdict.evidence["ledger"] if e["kind"] == "FileEdited"]
    assert files == ["src/core.txt"]
