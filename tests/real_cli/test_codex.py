"""The real ``codex`` (the version pinned in ops/real-cli/package.json) against the local
Responses API server (tests/real_cli/openai_responses_api.py), configured as docs/engines.md
tells a user: an engine ``env`` with ``CODEX_HOME`` (a ``config.toml`` naming a
``[model_providers.<id>]`` with the server's ``base_url``, ``wire_api = "responses"``, its
``env_key`` and Codex's own retries turned down) and the key in that variable.

* conformance passes through ``vibey doctor --conformance --record`` and is recorded; the
  schema Codex sends is strict (the server refuses one that is not, as the API does: before the
  projection, every Codex run failed here);
* a whole protocol workflow (the demo script, two work items) runs on the real Codex through
  the real stack (worker, ``vibey workflow start --engines codex``, gates answered): it
  completes with one attempt per step, and its ledger holds each turn's evidence (TurnRequested
  and TurnCompleted, ToolInvoked, FileEdited once per file, BudgetSpent, TranscriptRecorded)
  and verifies;
* each fault class is classified as its real message means: a usage limit is a window with
  Codex's reset time (a local clock time, in the engine's ``TZ``), a retried-out 429 a window,
  an exhausted quota spent credits, a bad key an authentication failure; and a project
  directory named ``billing-api-401`` changes none of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from actors.agents.base import EngineTask, EngineVerdict
from actors.agents.codex import CodexAdapter
from actors.agents.lease import WorktreeLease
from actors.agents.roster import AgentSpec, parse_roster
from actors.worktrees import Workspace
from tests.acceptance.stack import Stack, declare_topology, stack
from tests.amqp_fixtures import Amqp
from tests.real_cli.conftest import ROOT, cli_version
from tests.real_cli.openai_responses_api import API_KEY, ResponsesApi, serve
from workflows.capacity import CapacityKind, decode_state
from workflows.strict_schema import strict_problem

VIBEY = str(Path(sys.executable).with_name("vibey"))
PINNED = json.loads((ROOT / "ops" / "real-cli" / "package.json").read_text())["dependencies"][
    "@openai/codex"
]
KEY_VARIABLE = "VIBEY_CODEX_KEY"
ZONE = "America/New_York"  # the engine's TZ: Codex prints its reset in it


@pytest.fixture
def api() -> Iterator[tuple[ResponsesApi, str]]:
    with serve() as running:
        yield running


def codex_home(folder: Path, base_url: str) -> Path:
    """A ``CODEX_HOME`` of the engine's own, as docs/engines.md shows it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(
        'model = "gpt-5.5"\n'
        'model_provider = "local"\n\n'
        "[model_providers.local]\n"
        'name = "local Responses API"\n'
        f'base_url = "{base_url}"\n'
        'wire_api = "responses"\n'
        f'env_key = "{KEY_VARIABLE}"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )
    return folder


def engine_toml(binary: Path, home: Path, key: str = API_KEY, timeout: int = 120) -> str:
    """The engine's table; its ``TMPDIR`` is beside ``CODEX_HOME`` (Codex will not set up its
    sandbox helper in a home under the temporary directory, and pytest's are under /tmp)."""
    scratch = home.parent / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    return (
        '[engines.codex]\nadapter = "codex"\n'
        f'binary = "{binary}"\ntimeout_seconds = {timeout}\n'
        f'env = {{ CODEX_HOME = "{home}", {KEY_VARIABLE} = "{key}", TZ = "{ZONE}", '
        f'TMPDIR = "{scratch}" }}\n'
    )


def spec_of(toml_text: str) -> AgentSpec:
    import tomllib

    return parse_roster(tomllib.loads(toml_text)["engines"], "test")[0]


def run_step(spec: AgentSpec, root: Path) -> EngineVerdict:
    """One build.implement through the adapter in a fresh repository under ``root``."""
    workdir = Workspace(root / "work").worktree("demo", 0, "a1")
    adapter = CodexAdapter(spec, worker_env=dict(os.environ), transcripts=root / "transcripts")
    step_input = {"item": {"id": "a1", "title": "one"}}
    with WorktreeLease().hold(workdir, "demo", 1, "a1") as held:
        task = EngineTask(
            "build.implement",
            "demo",
            0,
            "a1",
            1,
            step_input,
            workdir,
            effort="TRIVIAL",
            workdir=workdir,
            lease=held,
            job_id="a1-job",
        )
        return adapter.run(task)


def transcript(verdict: EngineVerdict) -> str:
    path = verdict.evidence.get("transcript")
    return Path(path).read_text() if path else ""


def capacity(verdict: EngineVerdict) -> Any:
    assert verdict.status == "capacity", (verdict.status, verdict.detail)
    return decode_state(verdict.result["capacity"])


