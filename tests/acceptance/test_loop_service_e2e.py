"""The demo on two fake CLIs that run as loop services (invocation = "service"), end to end on
the real stack: `vibey loop-service` per engine, `vibey doctor --conformance --record` through
the services, `vibey worker`, `vibey workflow start --engines`, gates answered through the CLI.
The workflow completes, every run of a worktree ran alone (the fake CLIs' spans), and the
ledger verifies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.runs_topology import RunsTopology
from actors.worker import WorkerConfig
from tests.acceptance.stack import VIBEY, Stack, stack
from tests.agents.fake_cli import SOURCE, install, span_key
from tests.amqp_fixtures import Amqp

SCRIPT = """
[design]
questions = [{ id = "audience", question = "Who is it for?", answers = [] }]

[build]
work_items = [
    { id = "a1", title = "one" }, { id = "a2", title = "two" }, { id = "a3", title = "three" },
]
"""
ENGINES = (("claude", "claude-code", 2), ("codex", "codex", 1))


@pytest.fixture
def e2e(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # cleaned up
    runs = RunsTopology(amqp.prefix, tuple(e for e, _a, _w in ENGINES))
    amqp.queues.update(q.name for q in runs.queues(detect(connection)))
    amqp.exchanges.update(e.name for e in runs.exchanges())
    connection.close()
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


@contextlib.contextmanager
def loop_services(e2e: Stack) -> Iterator[list[subprocess.Popen[bytes]]]:
    started = []
    try:
        for engine, _adapter, _weight in ENGINES:
            with (e2e.logs / f"loop-{engine}.log").open("wb") as log:  # the child keeps a copy
                process = subprocess.Popen(
                    [VIBEY, "loop-service", "--engine", engine, "--drain-grace", "5"],
                    env=e2e.env,
                    cwd=e2e.workspace.parent,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append(process)
        yield started
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def overlapping_runs(spans: list[dict[str, Any]]) -> int:
    by_cwd: dict[str, list[tuple[float, float]]] = defaultdict(list)
    start = {span_key(s): s for s in spans if s["event"] == "start"}
    end = {span_key(s): s["at"] for s in spans if s["event"] == "end"}
    for pid, span in start.items():
        by_cwd[span["cwd"]].append((span["at"], end.get(pid, float("inf"))))
    count = 0
    for runs in by_cwd.values():
        latest = float("-inf")
        for begins, ends in sorted(runs):
            count += begins < latest
            latest = max(latest, ends)
    return count


def test_the_demo_on_two_loop_services(e2e: Stack, pg_url: str, tmp_path: Path) -> None:
    fakes = install(tmp_path / "bin")
    state = tmp_path / "fake-state"
    tables = [
        f'[engines.{engine}]\nadapter = "{adapter}"\nbinary = "{fakes[engine]}"\n'
        f'weight = {weight}\ntimeout_seconds = 120\ninvocation = "service"\n'
        f'env = {{ FAKE_STATE = "{state}", FAKE_ID = "{engine}" }}\n'
        f'read_allow = ["{SOURCE}"]\nwrite_allow = ["{state}"]\n'
        for engine, adapter, weight in ENGINES
    ]
    e2e.config = tmp_path / "vibey.toml"
    e2e.config.write_text("\n".join(tables))
    (tmp_path / "script.toml").write_text(SCRIPT)
    with loop_services(e2e):
        deadline = time.monotonic() + 30
        while True:  # both services consuming: the probe answers
            listed = e2e.json("engine", "list")["engines"]
            if all(row["service"]["consumers"] == 1 for row in listed):
                break
            assert time.monotonic() < deadline, listed
            time.sleep(0.5)
        done = e2e.vibey("doctor", "--conformance", "--record", "--json", check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert all(e["passed"] for e in json.loads(done.stdout)["engines"])
        e2e.start_worker()
        e2e.vibey(
            "workflow", "start", "demo", "--engines", "claude,codex",
            "--script", str(tmp_path / "script.toml"),
        )  # fmt: skip
        final = e2e.drive(["demo"], deadline_s=300)["demo"]["workflow"]
        assert final["status"] == "completed", final
    spans = [json.loads(x) for x in (state / "spans.jsonl").read_text().splitlines()]
    assert len([s for s in spans if s["event"] == "start"]) >= 3
    assert overlapping_runs(spans) == 0
    results = list(e2e.workspace.rglob(".vibey/diagnostics/*.result.json"))
    assert len(results) >= 3
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (implements,) = conn.execute(
            "SELECT count(*) FROM job WHERE kind = 'build.implement' AND state = 'succeeded'"
        ).fetchone() or (0,)
    assert implements == 3
    assert "digests match" in e2e.vibey("ledger", "verify", "demo").stdout
