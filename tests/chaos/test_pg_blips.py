"""Chaos: PostgreSQL drops every connection of a running fleet, or stops for 20 s.

A `vibey worker` fleet (2 processes x 4 threads, the queue settings at their defaults: the
lost-dispatch sweep at 120 s, the reconciler every 30 s) runs under three faults:

* 300 three-step workflows while rounds of ``pg_terminate_backend`` cut every connection to the
  test's database (what a failover, a pooler restart or an idle timeout does); the rounds go on
  while workflows are started, and more are started (``BATCH`` at a time) until the killer's
  minimums are reached, so they all land before the last completion whatever the box's
  speed. Every workflow completes, no step's result is recorded twice, and the last completes
  within 10 s of the last kill: a blip costs seconds, not the two minutes of a lost pointer
  (before the store's retries, 139 s).
* The same kills during ten whole protocol workflows (the demo script, gates answered here):
  all complete, every history replays and every ledger verifies.
* A private PostgreSQL server (its own port and data folder) stopped for 20 s mid-run and
  started again: every workflow completes within 10 s of its answering again, nothing lost,
  nothing twice.

The curves printed are completed workflows against seconds since the first fault.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.config import BusSettings
from actors.relay import Relay, Router
from actors.worker import WorkerConfig
from store.dispatch import DispatchRecords
from store.errors import CommitUnknown, DatabaseUnavailable
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.migrate import migrate
from store.pool import open_pool
from store.workflows import WorkflowStore
from tests.acceptance.stack import DEMO_SCRIPT, cooperative
from tests.amqp_fixtures import Amqp
from tests.chaos.figures import figure
from tests.chaos.pg_blips import (
    Killer,
    curve,
    database_of,
    held,
    sample,
    scalar,
    vibey_worker,
    worker_env,
)
from tests.chaos.private_postgres import private_postgres
from tests.tiny_definition import THREE_STEPS
from vibey.cli_workflow import read_script
from workflows.dispatch import DEFAULT_WAIT_TIERS
from workflows.engine import Registry, Status
from workflows.protocol import DEFINITIONS
from workflows.queue import Gate

pytestmark = pytest.mark.chaos

WORKFLOWS = 300
BATCH = 30  # more workflows, while the kills fall short of the killer's minimums
MAX_WORKFLOWS = 900
DEADLINE_S = 300.0
RECOVERY_S = 10.0
COMPLETED = "SELECT count(*) FROM workflow WHERE status = 'completed'"
THREE_STEP_ENV = {
    "VIBEY_WORKFLOW_DEFINITIONS": "tests.tiny_definition:THREE_STEPS",
    "VIBEY_WORKER_HANDLERS": "tests.tiny_definition:THREE_STEP_HANDLERS",
}


def declare_topology(amqp: Amqp) -> None:
    """The fleet's queues, declared through the fixture so its teardown deletes them."""
    config = WorkerConfig(bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix))
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    connection.close()


def start_workflows(pool: ConnectionPool, amqp: Amqp, count: int, first: int = 0) -> int:
    """Start workflows ``blip<first>`` to ``blip<first + count - 1>``; returns ``count``."""
    records = DispatchRecords(pool=pool, relay_id="blip-test")
    relay = Relay(
        url=amqp.url, records=records, router=Router(names=amqp.names, tiers=DEFAULT_WAIT_TIERS)
    )
    relay.start()
    try:
        jobs = PostgresJobRepository(
            pool=pool, dispatch=True, relay_id="blip-test", after_commit=relay.submit
        )
        store = WorkflowStore(
            pool=pool, jobs=jobs, registry=Registry(THREE_STEPS), ledger=Ledger(pool)
        )
        for n in range(first, first + count):
            project = f"blip{n:03d}"
            for _ in range(5):  # under the kills: a start cut off at its commit is looked at again
                try:
                    store.start(project, definition="three-steps")  # once per project
                    break
                except CommitUnknown:  # it may have landed, and completed since: look first
                    if started(pool, project):
                        break
                except DatabaseUnavailable:
                    continue
        assert relay.flush(timeout=60), "the starts' pointers were not all published"
    finally:
        relay.stop()
    return count


def started(pool: ConnectionPool, project: str) -> bool:
    """Whether the project has a workflow (live or ended), read once PostgreSQL answers."""
    for _ in range(50):
        try:
            with pool.connection() as conn:
                row = conn.execute("SELECT 1 FROM workflow WHERE project_id = %s", (project,))
                return row.fetchone() is not None
        except psycopg.OperationalError:
            time.sleep(0.1)
    raise AssertionError(f"PostgreSQL did not answer whether {project} started")


def recorded_twice(url: str) -> int:
    found = sample(
        url,
        "SELECT count(*) FROM (SELECT workflow_id, event->>'step' FROM workflow_history "
        "WHERE event->>'type' = 'step_succeeded' GROUP BY 1, 2 HAVING count(*) > 1) d",
    )
    assert found is not None
    return found[1]


