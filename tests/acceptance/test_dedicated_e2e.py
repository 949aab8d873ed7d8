"""Dedicated queues end to end: `vibey worker --project P` alone runs P's workflow, and beside
a shared worker only it runs P's steps. Real workers, RabbitMQ and PostgreSQL, driven through
the `vibey` command in subprocesses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.stack import DEMO_SCRIPT, Stack, declare_topology, stack
from tests.acceptance.tally_handlers import read_tally
from tests.amqp_fixtures import Amqp
from workflows.dispatch import Lane

TALLY = "tests.acceptance.tally_handlers"


@pytest.fixture
def e2e(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    declare_topology(pg_url, amqp)  # the shared lanes; cleaned up by the amqp fixture
    for project in ("acme", "beta"):  # what a dedicated worker declares, for the cleanup
        amqp.queues.update(amqp.names.work_queue(lane, project) for lane in Lane)
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


def first_gate(e2e: Stack, project: str, deadline_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        gates = e2e.open_gates(project)
        if gates:
            gate: dict[str, Any] = gates[0]
            return gate
        time.sleep(0.3)
    raise AssertionError(f"{project} reached no gate in {deadline_s}s:\n{e2e.worker_log()}")


def test_only_a_dedicated_worker_runs_and_the_workflow_reaches_its_first_gate(
    e2e: Stack, amqp: Amqp, pg_url: str
) -> None:
    # No worker yet: the pointer goes to the shared lane, and the status says nobody serves it.
    started = e2e.json("workflow", "start", "acme", "--script", str(DEMO_SCRIPT))
    assert started["created"] is True
    shared_queue = amqp.names.work_queue("interactive")
    waiting = e2e.status("acme")["waiting_for_worker"]
    assert [w["queue"] for w in waiting] == [shared_queue]
    text = e2e.vibey("workflow", "status", "acme").stdout
    assert f"waiting for a worker on {shared_queue}: none is consuming" in text
    stats = e2e.vibey("queue", "stats").stdout
    assert f"waiting for a worker on {shared_queue}: none is consuming" in stats

    # Only `vibey worker --project acme`: it routes acme to itself, says so, and the
    # pointer already on the shared lane is sent again on the dedicated one.
    e2e.start_worker("--project", "acme", processes=1, threads=4)
    gate = first_gate(e2e, "acme")
    assert gate["project"] == "acme"
    log = e2e.worker_log()
    assert "project acme was not routed to its dedicated queues; routed now" in log
    assert [r["project_id"] for r in e2e.json("project", "list")["routes"]] == ["acme"]
    assert e2e.status("acme")["waiting_for_worker"] == []
    # Every pointer of a workflow's step names its workflow (the correlation_id's source).
    rows = sql(
        pg_url,
        "SELECT count(*) FROM job_outbox o JOIN job j ON j.id = o.job_id "
        "WHERE j.project_id = 'acme' AND o.workflow_id IS DISTINCT FROM j.workflow_id",
    )
    assert rows == [(0,)]


def test_beside_a_shared_worker_a_dedicated_projects_steps_run_only_on_its_worker(
    e2e: Stack, tmp_path: Path
) -> None:
    dedicated = e2e.start_worker(
        "--project", "acme", "--handlers", f"{TALLY}:dedicated", processes=1, threads=4
    )
    deadline = time.monotonic() + 60
    while "acme" not in e2e.vibey("project", "list").stdout:  # routed at its start
        assert dedicated.poll() is None and time.monotonic() < deadline, e2e.worker_log()
        time.sleep(0.2)
    e2e.start_worker("--handlers", f"{TALLY}:shared", processes=1, threads=4)
    for project in ("acme", "beta"):
        e2e.vibey("workflow", "start", project, "--script", str(DEMO_SCRIPT))
    for project in ("acme", "beta"):
        first_gate(e2e, project)
    e2e.drive(["acme", "beta"], until=lambda status: status["workflow"]["phase"] == "review")
    ran = read_tally(tmp_path)
    by_project = {p: {label for label, project, _ in ran if project == p} for p in ("acme", "beta")}
    assert by_project == {"acme": {"dedicated"}, "beta": {"shared"}}, ran
    assert sum(1 for _, project, _ in ran if project == "acme") >= 3


def sql(pg_url: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute(query.encode()).fetchall()


def test_dedicate_and_undedicate_move_a_waiting_projects_pointers(
    e2e: Stack, amqp: Amqp, pg_url: str
) -> None:
    done = e2e.json("project", "dedicate", "beta")
    mine = amqp.names.work_queue("interactive", "beta")
    assert done["changed"] is True and mine in done["queues"]
    assert e2e.json("project", "dedicate", "beta")["changed"] is False
    e2e.vibey("workflow", "start", "beta", "--script", str(DEMO_SCRIPT))
    assert [w["queue"] for w in e2e.status("beta")["waiting_for_worker"]] == [mine]
    assert e2e.json("workflow", "status", "beta")["waiting_for_worker"][0]["command"] == (
        "vibey worker --lanes interactive --project beta"
    )
    assert e2e.json("project", "undedicate", "beta")["changed"] is True
    shared = amqp.names.work_queue("interactive")
    assert [w["queue"] for w in e2e.status("beta")["waiting_for_worker"]] == [shared]
    e2e.start_worker(processes=1, threads=2)  # a shared worker now runs beta's steps
    assert first_gate(e2e, "beta")["project"] == "beta"
