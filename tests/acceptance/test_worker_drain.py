"""SIGTERM drains a real `vibey worker`: its running step settles within the grace.

The grace is the longest lease (``vibey.wiring.drain_grace``, the number the manifests'
``terminationGracePeriodSeconds`` is built on). Scaled down by settings: a 20 s step under a
30 s lease drains to its end, where the old fixed 600 s stop timeout, scaled the same way (a
5 s lease), cuts it; the cut step is a lease the reconciler reaps, and the workflow still
completes on the next worker. Nothing is leased afterwards in either case.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.stack import Stack, declare_topology, stack
from tests.amqp_fixtures import Amqp

STEP_S = 20.0


def sql(pg_url: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute(query.encode()).fetchall()


def settings_file(tmp: Path, lease_s: int) -> Path:
    """Every kind's lease at ``lease_s`` (the engine's timer too): the longest lease."""
    path = tmp / "vibey.toml"
    path.write_text(
        "[queue.lease_seconds]\n"
        f"default = {lease_s}\n"
        f'"workflow.timer" = {lease_s}\n'
        f'"drain.sleep" = {lease_s}\n',
        encoding="utf-8",
    )
    return path


@pytest.fixture
def drained(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    declare_topology(pg_url, amqp)
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        running.extra_env.update(
            VIBEY_WORKFLOW_DEFINITIONS="tests.acceptance.drain_definition:DEFINITIONS",
            VIBEY_WORKFLOW_DEFAULT_DEFINITION="drain",
            VIBEY_WORKER_HANDLERS="tests.acceptance.drain_definition:HANDLERS",
            VIBEY_TEST_STEP_SECONDS=str(STEP_S),
        )
        yield running


def start_step(e2e: Stack, lease_s: int) -> subprocess.Popen[bytes]:
    e2e.config = settings_file(e2e.workspace.parent, lease_s)
    e2e.extra_env["VIBEY_TEST_LEASE_SECONDS"] = str(lease_s)
    worker = e2e.start_worker(processes=1, threads=2)
    e2e.vibey("workflow", "start", "drained")
    started = e2e.workspace / "started"
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        assert worker.poll() is None, e2e.worker_log()
        time.sleep(0.2)
    assert started.exists(), e2e.worker_log()
    time.sleep(2.0)  # well inside the step
    return worker


def sigterm(worker: subprocess.Popen[bytes], timeout: float) -> tuple[int, float]:
    began = time.monotonic()
    worker.send_signal(signal.SIGTERM)  # the supervisor, as the kubelet sends it to PID 1
    code = worker.wait(timeout=timeout)
    return code, time.monotonic() - began


def test_a_sigtermed_worker_lets_a_step_longer_than_its_old_cap_settle(
    drained: Stack, pg_url: str
) -> None:
    worker = start_step(drained, lease_s=30)
    code, took = sigterm(worker, timeout=60)
    assert code == 0, drained.worker_log()
    assert (drained.workspace / "finished").exists(), drained.worker_log()
    assert took >= STEP_S - 4, took  # it waited for the step, not for a fixed cap
    assert sql(pg_url, "SELECT state FROM job WHERE kind = 'drain.sleep'") == [("succeeded",)]
    assert sql(pg_url, "SELECT count(*) FROM job WHERE state = 'leased'") == [(0,)]
    assert drained.status("drained")["workflow"]["status"] == "completed"  # settled with it
    assert (drained.workspace / "started").read_text().count("\n") == 1  # run once


def test_a_step_cut_at_the_grace_is_a_lease_the_reconciler_reaps(
    drained: Stack, pg_url: str
) -> None:
    worker = start_step(drained, lease_s=5)  # the old cap, scaled: shorter than the step
    code, took = sigterm(worker, timeout=60)
    assert code == 0, drained.worker_log()
    assert took < STEP_S - 5, took  # cut at the grace
    assert not (drained.workspace / "finished").exists()
    assert sql(pg_url, "SELECT state FROM job WHERE kind = 'drain.sleep'") == [("leased",)]
    drained.extra_env["VIBEY_TEST_STEP_SECONDS"] = "0.5"
    later = drained.start_worker(processes=1, threads=2)  # its reconciler reaps the lease
    deadline = time.monotonic() + 90
    while drained.status("drained")["workflow"]["status"] != "completed":
        assert time.monotonic() < deadline, drained.worker_log()
        time.sleep(0.5)
    drained.kill_worker(later, signal.SIGTERM)
    assert sql(pg_url, "SELECT count(*) FROM job WHERE state = 'leased'") == [(0,)]
    assert (drained.workspace / "started").read_text().count("\n") == 2  # cut, then rerun


def ready_in(amqp: Amqp, queue: str) -> int:
    connection = amqp.connect()
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def test_a_draining_worker_takes_no_new_pointer_while_its_last_step_runs(
    drained: Stack, pg_url: str, amqp: Amqp
) -> None:
    """Two steps run (28 s and 12 s) and a third waits in the queue. SIGTERM: when the short
    step ends its thread is free, but the draining worker takes nothing more, so the third
    pointer stays ready in the queue for another pod instead of waiting here behind the
    long step; the next worker runs it. The short step is long enough for the SIGTERM to
    land before it ends on a loaded box (the third start and its publication take seconds
    there); the long one ends inside the drain's grace (the longest lease, 30 s)."""
    drained.config = settings_file(drained.workspace.parent, 30)
    drained.extra_env.update(
        VIBEY_TEST_LEASE_SECONDS="30",
        VIBEY_TEST_STEP_SECONDS="28",
        VIBEY_TEST_SHORT_STEP_SECONDS="12",
    )
    worker = drained.start_worker(processes=1, threads=2)
    drained.vibey("workflow", "start", "long")
    drained.vibey("workflow", "start", "short")
    started = drained.workspace / "started"
    deadline = time.monotonic() + 60
    while (not started.exists() or started.read_text().count("\n") < 2) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert started.read_text().count("\n") == 2, drained.worker_log()
    drained.vibey("workflow", "start", "queued")
    queue = f"{amqp.prefix}.jobs.interactive"
    deadline = time.monotonic() + 30
    while ready_in(amqp, queue) < 1:
        assert time.monotonic() < deadline, drained.worker_log()
        time.sleep(0.2)
    worker.send_signal(signal.SIGTERM)
    began = [float(line.split()[2]) for line in started.read_text().splitlines()]
    time.sleep(max(0.0, min(began) + 12 + 4 - time.time()))  # the short step ended 4 s ago
    assert worker.poll() is None  # still draining
    assert ready_in(amqp, queue) == 1  # the third pointer was not taken
    assert started.read_text().count("\n") == 2
    assert worker.wait(timeout=60) == 0, drained.worker_log()
    later = drained.start_worker(processes=1, threads=2)
    deadline = time.monotonic() + 60
    while count_completed(pg_url) < 3:
        assert time.monotonic() < deadline, drained.worker_log()
        time.sleep(0.5)
    drained.kill_worker(later, signal.SIGTERM)
    assert started.read_text().count("\n") == 3  # each step ran once


def count_completed(pg_url: str) -> int:
    (row,) = sql(pg_url, "SELECT count(*) FROM workflow WHERE status = 'completed'")
    return int(str(row[0]))