def test_backend_kills_cost_seconds_not_minutes(
    pg_url: str, pg_admin_url: str, amqp: Amqp, tmp_path: Path
) -> None:
    declare_topology(amqp)
    env = worker_env(pg_url, amqp.url, amqp.prefix, THREE_STEP_ENV)
    killer = Killer(admin_url=pg_url, database=database_of(pg_url), max_rounds=400)
    points: list[tuple[datetime, int]] = []
    watching = threading.Event()

    def watch() -> None:  # the curve, from the first kill on
        while not watching.is_set():
            point = sample(pg_url, COMPLETED)
            if point is not None:
                points.append(point)
            time.sleep(0.2)

    with vibey_worker(env, tmp_path / "worker.log"):
        fleet = f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{database_of(pg_url)}'"
        while (now := sample(pg_url, fleet)) is not None and now[1] < 3:
            time.sleep(0.1)  # both worker processes hold their connections
        started = time.monotonic()
        killer.keep_going.set()  # the kills go on while the workflows start, and after
        killer.start()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        pool = open_pool(pg_url, min_size=1, max_size=2, name="blip-test")
        try:
            workflows = start_workflows(pool, amqp, WORKFLOWS)
            while not killer.enough and workflows < MAX_WORKFLOWS:
                workflows += start_workflows(pool, amqp, BATCH, first=workflows)
        finally:
            pool.close()
            killer.keep_going.clear()
        done = 0
        while done < workflows and time.monotonic() - started < DEADLINE_S:
            done = points[-1][1] if points else 0
            time.sleep(0.2)
        watching.set()
        watcher.join()
        killer.join()
    final = sample(pg_url, "SELECT count(*) FROM workflow WHERE status <> 'completed'")
    twice = recorded_twice(pg_url)
    steps = sample(pg_url, "SELECT count(*) FROM job WHERE state = 'succeeded'")
    last = scalar(pg_url, "SELECT max(finished_at) FROM workflow")
    assert final is not None and steps is not None and last is not None
    first_kill = killer.rounds[0][0]
    stall = (last - killer.last_kill).total_seconds()
    figure(
        f"\npg blips: workflows={workflows} completed={done} steps={steps[1]} "
        f"recorded_twice={twice} rounds={len(killer.rounds)} kills={killer.kills} "
        f"kills_over={(killer.last_kill - first_kill).total_seconds():.1f}s "
        f"last_completion_after_last_kill={stall:.1f}s\n"
        f"curve (completed workflows, seconds since the first kill; last kill at "
        f"+{(killer.last_kill - first_kill).total_seconds():.0f}s): {curve(points, first_kill)}"
    )
    assert final[1] == 0, f"{final[1]} workflows did not complete"
    assert twice == 0, "a step's result was recorded twice"
    assert steps[1] == 3 * workflows
    during = [n for at, n in killer.rounds if at <= last]
    assert len(during) >= 10 and sum(during) >= 100, "the chaos did not happen during the run"
    assert stall <= RECOVERY_S, f"the last workflow completed {stall:.1f}s after the last kill"


PROTOCOL_WORKFLOWS = 10
PROTOCOL_DEADLINE_S = 300.0


