"""The merge queue end to end on the real stack with fake coding-agent CLIs
(tests/agents/fake_cli.py): a cycle of three work items, two of which rewrite the same line of
one file (``FAKE_SHARED``).

* the queue merges the clean items, the conflicting one goes to a ``build.resolve`` step that
  the engine resolves, verify runs the project's tests on the merged tree, the workflow reaches
  DONE, and the ledger holds the conflict and its resolution by the engine;
* with the resolver made to fail (``FAKE_RESOLVE=fail``), the ``build.merge_conflict`` gate
  opens, and each of its answers does what it says: ``resolved`` (after a merge by hand in the
  item's worktree) merges the item, ``drop`` leaves it out, ``abandon`` fails the workflow.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest

from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.worker import WorkerConfig
from tests.acceptance.stack import Stack, cooperative, stack
from tests.agents.fake_cli import SOURCE, install
from tests.amqp_fixtures import Amqp

SCRIPT = """
[build]
work_items = [
    { id = "a1", title = "footer = one" },
    { id = "a2", title = "greeting = two" },
    { id = "a3", title = "greeting = three" },
]
"""
CHECK = """import pathlib, sys
text = pathlib.Path("app.txt").read_text()
sys.exit(1 if "<<<<<<<" in text or "name = shop" not in text else 0)
"""


def roster(fakes: dict[str, Path], state: Path, resolve: str) -> str:
    tables = []
    for cli, adapter in (("claude", "claude-code"), ("codex", "codex")):
        tables.append(
            f'[engines.{cli}]\nadapter = "{adapter}"\nbinary = "{fakes[cli]}"\n'
            f"weight = 1\ntimeout_seconds = 120\n"
            f'read_allow = ["{SOURCE}"]\nwrite_allow = ["{state}"]\n'
            f'env = {{ FAKE_SCENARIO = "success", FAKE_STATE = "{state}", FAKE_ID = "{cli}", '
            f'FAKE_SHARED = "app.txt|a2,a3", FAKE_RESOLVE = "{resolve}" }}\n'
        )
    return "\n".join(tables)


def fixture_repo(path: Path) -> Path:
    path.mkdir()
    (path / "app.txt").write_text("greeting = hello\nname = shop\n")
    (path / "check.py").write_text(CHECK)
    for args in (
        ["init", "-q", "-b", "trunk"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "add", "."],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the app"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    return path


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


def start(e2e: Stack, tmp_path: Path, project: str, resolve: str = "") -> None:
    fakes = install(tmp_path / "bin")
    config = tmp_path / "vibey.toml"
    config.write_text(roster(fakes, tmp_path / "fake-state", resolve))
    (tmp_path / "script.toml").write_text(SCRIPT)
    e2e.config = config
    done = e2e.vibey("doctor", "--conformance", "--record", "--json", check=False)
    assert done.returncode == 0, done.stderr
    repo = fixture_repo(tmp_path / "app")
    e2e.start_worker()
    e2e.vibey(
        "workflow",
        "start",
        project,
        "--repo",
        str(repo),
        "--branch",
        "trunk",
        "--test-command",
        f"{sys.executable} check.py",
        "--script",
        str(tmp_path / "script.toml"),
    )


def ledger(e2e: Stack, project: str) -> list[dict[str, Any]]:
    assert "digests match" in e2e.vibey("ledger", "verify", project).stdout
    events: list[dict[str, Any]] = e2e.every("ledger", "show", project)
    return events


def integrated(e2e: Stack, project: str) -> str:
    return (e2e.workspace / project / "worktrees" / "integration" / "app.txt").read_text()


def verify_results(pg_url: str) -> list[Mapping[str, Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT result FROM job WHERE kind = 'build.verify' AND state = 'succeeded' "
            "ORDER BY created_at"
        ).fetchall()
    return [row[0] for row in rows]


def test_a_conflict_is_resolved_by_the_engine_and_the_workflow_reaches_done(
    e2e: Stack, pg_url: str, tmp_path: Path
) -> None:
    start(e2e, tmp_path, "merge")
    final = e2e.drive(["merge"], deadline_s=400)["merge"]["workflow"]
    assert final["status"] == "completed", final
    verifies = verify_results(pg_url)
    first, last = verifies[0], verifies[-1]
    assert first["passed"] is False and first["merged"] == ["a1", "a2"]
    assert first["conflicts"] == [{"item": "a3", "files": ["app.txt"], "against": ["a2"]}]
    assert "tests" not in first["evidence"]  # no tests on a tree the queue is not through
    assert last["passed"] is True and last["evidence"]["tests"]["passed"] is True
    text = integrated(e2e, "merge")
    assert "greeting = two" in text and "greeting = three" in text and "<<<<<<<" not in text
    assert (e2e.workspace / "merge" / "worktrees" / "integration" / "src" / "a1.txt").is_file()
    events = ledger(e2e, "merge")
    raised = [e["payload"] for e in events if e["kind"] == "FindingRaised"]
    assert [(r["id"], r["item"], r["files"]) for r in raised] == [
        ("conflict:0.a3.1", "a3", ["app.txt"])
    ]
    resolved = [e["payload"] for e in events if e["kind"] == "FindingResolved"]
    [by_engine] = [r for r in resolved if r.get("closes") == "conflict:0.a3.1"]
    assert by_engine["resolution"] == "engine" and by_engine["attempt"] == 1
    assert by_engine["round"] == 1


def merge_by_hand(tree: Path) -> None:
    """What a person does at the gate: merge the integrated branch, keep both lines, commit."""
    ident = ["-c", "user.name=p", "-c", "user.email=p@p"]
    subprocess.run(["git", *ident, "merge", "-q", "vibey/integration"], cwd=tree, check=False)
    (tree / "app.txt").write_text("greeting = two\ngreeting = three\nname = shop\n")
    subprocess.run(["git", "add", "app.txt"], cwd=tree, check=True)
    subprocess.run(["git", *ident, "commit", "-qm", "merged by hand"], cwd=tree, check=True)


@pytest.mark.parametrize("answer", ["resolved", "drop", "abandon"])
def test_a_resolver_that_fails_parks_the_item_and_each_answer_does_what_it_says(
    e2e: Stack, pg_url: str, tmp_path: Path, answer: str
) -> None:
    start(e2e, tmp_path, "park", resolve="fail")
    seen: list[dict[str, Any]] = []

    def person(gate: Mapping[str, Any]) -> str:
        if gate.get("kind") != "merge_conflict":
            return cooperative(gate)
        seen.append(dict(gate))
        if answer == "resolved":
            merge_by_hand(e2e.workspace / "park" / "worktrees" / "c0-a3")
        return answer

    final = e2e.drive(["park"], person, deadline_s=400)["park"]["workflow"]
    [gate] = seen
    assert gate["name"] == "build.merge_conflict.0.a3.1"
    assert gate["answers"] == ["resolved", "drop", "abandon"]
    events = ledger(e2e, "park")
    [closed] = [
        e["payload"]
        for e in events
        if e["kind"] == "FindingResolved" and e["payload"].get("closes") == "conflict:0.a3.1"
    ]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        [(attempts, state)] = conn.execute(
            "SELECT attempts, state::text FROM job WHERE kind = 'build.resolve'"
        ).fetchall()
    assert (attempts, state) == (2, "failed")  # its attempts, then the gate
    if answer == "abandon":
        assert final["status"] == "failed", final
        assert "abandoned at build.merge_conflict.0.a3.1" in json.dumps(final)
        assert closed["resolution"] == "abandoned"
        return
    assert final["status"] == "completed", final
    text = integrated(e2e, "park")
    if answer == "resolved":
        assert closed["resolution"] == "hand"
        assert "greeting = two" in text and "greeting = three" in text
    else:
        assert closed["resolution"] == "dropped"
        assert "greeting = two" in text and "greeting = three" not in text
    assert verify_results(pg_url)[-1]["evidence"]["tests"]["passed"] is True
