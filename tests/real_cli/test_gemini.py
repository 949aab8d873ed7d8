"""The real Gemini CLI (the pinned ``@google/gemini-cli``) against the scripted local Gemini
API (:mod:`tests.real_cli.gemini_api`), pointed at it as a user would: ``GEMINI_API_KEY`` and
``GOOGLE_GEMINI_BASE_URL`` in the engine's ``env`` (docs/engines.md); vibey gives it the
engine's own Gemini home and ``--skip-trust``.

The pinned version answers; ``vibey doctor --conformance --record`` passes as the docs
configure it (before: exit 55 in every step folder, or 41 with a base URL), with one
FileEdited for the one file written; each fault class is classified as its real message
means (a per-minute 429 with a retry time is a window at the CLI's reset, not spent credits;
a daily quota and depleted prepayment credits are credits; ``API_KEY_INVALID`` is a refused
key); a failed run under ``billing-api-401`` is read from its error channel only; and a whole
protocol workflow runs on it through the real stack.

The fault tests pin a model (``--model``: the CLI's router then makes no side calls) and turn
the CLI's own retries down to one attempt with a Gemini home of their own
(``GEMINI_CLI_HOME``, its settings written by the user), as docs/engines.md says a user may.
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
from tests.real_cli.conftest import ROOT, cli_version
from tests.real_cli.gemini_api import RETRY_SECONDS, GeminiApi

VIBEY = str(Path(sys.executable).with_name("vibey"))
KEY = "AIzaSyLocalTestKey0000000000000000000"
MODEL = ("--model", "gemini-2.5-pro")


def pinned() -> str:
    package = json.loads((ROOT / "ops" / "real-cli" / "package.json").read_text())
    return str(package["dependencies"]["@google/gemini-cli"])


@pytest.fixture
def gemini(real_cli_bin: Path) -> Path:
    return real_cli_bin / "gemini"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The engine's HOME (the Gemini home itself is vibey's, under its state directory)."""
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def one_attempt(tmp_path: Path) -> Path:
    """A Gemini home of the user's own whose settings turn the CLI's retries down to one
    attempt (with the auth type it then must select itself)."""
    path = tmp_path / "gemini-home"
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}}}
    (path / ".gemini").mkdir(parents=True)
    (path / ".gemini" / "settings.json").write_text(
        json.dumps({**settings, "general": {"maxAttempts": 1}})
    )
    return path


def engine_env(api_url: str, home: Path, **more: str) -> dict[str, str]:
    """What docs/engines.md tells a user to put in ``[engines.gemini] env``."""
    return {"GEMINI_API_KEY": KEY, "GOOGLE_GEMINI_BASE_URL": api_url, "HOME": str(home), **more}


def toml_env(env: Mapping[str, str]) -> str:
    return ", ".join(f'{k} = "{v}"' for k, v in env.items())


