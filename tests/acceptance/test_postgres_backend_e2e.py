"""`vibey worker` on the postgres backend runs the demo to DONE: no RabbitMQ at all.

The fleet's real code path (the supervisor, PostgresRuntime's drive threads, SKIP LOCKED
claims, LISTEN/NOTIFY wakeups, the same StepRunner settle as the Dramatiq actor), driven
through the `vibey` command as a person would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.stack import DEMO_SCRIPT, Stack, stack
from tests.acceptance.test_protocol_e2e import assert_each_step_committed_once, phases, sql

POSTGRES = {"VIBEY_QUEUE_BACKEND": "postgres", "VIBEY_QUEUE_POLL_INTERVAL": "2"}


@pytest.fixture
def pg_stack(pg_url: str, tmp_path: Path) -> Iterator[Stack]:
    with stack(pg_url, "", "unused", tmp_path) as running:
        running.extra_env.update(POSTGRES)
        yield running


def test_the_demo_runs_to_done_on_the_postgres_backend(pg_stack: Stack, pg_url: str) -> None:
    worker = pg_stack.start_worker(processes=2, threads=4)
    pg_stack.json("workflow", "start", "demo", "--script", str(DEMO_SCRIPT))
    final = pg_stack.drive(["demo"])["demo"]["workflow"]
    assert (final["status"], final["completion_mode"]) == ("completed", "local")
    seen = phases(pg_stack, "demo")
    assert seen[0] == "design" and seen[-1] == "done" and "build" in seen
    assert pg_stack.json("workflow", "verify", "demo")["ok"] is True
    assert_each_step_committed_once(pg_url, "demo")
    assert "digests match" in pg_stack.vibey("ledger", "verify", "demo").stdout
    assert sql(pg_url, "SELECT count(*) FROM job_outbox") == [(0,)]  # no dispatch pointers
    assert worker.poll() is None, pg_stack.worker_log()
    assert "postgres backend" in pg_stack.worker_log()
