"""aider as it ships (the pinned ``aider-chat``), pointed at the scripted OpenAI chat
completions server of :mod:`tests.real_cli.openai_chat_api` the way a user points it at any
OpenAI-compatible endpoint: ``OPENAI_API_BASE``, ``OPENAI_API_KEY`` and ``--model
openai/<name>`` (docs/engines.md, "aider").

* the version is the pinned one (``ops/real-cli/aider.txt``);
* ``vibey doctor --conformance --record`` passes against a real test database;
* a step through the adapter: aider applies its SEARCH/REPLACE edit, the result is read from
  its final message, the worktree holds the one file (no ``.gitignore`` change, no ``.aider*``
  file), and the run's evidence is all there;
* each fault, the provider's real 429/401 bodies: a rate limit with a reset is a window at
  that reset, one without a window at the unknown reset, spent quota is credits, a bad key is
  authentication; each run stopped at aider's first error record (its own retry loop would
  take about a minute), and a project named ``billing-api`` under a path holding ``401``
  changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from actors.agents.aider import AiderAdapter
from actors.agents.base import EngineTask, EngineVerdict
from actors.agents.limits import UNKNOWN_RESET
from actors.agents.roster import AgentSpec
from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.worker import WorkerConfig
from tests.acceptance.stack import Stack, stack
from tests.amqp_fixtures import Amqp
from tests.real_cli.conftest import ROOT, cli_version
from tests.real_cli.openai_chat_api import (
    BAD_KEY,
    MODEL,
    QUOTA,
    RATE_LIMIT,
    RATE_LIMIT_NO_RESET,
    STEP,
    ChatServer,
    Reply,
)

VIBEY = str(Path(sys.executable).with_name("vibey"))
KEY = "sk-vibey-test-key"
LOOP_REQUESTS = 9  # aider's retry loop for one rate limit: 9 requests over 63.75 s of sleeps
ITEM = {"id": "greeting", "title": "Write the greeting"}


@dataclass
class Aider:
    """The pinned binary, the model's metadata file, and a HOME of its own."""

    binary: Path
    metadata: Path
    home: Path

    def spec(self, server: ChatServer, *, extra: tuple[str, ...] = ()) -> AgentSpec:
        return AgentSpec(
            id="aider",
            adapter="aider",
            binary=str(self.binary),
            args=(
                "--model",
                f"openai/{MODEL}",
                "--model-metadata-file",
                str(self.metadata),
                *extra,
            ),
            env={"OPENAI_API_BASE": server.base_url, "OPENAI_API_KEY": KEY},
            timeout_seconds=120,
        )

    def toml(self, server: ChatServer) -> str:
        spec = self.spec(server)
        env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in spec.env.items())
        return (
            f'[engines.aider]\nadapter = "aider"\nbinary = {json.dumps(spec.binary)}\n'
            f"args = {json.dumps(list(spec.args))}\ntimeout_seconds = 120\nenv = {{ {env} }}\n"
        )


@pytest.fixture
def aider(real_cli_bin: Path, tmp_path: Path) -> Aider:
    metadata = tmp_path / "model-metadata.json"
    info = {"max_input_tokens": 128000, "max_output_tokens": 8192, "mode": "chat"}
    info |= {"input_cost_per_token": 2e-6, "output_cost_per_token": 8e-6}
    metadata.write_text(json.dumps({f"openai/{MODEL}": {**info, "litellm_provider": "openai"}}))
    home = tmp_path / "home"
    home.mkdir()
    return Aider(real_cli_bin / "aider", metadata, home)


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer([STEP]) as running:
        yield running


def worker_env(aider: Aider) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(aider.home), "LANG": "C.UTF-8"}


def repository(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True)
    (path / "README.md").write_text("# a project\n")
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"],
        cwd=path,
        check=True,
    )
    return path