def run_step(
    gemini: Path,
    tmp_path: Path,
    env: Mapping[str, str],
    *,
    args: tuple[str, ...] = MODEL,
    project: str = "demo",
    timeout: float = 240.0,
) -> tuple[EngineVerdict, float]:
    """build.implement of item ``core`` through the adapter, as a step runs it."""
    spec = AgentSpec(
        "gemini", "gemini", binary=str(gemini), env=dict(env), args=args, timeout_seconds=timeout
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
    assert cli_version(real_cli_bin, "gemini") == pinned()


def test_conformance_passes_through_vibey_doctor_as_the_docs_configure_it(
    gemini: Path, home: Path, tmp_path: Path, pg_url: str
) -> None:
    with GeminiApi() as api:
        config = tmp_path / "vibey.toml"
        config.write_text(
            f'[engines.gemini]\nadapter = "gemini"\nbinary = "{gemini}"\n'
            f"timeout_seconds = 240\nenv = {{ {toml_env(engine_env(api.url, home))} }}\n"
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
        assert engine["id"] == "gemini" and engine["passed"], engine
        assert "ok, 1 file(s) edited" in json.dumps(engine)  # once, not as two spellings
        turns = api.calls()
        assert len(turns) == 3  # write_file, run_shell_command, the result
        answered = [t.body["contents"][-1]["parts"][0] for t in turns[1:]]
        assert all("functionResponse" in part for part in answered), answered
        assert all(t.headers.get("x-goog-api-key") == KEY for t in api.requests)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT last_doctor_at IS NOT NULL, authenticated_at IS NOT NULL "
            "FROM engine_health WHERE engine_id = 'gemini'"
        ).fetchone()
    assert row == (True, True)


def test_a_step_records_its_tools_and_one_file(gemini: Path, home: Path, tmp_path: Path) -> None:
    with GeminiApi() as api:
        verdict, _ = run_step(gemini, tmp_path, engine_env(api.url, home))
    assert verdict.status == "ok", verdict.detail
    assert verdict.result["item"] == "core" and verdict.result["status"] == "done"
    assert [f["path"] for f in entries(verdict, "FileEdited")] == ["src/core.txt"]
    assert [t["tool"] for t in entries(verdict, "ToolInvoked")] == [
        "write_file",
        "run_shell_command",
    ]
    [spent] = entries(verdict, "BudgetSpent")
    assert spent["input_tokens"] > 0 and spent["output_tokens"] > 0


def test_a_per_minute_rate_limit_is_a_window_at_the_clis_reset_time(
    gemini: Path, home: Path, tmp_path: Path, one_attempt: Path
) -> None:
    """ "You exceeded your current quota, please check your plan and billing details … Please
    retry in 4.035955417s." (RetryableQuotaError): a window ending 4 s after the CLI gave up,
    not spent credits."""
    with GeminiApi(fault="rate_limit_reset") as api:
        before = datetime.now(UTC)
        env = engine_env(api.url, home, GEMINI_CLI_HOME=str(one_attempt))
        verdict, _ = run_step(gemini, tmp_path, env)
        after = datetime.now(UTC)
    assert verdict.status == "capacity", verdict.detail
    state = verdict.result["capacity"]
    assert state["state"] == "WindowExhausted", state
    resets = datetime.fromisoformat(state["resets_at"])
    delay = timedelta(seconds=RETRY_SECONDS)
    assert before + delay < resets <= after + delay
    assert state["detail"].startswith("RetryableQuotaError (429, retry in 4s): You exceeded")
    assert entries(verdict, "CapacityRejected")[0]["state"] == "WindowExhausted"
    assert len(api.calls()) == 1, "the CLI's own retries were not turned down"


@pytest.mark.parametrize(
    ("fault", "state", "said"),
    [
        ("daily_quota", "CreditsExhausted", "You have exhausted your daily quota"),
        ("credits", "CreditsExhausted", "Your prepayment credits are depleted."),
        ("auth", "AuthenticationFailed", "API key not valid. Please pass a valid API key."),
        ("rate_limit", "WindowExhausted", "Resource has been exhausted (e.g. check quota)."),
    ],
)
def test_each_fault_is_classified_as_its_real_message_means(
    gemini: Path,
    home: Path,
    tmp_path: Path,
    one_attempt: Path,
    fault: str,
    state: str,
    said: str,
) -> None:
    with GeminiApi(fault=fault) as api:
        before = datetime.now(UTC)
        env = engine_env(api.url, home, GEMINI_CLI_HOME=str(one_attempt))
        verdict, _ = run_step(gemini, tmp_path, env)
    assert verdict.status == "capacity", verdict.detail
    capacity = verdict.result["capacity"]
    assert capacity["state"] == state, capacity
    assert said in capacity["detail"] and "\n" not in capacity["detail"]
    assert "{'" not in capacity["detail"]  # never a dict's repr
    if state == "WindowExhausted":  # no retry time said: the unknown reset, 15 min
        resets = datetime.fromisoformat(capacity["resets_at"])
        assert before + timedelta(minutes=14) < resets < before + timedelta(minutes=17)
    else:
        assert "resets_at" not in capacity


def test_a_server_error_is_an_engine_fault_named_by_its_http_status(
    gemini: Path, home: Path, tmp_path: Path, one_attempt: Path
) -> None:
    """0.61 exits 244 on a 500 (its status modulo 256): not a signal."""
    with GeminiApi(fault="server_error") as api:
        verdict, _ = run_step(
            gemini, tmp_path, engine_env(api.url, home, GEMINI_CLI_HOME=str(one_attempt))
        )
    assert verdict.status == "failed" and verdict.engine_fault, verdict.detail
    assert verdict.detail == (
        "engine gemini: exit 244 (an API error, HTTP 500): ApiError (500): "
        "Internal error encountered."
    )
    assert not entries(verdict, "CapacityRejected")


def test_a_project_called_billing_api_401_changes_no_class(
    gemini: Path, home: Path, tmp_path: Path, one_attempt: Path
) -> None:
    """The step's folder and the prompt's paths say billing-api and 401: a rate limit there
    is still a window, and a refused connection an engine fault."""
    where = tmp_path / "billing-api-401"
    settings = {"GEMINI_CLI_HOME": str(one_attempt)}
    with GeminiApi(fault="rate_limit_reset") as api:
        limited, _ = run_step(
            gemini, where / "a", engine_env(api.url, home, **settings), project="billing-api"
        )
    assert limited.status == "capacity", limited.detail
    assert limited.result["capacity"]["state"] == "WindowExhausted"
    closed = engine_env("http://127.0.0.1:9", home, **settings)  # nothing listens there
    refused, _ = run_step(gemini, where / "b", closed, project="billing-api")
    assert refused.status == "failed" and refused.engine_fault, refused.detail
    assert "fetch failed" in refused.detail
    assert not entries(refused, "CapacityRejected")


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


def test_a_protocol_workflow_completes_on_the_real_gemini_cli(
    e2e: Stack, gemini: Path, home: Path, tmp_path: Path, pg_url: str
) -> None:
    """Design, build, review and deploy with every engine-driven step on the real CLI: one
    attempt per step, and the ledger holds each turn's evidence, each edited file once, and
    verifies."""
    with GeminiApi() as api:
        e2e.config = tmp_path / "vibey.toml"
        e2e.config.write_text(
            f'[engines.gemini]\nadapter = "gemini"\nbinary = "{gemini}"\n'
            f'args = ["--model", "gemini-2.5-pro"]\ntimeout_seconds = 300\n'
            f"env = {{ {toml_env(engine_env(api.url, home))} }}\n"
        )
        (tmp_path / "script.toml").write_text(SCRIPT)
        e2e.vibey("doctor", "--conformance", "--record", timeout=300)
        e2e.start_worker()
        script = str(tmp_path / "script.toml")
        e2e.vibey("workflow", "start", "demo", "--engines", "gemini", "--script", script)
        final = e2e.drive(["demo"], deadline_s=900)["demo"]["workflow"]
        assert final["status"] == "completed", final
    assert "digests match" in e2e.vibey("ledger", "verify", "demo").stdout
    events = e2e.every("ledger", "show", "demo")
    kinds = Counter(e["kind"] for e in events)
    assert kinds["TurnRequested"] == kinds["TurnCompleted"] == kinds["TranscriptRecorded"] > 0
    assert kinds["BudgetSpent"] >= kinds["TurnCompleted"], kinds
    tools = Counter(e["payload"]["tool"] for e in events if e["kind"] == "ToolInvoked")
    assert tools["write_file"] == 2, tools
    assert tools["run_shell_command"] == kinds["TurnCompleted"], tools
    edited = Counter(e["payload"]["path"] for e in events if e["kind"] == "FileEdited")
    assert edited == {"src/a1.txt": 1, "src/a2.txt": 1}, edited
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute("SELECT kind, subject, attempts, engine_id FROM job").fetchall()
    assert rows and all(attempts == 1 for _, _, attempts, _ in rows), rows
    assert {engine for *_, engine in rows if engine} == {"gemini"}


def test_depleted_credits_mid_build_hand_off_to_another_engine(
    e2e: Stack, gemini: Path, home: Path, tmp_path: Path, pg_url: str
) -> None:
    """The API says the prepayment credits are depleted for every build.implement: the real
    CLI's RetryableQuotaError (retried, no retry time) is CreditsExhausted, and each item
    hands off (a brief the no-loss gate passed) to the roster's other engine."""
    with GeminiApi(fault="credits", kinds=["build.implement"]) as api:
        e2e.config = tmp_path / "vibey.toml"
        e2e.config.write_text(
            f'[engines.gemini]\nadapter = "gemini"\nbinary = "{gemini}"\nweight = 3\n'
            f'args = ["--model", "gemini-2.5-pro"]\ntimeout_seconds = 300\n'
            f"env = {{ {toml_env(engine_env(api.url, home))} }}\n\n"
            '[engines.backup]\nadapter = "scripted"\nweight = 1\n'
        )
        (tmp_path / "script.toml").write_text(SCRIPT)
        done = e2e.vibey("doctor", "--conformance", "--record", check=False, timeout=300)
        assert done.returncode == 1, done.stdout  # its check is a build.implement: refused
        with psycopg.connect(pg_url, autocommit=True) as conn:  # as an operator would
            conn.execute(
                "UPDATE engine_health SET last_doctor_at = now(), authenticated_at = now() "
                "WHERE engine_id = 'gemini'"
            )
        e2e.start_worker()
        script = str(tmp_path / "script.toml")
        e2e.vibey("workflow", "start", "relay", "--engines", "gemini,backup", "--script", script)
        final = e2e.drive(["relay"], deadline_s=900)["relay"]["workflow"]
        assert final["status"] == "completed", final
    assert "digests match" in e2e.vibey("ledger", "verify", "relay").stdout
    events = e2e.every("ledger", "show", "relay")
    rejected = [e["payload"] for e in events if e["kind"] == "CapacityRejected"]
    assert rejected and {r["engine"] for r in rejected} == {"gemini"}
    assert all(r["state"] == "CreditsExhausted" and "resets_at" not in r for r in rejected)
    assert all("prepayment credits are depleted" in r["detail"] for r in rejected)
    accepted = [e["payload"] for e in events if e["kind"] == "HandoffAccepted"]
    assert accepted and all(a["from"] == "gemini" and a["to"] == "backup" for a in accepted)
