"""The real Claude Code (the pinned ``@anthropic-ai/claude-code``) against the scripted local
Anthropic Messages API (:mod:`tests.real_cli.anthropic_api`), pointed at it as a user would:
``ANTHROPIC_BASE_URL`` and a key in the engine's ``env`` (docs/engines.md).

The pinned version answers; ``vibey doctor --conformance --record`` passes as the docs
configure it, with one FileEdited for the one file written; each fault class is classified as
its real message means (a refused key in seconds, not after the CLI's ten retries; spent
credits; a rate limit, with the CLI's reset time when it gives one); a transient 529 is left to
the CLI's own retry; and a failed run in a directory named ``billing-api-401`` is an engine
fault, whatever its paths say.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from actors.agents import EngineTask, EngineVerdict
from actors.agents.adapters import engine_for
from actors.agents.lease import WorktreeLease
from actors.agents.roster import AgentSpec
from actors.worktrees import Workspace
from tests.acceptance.stack import Stack, declare_topology, stack
from tests.amqp_fixtures import Amqp
from tests.real_cli.anthropic_api import RESET, AnthropicApi
from tests.real_cli.conftest import ROOT, cli_version

VIBEY = str(Path(sys.executable).with_name("vibey"))
KEY = "sk-ant-api03-local-test-key"
QUIET = {"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def pinned() -> str:
    package = json.loads((ROOT / "ops" / "real-cli" / "package.json").read_text())
    return str(package["dependencies"]["@anthropic-ai/claude-code"])


@pytest.fixture
def claude(real_cli_bin: Path) -> Path:
    return real_cli_bin / "claude"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The engine's own HOME: Claude Code keeps its settings and sessions under ~/.claude."""
    path = tmp_path / "home"
    path.mkdir()
    return path