def test_backend_kills_during_protocol_workflows_lose_nothing(
    pg_url: str, amqp: Amqp, tmp_path: Path
) -> None:
    declare_topology(amqp)
    extra = {"VIBEY_ENGINE_WORKSPACE": str(tmp_path / "work")}
    env = worker_env(pg_url, amqp.url, amqp.prefix, extra)
    killer = Killer(admin_url=pg_url, database=database_of(pg_url), pause_s=2.0, max_rounds=80)
    script = read_script(DEMO_SCRIPT)
    answered = 0
    with (
        vibey_worker(env, tmp_path / "worker.log"),
        ConnectionPool(pg_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool,
    ):
        records = DispatchRecords(pool=pool, relay_id="blip-test")
        relay = Relay(
            url=amqp.url, records=records, router=Router(names=amqp.names, tiers=DEFAULT_WAIT_TIERS)
        )
        relay.start()
        jobs = PostgresJobRepository(
            pool=pool, dispatch=True, relay_id="blip-test", after_commit=relay.submit
        )
        ledger = Ledger(pool)
        store = WorkflowStore(pool=pool, jobs=jobs, registry=Registry(DEFINITIONS), ledger=ledger)
        ids = [
            store.start(
                f"demo{n:02d}",
                definition="vibey-protocol",
                input={"project": f"demo{n:02d}", "engine": {"name": "scripted", "script": script}},
            ).workflow.id
            for n in range(PROTOCOL_WORKFLOWS)
        ]
        killer.start()
        started = time.monotonic()
        try:
            while time.monotonic() - started < PROTOCOL_DEADLINE_S:
                try:
                    for gate, _waited in store.inbox():
                        store.answer(gate.id, answer_for(gate), by="blip-test")
                        answered += 1
                    if all(store.get(i).status.finished for i in ids):
                        break
                except DatabaseUnavailable:  # a kill cut this loop's own call: look again
                    pass
                time.sleep(0.2)
            killer.join(timeout=PROTOCOL_DEADLINE_S)
            workflows = [store.get(i) for i in ids]
            verified = [store.verify(i) for i in ids]
            ledgers = [ledger.verify(wf.project_id) for wf in workflows]
        finally:
            relay.stop()
    twice = recorded_twice(pg_url)
    figure(
        f"\npg blips, protocol: workflows={PROTOCOL_WORKFLOWS} "
        f"statuses={sorted({w.status.value for w in workflows})} gates_answered={answered} "
        f"rounds={len(killer.rounds)} kills={killer.kills} recorded_twice={twice} "
        f"ledger_events={sum(v.count for v in ledgers)} wall={time.monotonic() - started:.1f}s"
    )
    assert all(w.status is Status.COMPLETED for w in workflows), [
        (w.project_id, w.status.value, w.phase, w.reason) for w in workflows
    ]
    assert twice == 0, "a step's result was recorded twice"
    assert all(v.ok for v in verified), [v.divergence for v in verified if not v.ok]
    assert all(v.ok for v in ledgers), [v.problem for v in ledgers if not v.ok]
    assert len(killer.rounds) >= 10 and killer.kills >= 100, "the chaos did not happen"


def answer_for(gate: Gate) -> str:
    return cooperative({"name": gate.name, "kind": gate.kind, "answers": list(gate.answers)})


OUTAGE_S = 20.0
OUTAGE_WORKFLOWS = 150
OUTAGE_ROUNDS = 3  # a batch that finished before the stop took hold is followed by another


def test_a_stopped_database_costs_its_outage_and_a_tier(amqp: Amqp, tmp_path: Path) -> None:
    """The database stops while workflows are under way, by construction: the fleet holds
    still (SIGSTOP) while a batch starts, so the whole batch is under way when it goes on, and
    again from the sample that triggers the stop until the stop took hold, so what it had not
    finished then is cut, whatever the box's speed. Had it finished the batch before it was
    held (never seen), another batch is started (``OUTAGE_ROUNDS`` at most)."""
    declare_topology(amqp)
    with private_postgres() as server:
        migrate(server.url)
        url = server.url
        env = worker_env(url, amqp.url, amqp.prefix, THREE_STEP_ENV)
        points: list[tuple[datetime, int]] = []
        total = rounds = 0
        stopped_at: datetime | None = None
        with vibey_worker(env, tmp_path / "worker.log") as worker:
            while rounds < OUTAGE_ROUNDS:
                before = total
                with (
                    held(worker),  # the batch is all under way when the fleet goes on
                    ConnectionPool(
                        url, min_size=1, max_size=2, kwargs={"autocommit": True}
                    ) as pool,
                ):
                    batch = OUTAGE_WORKFLOWS * (1 if rounds == 0 else 3)
                    total += start_workflows(pool, amqp, batch, first=total)
                rounds += 1
                trigger = before + (OUTAGE_WORKFLOWS // 5 if rounds == 1 else 1)
                while (now := sample(url, COMPLETED)) is not None and now[1] < trigger:
                    time.sleep(0.05)
                with held(worker):  # what is unfinished now stays so until the stop took hold
                    while (now := sample(url, COMPLETED)) is None:
                        time.sleep(0.05)
                    if now[1] >= total:
                        continue  # the batch finished before it was held: another one
                    stopped_at = datetime.now(UTC)
                    server.stop("fast")  # every session is ended; nothing answers for OUTAGE_S
                time.sleep(OUTAGE_S)
                server.start()
                answered_at = datetime.now(UTC)
                started = time.monotonic()
                points, done = [], 0
                while done < total and time.monotonic() - started < DEADLINE_S:
                    point = sample(url, COMPLETED)
                    if point is not None:
                        points.append(point)
                        done = point[1]
                    time.sleep(0.2)
                last = scalar(url, "SELECT max(finished_at) FROM workflow")
                if last is not None and last > answered_at:
                    break  # the outage cut work under way
        left = sample(url, "SELECT count(*) FROM workflow WHERE status <> 'completed'")
        steps = sample(url, "SELECT count(*) FROM job WHERE state = 'succeeded'")
        twice = recorded_twice(url)
        last = scalar(url, "SELECT max(finished_at) FROM workflow")
        pid = server.pid()
    assert stopped_at is not None, "the chaos did not happen: no batch was under way at a stop"
    assert left is not None and steps is not None and last is not None
    stall = (last - answered_at).total_seconds()
    figure(
        f"\npg outage: rounds={rounds} workflows={total} completed={done} steps={steps[1]} "
        f"recorded_twice={twice} stopped_for={(answered_at - stopped_at).total_seconds():.1f}s "
        f"last_completion_after_it_answered={stall:.1f}s\n"
        f"curve (completed workflows, seconds since it answered again): "
        f"{curve(points, answered_at)}"
    )
    assert stall > 0, "the chaos did not happen: every workflow finished before the stop"
    assert left[1] == 0, f"{left[1]} workflows did not complete"
    assert twice == 0, "a step's result was recorded twice"
    assert steps[1] == 3 * total
    assert stall <= RECOVERY_S, f"the last workflow completed {stall:.1f}s after it answered"
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the private server is gone, by pid