def test_the_binary_is_the_pinned_version(real_cli_bin: Path) -> None:
    assert cli_version(real_cli_bin, "codex") == f"codex-cli {PINNED}"


def test_conformance_passes_and_is_recorded(
    real_cli_bin: Path, api: tuple[ResponsesApi, str], pg_url: str, tmp_path: Path
) -> None:
    server, url = api
    config = tmp_path / "vibey.toml"
    config.write_text(engine_toml(real_cli_bin / "codex", codex_home(tmp_path / "codex", url)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
    env |= {
        "VIBEY_CONFIG": str(config),
        "VIBEY_PG_URL": pg_url,
        "VIBEY_ENGINE_WORKSPACE": str(tmp_path / "workspace"),
    }
    done = subprocess.run(
        [VIBEY, "doctor", "--conformance", "--record", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    [engine] = json.loads(done.stdout)["engines"]
    assert engine["passed"], engine
    assert engine["checks"][-1]["detail"].startswith("ok, "), engine
    turns = server.turns()
    assert len(turns) == 3, [t.body.get("input", [])[-1:] for t in turns]  # patch, cat, answer
    for turn in turns:
        fmt = turn.body["text"]["format"]
        assert fmt["strict"] is True and strict_problem(fmt["schema"]) is None, fmt
        assert turn.headers["authorization"] == f"Bearer {API_KEY}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT last_doctor_at, authenticated_at FROM engine_health WHERE engine_id = 'codex'"
        ).fetchone()
    assert row is not None and row[0] is not None and row[1] is not None


def test_a_step_reports_its_work_and_evidence(
    real_cli_bin: Path, api: tuple[ResponsesApi, str], tmp_path: Path
) -> None:
    _server, url = api
    spec = spec_of(engine_toml(real_cli_bin / "codex", codex_home(tmp_path / "codex", url)))
    verdict = run_step(spec, tmp_path)
    assert verdict.status == "ok", (verdict.detail, transcript(verdict))
    assert verdict.result == {"status": "done"}
    kinds = [e["kind"] for e in verdict.evidence["ledger"]]
    assert kinds.count("TurnRequested") == kinds.count("TurnCompleted") == 1
    assert "ToolInvoked" in kinds and "BudgetSpent" in kinds and "TranscriptRecorded" in kinds
    edited = [e["payload"]["path"] for e in verdict.evidence["ledger"] if e["kind"] == "FileEdited"]
    assert edited == ["src/a1.txt"]  # once, as git names it (Codex reports it absolutely)
    spent = next(e for e in verdict.evidence["ledger"] if e["kind"] == "BudgetSpent")
    assert spent["payload"]["input_tokens"] > 0 and spent["payload"]["output_tokens"] > 0


@pytest.mark.parametrize("ahead", [timedelta(hours=3), timedelta(days=2, hours=1)])
def test_a_usage_limit_is_a_window_until_the_time_codex_prints(
    real_cli_bin: Path, api: tuple[ResponsesApi, str], tmp_path: Path, ahead: timedelta
) -> None:
    server, url = api
    reset = (datetime.now(UTC) + ahead).replace(second=0, microsecond=0)
    server.mode, server.resets_at = "usage_limit", int(reset.timestamp())
    spec = spec_of(engine_toml(real_cli_bin / "codex", codex_home(tmp_path / "codex", url)))
    state = capacity(run_step(spec, tmp_path))
    assert state.kind is CapacityKind.WINDOW_EXHAUSTED
    assert state.resets_at == reset, state  # the clock time Codex printed, read in its zone
    assert "usage limit" in state.detail


def test_a_rate_limit_in_the_stream_is_a_window_until_the_apis_reset(
    real_cli_bin: Path, api: tuple[ResponsesApi, str], tmp_path: Path
) -> None:
    server, url = api
    server.mode = "rate_limit_stream"
    spec = spec_of(engine_toml(real_cli_bin / "codex", codex_home(tmp_path / "codex", url)))
    before = datetime.now(UTC)
    state = capacity(run_step(spec, tmp_path / "billing-api"))
    after = datetime.now(UTC)
    assert state.kind is CapacityKind.WINDOW_EXHAUSTED
    assert before + timedelta(seconds=20) <= state.resets_at <= after + timedelta(seconds=20)
    assert state.detail.startswith("rate limit exceeded: Rate limit reached")


def test_a_429_retried_out_is_a_window_of_unknown_reset(
    real_cli_bin: Path, api: tuple[ResponsesApi, str], tmp_path: Path
) -> None:
    server, url = api
    server.mode = "rate_limit"
    spec = spec_of(engine_toml(real_cli_bin / "codex", codex_home(tmp_path / "codex", url)))
    before = datetime.now(UTC)
    state = capacity(run_step(spec, tmp_path / "billing-api-401"))  # item 7: names don't count
    assert state.kind is CapacityKind.WINDOW_EXHAUSTED
    assert before + timedelta(minutes=14) < state.resets_at < before + timedelta(minutes=16)
    assert "429" in state.detail and "url:" not in state.detail


def test_an_exhausted_quota_is_spent_credits(
    real_cli_bin: Path, api: tuple[ResponsesApi, str], tmp_path: Path
) -> None:
    server, url = api
    server.mode = "quota"
    spec = spec_of(engine_toml(real_cli_bin / "codex", codex_home(tmp_path / "codex", url)))
    state = capacity(run_step(spec, tmp_path))
    assert state.kind is CapacityKind.CREDITS_EXHAUSTED
    assert state.detail == "Quota exceeded. Check your plan and billing details."


def test_an_invalid_key_is_an_authentication_failure(
    real_cli_bin: Path, api: tuple[ResponsesApi, str], tmp_path: Path
) -> None:
    _server, url = api
    # Codex's message ends "…, url: <base_url>/responses": a base URL naming billing is no
    # credits message (item 7), nor is the project directory's name
    home = codex_home(tmp_path / "codex", url.replace("/v1", "/billing-api/v1"))
    spec = spec_of(engine_toml(real_cli_bin / "codex", home, key="sk-not-the-key-0000"))
    state = capacity(run_step(spec, tmp_path / "billing-api"))
    assert state.kind is CapacityKind.AUTHENTICATION_FAILED
    assert state.detail.startswith("unexpected status 401 Unauthorized: Incorrect API key")
    assert "billing" not in state.detail


def test_an_unreachable_server_is_an_engine_fault_at_the_timeout(
    real_cli_bin: Path, tmp_path: Path
) -> None:
    """Codex 0.171 reconnects for ever ("Reconnecting... waiting for network"), whatever its
    retry settings: the engine's timeout ends the run, an engine fault, not a capacity
    state (under a base URL and a directory naming billing and 401). Confined, its proxy
    refuses the closed port at once, and Codex reports the cut stream: an engine fault too."""
    with serve() as (_server, url):
        closed = url.replace("/v1", "/billing-401/v1")  # the port is closed on leaving
    home = codex_home(tmp_path / "codex", closed)
    spec = spec_of(engine_toml(real_cli_bin / "codex", home, timeout=10))
    verdict = run_step(spec, tmp_path / "billing-401")
    assert verdict.status == "failed" and verdict.engine_fault, verdict
    assert (
        "hung past its 10 s timeout" in verdict.detail
        or "stream disconnected before completion" in verdict.detail
    ), verdict.detail


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


def test_a_protocol_workflow_completes_on_the_real_codex(
    real_cli_bin: Path,
    api: tuple[ResponsesApi, str],
    e2e: Stack,
    pg_url: str,
    tmp_path: Path,
) -> None:
    server, url = api
    config = tmp_path / "vibey.toml"
    config.write_text(engine_toml(real_cli_bin / "codex", codex_home(tmp_path / "codex", url)))
    (tmp_path / "script.toml").write_text(SCRIPT)
    e2e.config = config
    done = e2e.vibey("doctor", "--conformance", "--record", "--json", check=False, timeout=180)
    assert done.returncode == 0, (done.stdout, done.stderr)
    e2e.start_worker()
    script = str(tmp_path / "script.toml")
    e2e.vibey("workflow", "start", "demo", "--engines", "codex", "--script", script)
    final = e2e.drive(["demo"], deadline_s=600)["demo"]["workflow"]
    assert final["status"] == "completed", final
    with psycopg.connect(pg_url, autocommit=True) as conn:
        jobs = conn.execute(
            "SELECT kind, subject, attempts FROM job WHERE engine_id = 'codex'"
        ).fetchall()
    assert jobs and all(attempts == 1 for _kind, _subject, attempts in jobs), jobs
    implemented = [subject for kind, subject, _ in jobs if kind == "build.implement"]
    assert len(implemented) == 2, jobs
    assert "digests match" in e2e.vibey("ledger", "verify", "demo").stdout
    events: list[dict[str, Any]] = e2e.every("ledger", "show", "demo")
    kinds = Counter(e["kind"] for e in events)
    for kind in ("TurnRequested", "TurnCompleted", "BudgetSpent", "TranscriptRecorded"):
        assert kinds[kind] >= len(jobs), kinds
    assert kinds["ToolInvoked"] >= len(implemented), kinds  # each implement's shell command
    edited = Counter(
        e["payload"]["path"] for e in events if e["kind"] == "FileEdited"
    )  # once per file: Codex's absolute path and git's relative one are one file
    assert edited == Counter({"src/a1.txt": 1, "src/a2.txt": 1}), edited
    assert len(server.turns()) >= 3 * len(implemented)
