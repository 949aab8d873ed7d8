"""Chaos: PostgreSQL drops every connection of a running fleet, again and again.

A `vibey worker` fleet (2 processes x 4 threads, the queue settings at their defaults: the
lost-dispatch sweep at 120 s) runs 300 three-step workflows while rounds of
``pg_terminate_backend`` cut every connection to the test's database (what a failover, a
pooler restart or an idle timeout does). Every workflow completes, no step's result is
recorded twice, and the last one completes within 10 s of the last kill: a blip costs
seconds, not the two minutes of a lost pointer.

The curve printed is completed workflows against seconds since the first kill.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.relay import Relay, Router
from actors.worker import WorkerConfig
from store.dispatch import DispatchRecords
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.workflows import WorkflowStore
from tests.amqp_fixtures import Amqp
from tests.chaos.pg_blips import (
    Killer,
    curve,
    database_of,
    sample,
    scalar,
    vibey_worker,
    worker_env,
)
from tests.tiny_definition import THREE_STEPS
from workflows.dispatch import DEFAULT_WAIT_TIERS
from workflows.engine import Registry

pytestmark = pytest.mark.chaos

WORKFLOWS = 300
DEADLINE_S = 300.0
RECOVERY_S = 10.0
COMPLETED = "SELECT count(*) FROM workflow WHERE status = 'completed'"
THREE_STEP_ENV = {
    "VIBEY_WORKFLOW_DEFINITIONS": "tests.tiny_definition:THREE_STEPS",
    "VIBEY_WORKER_HANDLERS": "tests.tiny_definition:THREE_STEP_HANDLERS",
}


def declare_topology(amqp: Amqp) -> None:
    """The fleet's queues, declared through the fixture so its teardown deletes them."""
    config = WorkerConfig(pg_url="", amqp_url=amqp.url, prefix=amqp.prefix)
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    connection.close()


def start_workflows(pool: ConnectionPool, amqp: Amqp, count: int) -> None:
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
        for n in range(count):
            store.start(f"blip{n:03d}", definition="three-steps")
        assert relay.flush(timeout=60), "the starts' pointers were not all published"
    finally:
        relay.stop()


def test_backend_kills_cost_seconds_not_minutes(
    pg_url: str, pg_admin_url: str, amqp: Amqp, tmp_path: Path
) -> None:
    declare_topology(amqp)
    env = worker_env(pg_url, amqp.url, amqp.prefix, THREE_STEP_ENV)
    killer = Killer(admin_url=pg_url, database=database_of(pg_url))
    points = []
    with vibey_worker(env, tmp_path / "worker.log"):
        with ConnectionPool(pg_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
            start_workflows(pool, amqp, WORKFLOWS)
        started = time.monotonic()
        while (now := sample(pg_url, COMPLETED)) is not None and now[1] < WORKFLOWS // 10:
            time.sleep(0.05)  # kill while the fleet is busy: once a tenth has completed
        killer.start()
        done = 0
        while done < WORKFLOWS and time.monotonic() - started < DEADLINE_S:
            point = sample(pg_url, COMPLETED)
            if point is not None:
                points.append(point)
                done = point[1]
            time.sleep(0.2)
        killer.join()
    final = sample(pg_url, "SELECT count(*) FROM workflow WHERE status <> 'completed'")
    twice = sample(
        pg_url,
        "SELECT count(*) FROM (SELECT workflow_id, event->>'step' FROM workflow_history "
        "WHERE event->>'type' = 'step_succeeded' GROUP BY 1, 2 HAVING count(*) > 1) d",
    )
    steps = sample(pg_url, "SELECT count(*) FROM job WHERE state = 'succeeded'")
    last = scalar(pg_url, "SELECT max(finished_at) FROM workflow")
    assert final is not None and twice is not None and steps is not None and last is not None
    first_kill = killer.rounds[0][0]
    stall = (last - killer.last_kill).total_seconds()
    print(
        f"\npg blips: workflows={WORKFLOWS} completed={done} steps={steps[1]} "
        f"recorded_twice={twice[1]} rounds={len(killer.rounds)} kills={killer.kills} "
        f"kills_over={(killer.last_kill - first_kill).total_seconds():.1f}s "
        f"last_completion_after_last_kill={stall:.1f}s\n"
        f"curve (completed workflows, seconds since the first kill; last kill at "
        f"+{(killer.last_kill - first_kill).total_seconds():.0f}s): {curve(points, first_kill)}"
    )
    assert final[1] == 0, f"{final[1]} workflows did not complete"
    assert twice[1] == 0, "a step's result was recorded twice"
    assert steps[1] == 3 * WORKFLOWS
    assert len(killer.rounds) >= 10 and killer.kills >= 100, "the chaos did not happen"
    assert stall <= RECOVERY_S, f"the last workflow completed {stall:.1f}s after the last kill"
