"""The demo on a roster of three fake coding-agent CLIs (tests/agents/fake_cli.py), end to end
on the real stack: `vibey doctor --conformance --record`, `vibey worker`, `vibey workflow start
--engines`, gates answered through the CLI.

* weights 3/2/1 (claude-code, codex, gemini): the demo reaches DONE, every step ran on a fake
  CLI in its workdir, the implement picks match the weights within ±1, and every turn's
  evidence (FileEdited, BudgetSpent, TranscriptRecorded) is in a ledger that verifies;
* claude-code out of credits for build.implement: its items hand off to another engine with a
  brief the no-loss gate passed, and the workflow completes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.worker import WorkerConfig
from tests.acceptance.stack import Stack, stack
from tests.agents.fake_cli import SOURCE, install
from tests.amqp_fixtures import Amqp

SCRIPT = """
[design]
questions = [{ id = "audience", question = "Who is it for?", answers = [] }]

[build]
work_items = [
    { id = "a1", title = "one" }, { id = "a2", title = "two" }, { id = "a3", title = "three" },
    { id = "a4", title = "four" }, { id = "a5", title = "five" }, { id = "a6", title = "six" },
]
"""


def roster_toml(
    fakes: dict[str, Path], state: Path, claude_scenario: str = "success", edit: str = ""
) -> str:
    engines = (("claude", "claude-code", 3), ("codex", "codex", 2), ("gemini", "gemini", 1))
    tables = []
    for cli, adapter, weight in engines:
        scenario = claude_scenario if cli == "claude" else "success"
        tables.append(
            f'[engines.{cli}]\nadapter = "{adapter}"\nbinary = "{fakes[cli]}"\n'
            f"weight = {weight}\ntimeout_seconds = 120\n"
            f'read_allow = ["{SOURCE}"]\nwrite_allow = ["{state}"]\n'
            f'env = {{ FAKE_SCENARIO = "{scenario}", FAKE_STATE = "{state}", FAKE_ID = "{cli}", '
            f'FAKE_EDIT = "{edit}" }}\n'
        )
    return "\n".join(tables)


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


def ledger(e2e: Stack, project: str) -> list[dict[str, Any]]:
    assert "digests match" in e2e.vibey("ledger", "verify", project).stdout
    events: list[dict[str, Any]] = e2e.every("ledger", "show", project)  # every page
    return events


def implement_picks(pg_url: str) -> Counter[str]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT engine_id FROM job WHERE kind = 'build.implement' AND engine_id IS NOT NULL"
        ).fetchall()
    return Counter(row[0] for row in rows)


def setup(e2e: Stack, tmp_path: Path, claude_scenario: str = "success", edit: str = "") -> Path:
    fakes = install(tmp_path / "bin")
    state = tmp_path / "fake-state"
    config = tmp_path / "vibey.toml"
    config.write_text(roster_toml(fakes, state, claude_scenario, edit))
    (tmp_path / "script.toml").write_text(SCRIPT)
    e2e.config = config
    done = e2e.vibey("doctor", "--conformance", "--record", "--json", check=False)
    assert done.returncode == (0 if claude_scenario == "success" else 1), done.stderr
    checked = json.loads(done.stdout)
    assert [(e["id"], e["passed"]) for e in checked["engines"]] == [
        ("claude", claude_scenario == "success"),
        ("codex", True),
        ("gemini", True),
    ]
    return state


def test_the_demo_on_three_fake_clis_rotates_by_weight(
    e2e: Stack, pg_url: str, tmp_path: Path
) -> None:
    state = setup(e2e, tmp_path)
    e2e.start_worker()
    e2e.vibey(
        "workflow",
        "start",
        "demo",
        "--engines",
        "claude,codex,gemini",
        "--script",
        str(tmp_path / "script.toml"),
    )
    final = e2e.drive(["demo"], deadline_s=300)["demo"]["workflow"]
    assert final["status"] == "completed", final
    picks = implement_picks(pg_url)
    for engine, weight in (("claude", 3), ("codex", 2), ("gemini", 1)):
        assert abs(picks[engine] - weight) <= 1, picks
    runs = (state / "runs.log").read_text().splitlines()
    assert {line.split()[0] for line in runs} == {"claude", "codex", "gemini"}
    listed = e2e.json("engine", "list")["engines"]
    assert {(e["id"], e["installed"], e["circuit"]) for e in listed} == {
        ("claude", True, "closed"),
        ("codex", True, "closed"),
        ("gemini", True, "closed"),
    }
    events = ledger(e2e, "demo")
    kinds = Counter(e["kind"] for e in events)
    assert kinds["FileEdited"] >= 6, kinds
    assert kinds["BudgetSpent"] >= 6, kinds
    assert kinds["TranscriptRecorded"] == kinds["TurnCompleted"]
    transcripts = [e["payload"] for e in events if e["kind"] == "TranscriptRecorded"]
    assert all(Path(t["path"]).is_file() for t in transcripts)


def test_an_engine_out_of_credits_mid_build_hands_off_with_a_verified_brief(
    e2e: Stack, pg_url: str, tmp_path: Path
) -> None:
    setup(e2e, tmp_path, "credits-on:build.implement")
    # claude's conformance task is build.implement, so it fails: record a pass by hand, as
    # an operator whose engine ran out of credits after its check would have
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE engine_health SET last_doctor_at = now(), authenticated_at = now() "
            "WHERE engine_id = 'claude'"
        )
    e2e.start_worker()
    e2e.vibey("workflow", "start", "relay", "--script", str(tmp_path / "script.toml"))
    final = e2e.drive(["relay"], deadline_s=300)["relay"]["workflow"]
    assert final["status"] == "completed", final
    events = ledger(e2e, "relay")
    rejected = [e["payload"] for e in events if e["kind"] == "CapacityRejected"]
    assert rejected and {r["engine"] for r in rejected} == {"claude"}
    assert all(r["state"] == "CreditsExhausted" and "resets_at" not in r for r in rejected)
    accepted = [e["payload"] for e in events if e["kind"] == "HandoffAccepted"]
    assert accepted and all(a["from"] == "claude" and a["to"] != "claude" for a in accepted)
    assert all(a["mode"] == "brief" for a in accepted)
    assert implement_picks(pg_url)["claude"] == 0  # no item settled on the engine out of credits


FIXTURE_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def fixture_repo(path: Path) -> Path:
    """A repository with a failing test: ``add`` subtracts."""
    path.mkdir()
    (path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text(FIXTURE_TEST)
    for args in (
        ["init", "-q", "-b", "trunk"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "add", "."],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a failing test"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    return path


def test_an_imported_repository_is_fixed_and_verify_runs_its_tests(
    e2e: Stack, pg_url: str, tmp_path: Path
) -> None:
    repo = fixture_repo(tmp_path / "calc")
    tests = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    before = subprocess.run(tests, cwd=repo, capture_output=True, text=True)
    assert before.returncode == 1, before.stdout  # the imported repository's test fails
    setup(e2e, tmp_path, edit="calc.py|a - b|a + b")
    (tmp_path / "script.toml").write_text(
        '[build]\nwork_items = [{ id = "fix", title = "make add add" }]\n'
    )
    e2e.start_worker()
    e2e.vibey(
        "workflow",
        "start",
        "calc",
        "--repo",
        str(repo),
        "--branch",
        "trunk",
        "--test-command",
        " ".join(tests),
        "--script",
        str(tmp_path / "script.toml"),
    )
    final = e2e.drive(["calc"], deadline_s=300)["calc"]["workflow"]
    assert final["status"] == "completed", final
    with psycopg.connect(pg_url, autocommit=True) as conn:
        [(result,)] = conn.execute(
            "SELECT result FROM job WHERE kind = 'build.verify' AND state = 'succeeded'"
        ).fetchall()
    run = result["evidence"]["tests"]
    assert run["passed"] and run["command"] == tests and "1 passed" in run["output_tail"]
    integrated = e2e.workspace / "calc" / "worktrees" / "integration"
    assert "a + b" in (integrated / "calc.py").read_text()
    ledger(e2e, "calc")