def engine_env(api: AnthropicApi, home: Path, **more: str) -> dict[str, str]:
    """What docs/engines.md tells a user to put in ``[engines.claude] env``."""
    pointed = {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": KEY}
    return {**pointed, **QUIET, "HOME": str(home), **more}


def run_step(
    claude: Path,
    tmp_path: Path,
    env: Mapping[str, str],
    *,
    args: tuple[str, ...] = (),
    project: str = "demo",
    timeout: float = 240.0,
) -> tuple[EngineVerdict, float]:
    """build.implement of item ``core`` through the adapter, as a step runs it."""
    spec = AgentSpec(
        "claude",
        "claude-code",
        binary=str(claude),
        env=dict(env),
        args=args,
        timeout_seconds=timeout,
    )
    worker_env = {"PATH": os.environ["PATH"]}
    engine = engine_for(spec, worker_env=worker_env, state_dir=tmp_path / "state")
    workdir = Workspace(tmp_path / "work").worktree(project, 0, "core")
    step_input = {"item": {"id": "core", "title": "Core"}, "engine": {"name": "roster"}}
    with WorktreeLease().hold(workdir, "job-1", 1, "claim-1") as held:
        task = EngineTask(
            "build.implement",
            project,
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


def entries(verdict: EngineVerdict, kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in verdict.evidence.get("ledger", []) if e["kind"] == kind]


def test_the_pinned_version_answers(real_cli_bin: Path) -> None:
    assert cli_version(real_cli_bin, "claude") == f"{pinned()} (Claude Code)"


def test_conformance_passes_through_vibey_doctor_as_the_docs_configure_it(
    claude: Path, home: Path, tmp_path: Path, pg_url: str
) -> None:
    with AnthropicApi() as api:
        env = ", ".join(f'{k} = "{v}"' for k, v in engine_env(api, home).items())
        config = tmp_path / "vibey.toml"
        config.write_text(
            f'[engines.claude]\nadapter = "claude-code"\nbinary = "{claude}"\n'
            f"timeout_seconds = 240\nenv = {{ {env} }}\n"
        )
        base = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
        vibey_env = base | {"VIBEY_PG_URL": pg_url, "VIBEY_CONFIG": str(config)}
        done = subprocess.run(
            [VIBEY, "doctor", "--conformance", "--record", "--json"],
            env=vibey_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        [engine] = json.loads(done.stdout)["engines"]
        assert engine["id"] == "claude" and engine["passed"], engine
        assert "ok, 1 file(s) edited" in json.dumps(engine)  # once, not as two spellings
        tools = [r.body["messages"][-1] for r in api.messages()[1:]]
        assert all(m["content"][0]["type"] == "tool_result" for m in tools), tools
        assert len(api.messages()) == 3  # Write, Bash, the result
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT last_doctor_at IS NOT NULL, authenticated_at IS NOT NULL "
            "FROM engine_health WHERE engine_id = 'claude'"
        ).fetchone()
    assert row == (True, True)


def test_a_refused_key_is_authentication_failed_in_seconds(
    claude: Path, home: Path, tmp_path: Path
) -> None:
    """401 ``invalid x-api-key``: the CLI would retry ten times (about three minutes); its
    first ``api_retry`` says ``authentication_failed`` and the run stops there."""
    with AnthropicApi(fault="auth") as api:
        verdict, took = run_step(claude, tmp_path, engine_env(api, home))
        asked = len(api.messages())
    assert verdict.status == "capacity", verdict.detail
    assert verdict.result["capacity"]["state"] == "AuthenticationFailed"
    assert took < 30, f"took {took:.1f} s"
    assert asked <= 3, f"{asked} requests: the CLI's retries were waited out"
    [completed] = entries(verdict, "TurnCompleted")
    assert completed["status"] == "stopped"


def test_a_credit_balance_too_low_is_credits_exhausted(
    claude: Path, home: Path, tmp_path: Path
) -> None:
    with AnthropicApi(fault="credits") as api:
        verdict, _ = run_step(claude, tmp_path, engine_env(api, home))
    assert verdict.status == "capacity", verdict.detail
    state = verdict.result["capacity"]
    assert state["state"] == "CreditsExhausted" and "resets_at" not in state
    assert entries(verdict, "CapacityRejected")[0]["state"] == "CreditsExhausted"


def test_a_subscription_window_is_exhausted_until_the_clis_reset_time(
    claude: Path, home: Path, tmp_path: Path
) -> None:
    """A subscription (an OAuth token) at its five-hour limit: the 429's unified headers
    become a ``rate_limit_event`` with ``resetsAt``, and that is the window's end."""
    with AnthropicApi(fault="subscription_limit") as api:
        env = engine_env(api, home, CLAUDE_CODE_OAUTH_TOKEN="sk-ant-oat01-local-test")
        del env["ANTHROPIC_API_KEY"]
        verdict, _ = run_step(claude, tmp_path, env)
    assert verdict.status == "capacity", verdict.detail
    state = verdict.result["capacity"]
    assert state["state"] == "WindowExhausted"
    assert datetime.fromisoformat(state["resets_at"]) == datetime.fromtimestamp(RESET, UTC)


@pytest.mark.parametrize("fault", ["rate_limit_reset", "rate_limit"])
def test_an_api_key_rate_limit_is_a_window(
    claude: Path, home: Path, tmp_path: Path, fault: str
) -> None:
    """An API key's 429: with ``retry-after`` past a minute the CLI gives up at once and says
    no reset time, so the window is of unknown end (now + 15 min, the circuit's probe may
    close it sooner); without one it retries (``CLAUDE_CODE_MAX_RETRIES`` bounds that)."""
    with AnthropicApi(fault=fault) as api:
        before = datetime.now(UTC)
        env = engine_env(api, home, CLAUDE_CODE_MAX_RETRIES="1")
        verdict, _ = run_step(claude, tmp_path, env)
    assert verdict.status == "capacity", verdict.detail
    state = verdict.result["capacity"]
    assert state["state"] == "WindowExhausted"
    resets = datetime.fromisoformat(state["resets_at"])
    assert before + timedelta(minutes=14) < resets < before + timedelta(minutes=17)


def test_an_overloaded_api_is_left_to_the_clis_retry(
    claude: Path, home: Path, tmp_path: Path
) -> None:
    """A 529 is not decisive: the CLI retries it and the step completes."""
    with AnthropicApi(faults=["overloaded"]) as api:
        verdict, _ = run_step(claude, tmp_path, engine_env(api, home))
        asked = len(api.messages())
    assert verdict.status == "ok", verdict.detail
    assert asked == 4  # the refused one, then Write, Bash, the result
    assert [f["path"] for f in entries(verdict, "FileEdited")] == ["src/core.txt"]
    assert {t["tool"] for t in entries(verdict, "ToolInvoked")} == {"Write", "Bash"}


def test_a_failed_run_in_a_billing_api_401_directory_is_an_engine_fault(
    claude: Path, home: Path, tmp_path: Path
) -> None:
    """The model's last words name the file it is writing, under ``billing-api-401``; the run
    ends at ``--max-turns 1``: an engine fault, never spent credits or a refused key."""
    with AnthropicApi() as api:
        where = tmp_path / "billing-api-401"
        verdict, _ = run_step(
            claude, where, engine_env(api, home), args=("--max-turns", "1"), project="billing-api"
        )
    assert verdict.status == "failed" and verdict.engine_fault, verdict.detail
    assert "error_max_turns" in verdict.detail
    assert not entries(verdict, "CapacityRejected")


# -- a whole protocol workflow through the real stack ----------------------------------------

SCRIPT = """
[design]
questions = [{ id = "audience", question = "Who is it for?", answers = [] }]

[build]
work_items = [{ id = "a1", title = "one" }, { id = "a2", title = "two" }]
"""


@pytest.fixture
def e2e(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    declare_topology(pg_url, amqp)
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


def test_a_protocol_workflow_completes_on_the_real_claude_code(
    e2e: Stack, claude: Path, home: Path, tmp_path: Path, pg_url: str
) -> None:
    """A new project (no ``--repo``, a ``--test-command``) through design, build, review and
    deploy with every engine-driven step on the real CLI: one attempt per step, and the
    ledger holds each turn's evidence, each edited file once, and verifies."""
    with AnthropicApi() as api:
        env = ", ".join(f'{k} = "{v}"' for k, v in engine_env(api, home).items())
        e2e.config = tmp_path / "vibey.toml"
        e2e.config.write_text(
            f'[engines.claude]\nadapter = "claude-code"\nbinary = "{claude}"\n'
            f"timeout_seconds = 240\nenv = {{ {env} }}\n"
        )
        (tmp_path / "script.toml").write_text(SCRIPT)
        e2e.vibey("doctor", "--conformance", "--record", timeout=300)
        e2e.start_worker()
        script = str(tmp_path / "script.toml")
        test = "test -f src/a1.txt -a -f src/a2.txt"
        start = ("workflow", "start", "demo", "--engines", "claude", "--script", script)
        e2e.vibey(*start, "--test-command", test)
        final = e2e.drive(["demo"], deadline_s=600)["demo"]["workflow"]
        assert final["status"] == "completed", final
        turns = len(api.messages())
    assert "digests match" in e2e.vibey("ledger", "verify", "demo").stdout
    events = e2e.every("ledger", "show", "demo")
    kinds = Counter(e["kind"] for e in events)
    assert kinds["TurnRequested"] == kinds["TurnCompleted"] == kinds["TranscriptRecorded"] > 0
    assert kinds["BudgetSpent"] >= kinds["TurnCompleted"], kinds
    tools = Counter(e["payload"]["tool"] for e in events if e["kind"] == "ToolInvoked")
    assert tools["Write"] == 2 and tools["Bash"] == kinds["TurnCompleted"], tools
    # a request per tool call and one for the result, in every turn and in the doctor's
    assert turns == 3 + tools.total() + kinds["TurnCompleted"]
    edited = Counter(e["payload"]["path"] for e in events if e["kind"] == "FileEdited")
    assert edited == {"src/a1.txt": 1, "src/a2.txt": 1}, edited
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute("SELECT kind, subject, attempts, engine_id FROM job").fetchall()
    assert rows and all(attempts == 1 for _, _, attempts, _ in rows), rows
    assert {engine for *_, engine in rows if engine} == {"claude"}


def test_spent_credits_mid_build_hand_off_to_another_engine(
    e2e: Stack, claude: Path, home: Path, tmp_path: Path, pg_url: str
) -> None:
    """The API says the credit balance is too low for every build.implement: the real CLI's
    ``billing_error`` is CreditsExhausted, and each item hands off (a brief the no-loss gate
    passed) to the roster's other engine; the workflow completes."""
    with AnthropicApi(fault="credits", kinds=["build.implement"]) as api:
        env = ", ".join(f'{k} = "{v}"' for k, v in engine_env(api, home).items())
        e2e.config = tmp_path / "vibey.toml"
        e2e.config.write_text(
            f'[engines.claude]\nadapter = "claude-code"\nbinary = "{claude}"\nweight = 3\n'
            f"timeout_seconds = 240\nenv = {{ {env} }}\n\n"
            '[engines.backup]\nadapter = "scripted"\nweight = 1\n'
        )
        (tmp_path / "script.toml").write_text(SCRIPT)
        done = e2e.vibey("doctor", "--conformance", "--record", check=False, timeout=300)
        assert done.returncode == 1, done.stdout  # its check is a build.implement: refused
        with psycopg.connect(pg_url, autocommit=True) as conn:  # as an operator would
            conn.execute(
                "UPDATE engine_health SET last_doctor_at = now(), authenticated_at = now() "
                "WHERE engine_id = 'claude'"
            )
        e2e.start_worker()
        script = str(tmp_path / "script.toml")
        e2e.vibey("workflow", "start", "relay", "--engines", "claude,backup", "--script", script)
        final = e2e.drive(["relay"], deadline_s=600)["relay"]["workflow"]
        assert final["status"] == "completed", final
    assert "digests match" in e2e.vibey("ledger", "verify", "relay").stdout
    events = e2e.every("ledger", "show", "relay")
    rejected = [e["payload"] for e in events if e["kind"] == "CapacityRejected"]
    assert rejected and {r["engine"] for r in rejected} == {"claude"}
    assert all(r["state"] == "CreditsExhausted" and "resets_at" not in r for r in rejected)
    accepted = [e["payload"] for e in events if e["kind"] == "HandoffAccepted"]
    assert accepted and all(a["from"] == "claude" and a["to"] == "backup" for a in accepted)