def run_step(aider: Aider, spec: AgentSpec, workdir: Path, kind: str = "build.implement") -> Any:
    adapter = AiderAdapter(spec, worker_env=worker_env(aider), transcripts=workdir.parent / "t")
    task = EngineTask(
        kind,
        "demo",
        0,
        ITEM["id"],
        1,
        {"item": ITEM},
        workdir if kind == "build.implement" else None,
        effort="STANDARD",
        workdir=workdir,
        job_id=f"{kind}-1",
    )
    started = time.monotonic()
    verdict: EngineVerdict = adapter.run(task)
    return verdict, time.monotonic() - started


def entries(verdict: EngineVerdict, kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in verdict.evidence["ledger"] if e["kind"] == kind]


def git_status(workdir: Path) -> list[str]:
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(line[3:] for line in done.stdout.splitlines())


# -- the version and conformance ------------------------------------------------------------


def test_the_binary_is_the_pinned_version(real_cli_bin: Path) -> None:
    pin = (ROOT / "ops" / "real-cli" / "aider.txt").read_text()
    pinned = re.search(r"^aider-chat==(\S+)$", pin, re.M)
    assert pinned is not None, pin
    assert cli_version(real_cli_bin, "aider") == f"aider {pinned.group(1)}"


def test_doctor_conformance_passes_and_is_recorded(
    aider: Aider, server: ChatServer, pg_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "vibey.toml"
    config.write_text(aider.toml(server))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
    env |= {"VIBEY_PG_URL": pg_url, "VIBEY_CONFIG": str(config), "HOME": str(aider.home)}
    done = subprocess.run(
        [VIBEY, "doctor", "--conformance", "--record", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    checked = json.loads(done.stdout)
    assert [(e["id"], e["passed"]) for e in checked["engines"]] == [("aider", True)], checked
    assert server.chats(), "aider never called the model server"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT authenticated_at FROM engine_health WHERE engine_id = 'aider'"
        ).fetchone()
    assert row is not None and row[0] is not None


# -- a step ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["as-vibey-runs-it", "streamed"])
def test_a_step_is_applied_and_its_result_read_from_the_final_message(
    aider: Aider, server: ChatServer, tmp_path: Path, stream: bool
) -> None:
    """As vibey runs it (``--no-stream``), and with ``--stream`` in the engine's ``args`` (the
    server's SSE): the same edit, the same result."""
    workdir = repository(tmp_path / "project")
    verdict, _ = run_step(aider, aider.spec(server, extra=("--stream",) * stream), workdir)
    assert verdict.status == "ok", verdict.detail
    assert verdict.result == {"status": "done", "item": ITEM["id"]}
    assert (workdir / "src" / "greeting.txt").read_text() == "Write the greeting\ncycle 0\n"
    # the one file aider wrote, nothing of aider's own, and .gitignore untouched
    assert git_status(workdir) == ["src/greeting.txt"]
    assert not (workdir / ".gitignore").exists()
    assert [e["path"] for e in entries(verdict, "FileEdited")] == ["src/greeting.txt"]
    spent = entries(verdict, "BudgetSpent")
    if stream:  # no usage in the stream unless asked for: aider counts the tokens itself
        assert spent[0]["input_tokens"] > 0 and spent[0]["output_tokens"] > 0, spent
    else:  # the server's usage, as aider rounds it ("1.2k sent, 56 received")
        assert spent[0]["input_tokens"] == 1200 and spent[0]["output_tokens"] == 56, spent
    assert len(entries(verdict, "TranscriptRecorded")) == 1
    request = server.chats()[0]
    assert request["model"] == MODEL and bool(request.get("stream")) is stream
    said = json.dumps(request["messages"])
    assert "/.vibey/plans/build.implement-1.json" in said
    assert "# build.implement: greeting" in said  # the plan itself, read with --read


# -- faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "state", "reset"),
    [
        (RATE_LIMIT, "WindowExhausted", timedelta(seconds=20)),
        (RATE_LIMIT_NO_RESET, "WindowExhausted", UNKNOWN_RESET),
        (QUOTA, "CreditsExhausted", None),
        (BAD_KEY, "AuthenticationFailed", None),
    ],
    ids=["rate-limit-with-reset", "rate-limit-without-reset", "quota", "bad-key"],
)
def test_each_fault_is_classified_as_its_real_message_means(
    aider: Aider, tmp_path: Path, reply: Reply, state: str, reset: timedelta | None
) -> None:
    # a project named billing-api, under a path holding 401: neither may change the class
    workdir = repository(tmp_path / "401" / "billing-api")
    with ChatServer([reply]) as server:
        before = datetime.now(UTC)
        verdict, took = run_step(aider, aider.spec(server), workdir)
        requests = len(server.chats())
    capacity = verdict.result.get("capacity", {})
    assert verdict.status == "capacity", verdict.detail
    assert capacity["state"] == state, capacity
    if reset is not None:
        resets_at = datetime.fromisoformat(capacity["resets_at"])
        assert before + reset <= resets_at <= datetime.now(UTC) + reset, capacity
    assert "litellm." in capacity["detail"], capacity
    # stopped at the first record: not aider's whole loop (nor the SDK's retries beneath it)
    assert requests < LOOP_REQUESTS - 3, f"{requests} requests in {took:.1f} s: not stopped"
    rejected = entries(verdict, "CapacityRejected")
    assert [r["state"] for r in rejected] == [state]


def test_a_rate_limit_then_success_is_not_a_fault(aider: Aider, tmp_path: Path) -> None:
    """aider retries a transient error itself; a run whose later request succeeds is judged
    by what it did, not by the error it recovered from."""
    workdir = repository(tmp_path / "project")
    transient = Reply(status=500, body={"error": {"message": "The server had an error"}})
    with ChatServer([transient, STEP]) as server:
        verdict, _ = run_step(aider, aider.spec(server), workdir)
        assert len(server.chats()) == 2
    assert verdict.status == "ok", verdict.detail
    assert git_status(workdir) == ["src/greeting.txt"]


# -- a whole protocol workflow --------------------------------------------------------------

SCRIPT = """
[design]
questions = [{ id = "audience", question = "Who is it for?", answers = [] }]

[build]
work_items = [{ id = "a1", title = "one" }, { id = "a2", title = "two" }]
"""


@pytest.fixture
def e2e(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # cleaned up
    connection.close()
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


def test_a_protocol_workflow_completes_on_aider_with_its_evidence_in_the_ledger(
    e2e: Stack, aider: Aider, server: ChatServer, pg_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "vibey.toml"
    config.write_text(aider.toml(server))
    (tmp_path / "script.toml").write_text(SCRIPT)
    e2e.config = config
    e2e.extra_env = {"HOME": str(aider.home)}
    done = e2e.vibey("doctor", "--conformance", "--record", "--json", check=False, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    e2e.start_worker()
    script = str(tmp_path / "script.toml")
    e2e.vibey("workflow", "start", "demo", "--engines", "aider", "--script", script)
    final = e2e.drive(["demo"], deadline_s=600)["demo"]["workflow"]
    assert final["status"] == "completed", final
    with psycopg.connect(pg_url, autocommit=True) as conn:
        jobs = conn.execute(
            "SELECT kind, attempts, engine_id FROM job WHERE project_id = 'demo'"
        ).fetchall()
    engine_steps = [(kind, attempts) for kind, attempts, engine in jobs if engine == "aider"]
    assert {kind for kind, _ in engine_steps} >= {"build.implement"}, jobs
    assert all(attempts == 1 for _, attempts in engine_steps), engine_steps
    assert "digests match" in e2e.vibey("ledger", "verify", "demo").stdout
    events = e2e.every("ledger", "show", "demo")
    kinds = Counter(e["kind"] for e in events)
    for kind in ("TurnRequested", "TurnCompleted", "BudgetSpent", "TranscriptRecorded"):
        assert kinds[kind] >= len(engine_steps), kinds
    edited = [e["payload"]["path"] for e in events if e["kind"] == "FileEdited"]
    assert sorted(edited) == ["src/a1.txt", "src/a2.txt"], edited  # once per file
    assert all(
        p["engine"] == "aider" for p in (e["payload"] for e in events if e["kind"] == "BudgetSpent")
    )
    assert len(server.chats()) >= len(engine_steps)
