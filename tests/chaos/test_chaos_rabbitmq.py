"""Chaos on the RabbitMQ backend: the PostgreSQL chaos test's twin.

A supervised fleet of 8 Dramatiq worker processes runs chains of 3 dependent steps. Worker
processes SIGKILL themselves at named crash points (before the claim, after the work, after
the settle and before the ack) on about 20% of executions, decided from the seed; a few
executions stall past their lease so their settle must be refused. The supervisor respawns
the dead. Mid-run (once a fifth of the jobs succeeded: an event, not a clock) the broker's
application is stopped for 5 s and started again; the broker is a private node (its own port
and data, ``tests/chaos/private_rabbit.py``), so the shared one and the tests beside this one
are never touched.

Invariants: nothing lost; every job terminal or parked; exactly one commit per succeeded job
(a trigger writes a row in the ack's own transaction under a primary key, so a second commit
would fail loudly); settles from lost leases refused ≥ 1; at quiescence the work and tier
queues are empty and the outbox has nothing unsent.

Reproduce with ``VIBEY_CHAOS_SEED=<seed printed by the run>``; size with
``VIBEY_CHAOS_CHAINS`` (default 500).
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.fleet import Supervisor
from actors.topology import QueueNames
from actors.worker import WorkerConfig
from store.jobs import PostgresJobRepository
from tests.amqp_fixtures import Amqp
from tests.chaos.figures import figure
from tests.chaos.fleet import chaos_seed, count, queue_depths
from tests.chaos.private_rabbit import PrivateRabbit, private_rabbit
from tests.commit_audit import COMMIT_AUDIT
from workflows.dispatch import WaitTiers
from workflows.queue import EnqueueRequest

pytestmark = pytest.mark.chaos

PROJECT = "chaos"
CHAINS = int(os.environ.get("VIBEY_CHAOS_CHAINS", "500"))
STEPS = ("build.implement", "build.verify", "build.integrate")
WORKERS = 8
LEASE = timedelta(seconds=3)
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))
DEADLINE_S = 600
# rabbitmqctl on a busy node of a loaded box: its VM starts and the node answers in seconds,
# or minutes when other test runs share the cores (60 s ran out, measured).
CTL_TIMEOUT_S = 240.0
BOUNCE = os.environ.get("VIBEY_CHAOS_BOUNCE", "1") != "0"  # stop_app/start_app mid-run


def enqueue_chains(repo: PostgresJobRepository, seed: int) -> int:
    rng = random.Random(seed)
    requests = []
    for chain in range(CHAINS):
        previous: tuple[uuid.UUID, ...] = ()
        for kind in STEPS:
            job_id = uuid.UUID(int=rng.getrandbits(128), version=4)
            requests.append(
                EnqueueRequest(
                    project_id=PROJECT,
                    kind=kind,
                    subject=f"chain-{chain}",
                    depends_on=previous,
                    job_id=job_id,
                    max_attempts=10,
                )
            )
            previous = (job_id,)
    for offset in range(0, len(requests), 300):
        repo.enqueue_batch(requests[offset : offset + 300])
    return len(requests)


def unsettled(pool: ConnectionPool) -> int:
    return count(
        pool,
        "SELECT count(*) FROM job WHERE state NOT IN "
        "('succeeded', 'failed', 'cancelled', 'awaiting_human')",
    )


def bounce_broker(
    rabbit: PrivateRabbit,
    succeeded: Callable[[], int],
    at: int,
    down_s: float,
    log: list[str],
    done: threading.Event,
) -> None:
    """stop_app once ``at`` jobs succeeded, start_app ``down_s`` later."""
    try:
        deadline = time.monotonic() + DEADLINE_S
        while succeeded() < at and time.monotonic() < deadline:
            time.sleep(0.1)
        log.append(f"stop_app at {succeeded()} succeeded")
        rabbit.ctl("stop_app", timeout=CTL_TIMEOUT_S)
        time.sleep(down_s)
        rabbit.ctl("start_app", timeout=CTL_TIMEOUT_S)
        log.append("start_app")
    finally:
        done.set()


@pytest.fixture
def private_amqp() -> Iterator[tuple[PrivateRabbit, Amqp]]:
    """A private node (RabbitMQ's own consumer_timeout and channel tick, as the shared node
    runs them) and this test's names on it; the node and everything on it go at the end."""
    # RabbitMQ's defaults: consumer_timeout 30 min, channel tick 60 s.
    with private_rabbit(consumer_timeout_ms=1_800_000, channel_tick_ms=60_000) as rabbit:
        prefix = f"t{uuid.uuid4().hex[:8]}"
        names = QueueNames(prefix)
        amqp = Amqp(url=rabbit.url, vhost="/", prefix=prefix, names=names, ctl=rabbit.ctl)
        try:
            yield rabbit, amqp
        finally:
            amqp.cleanup()


def test_sigkilled_dramatiq_workers_lose_nothing_and_commit_once(
    pg_url: str, private_amqp: tuple[PrivateRabbit, Amqp], tmp_path: Path
) -> None:
    rabbit, amqp = private_amqp
    seed = chaos_seed("rabbitmq", lease=LEASE)
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(
            lease_seconds={"default": LEASE.total_seconds()},
            rabbitmq=RabbitMqSettings(
                wait_tiers_seconds=TIERS.seconds,
                reconcile_interval_seconds=1,
                redispatch_after_seconds=8,
                reclaim_after_seconds=5,
            ),
        ),
        worker=WorkerSettings(threads=2, handlers="tests.chaos.rabbit_chaos:HANDLERS"),
        crash_points="tests.chaos.rabbit_chaos:CRASH",
        tally_dir=str(tmp_path),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # recorded: cleanup
    connection.close()
    started = time.monotonic()
    with ConnectionPool(
        pg_url, min_size=1, max_size=4, open=True, kwargs={"autocommit": True}
    ) as pool:
        with pool.connection() as conn:
            conn.execute(COMMIT_AUDIT.encode())
        # Enqueued with dispatch on and no relay: the fleet's reconcilers drain the outbox.
        repo = PostgresJobRepository(pool=pool, leases=config.queue.lease, dispatch=True)
        total = enqueue_chains(repo, seed)
        supervisor = Supervisor(config, processes=WORKERS)
        fleet = threading.Thread(target=supervisor.run, daemon=True)
        fleet.start()
        bounced = threading.Event()
        bounces: list[str] = []
        if BOUNCE:

            def done_jobs() -> int:
                return count(pool, "SELECT count(*) FROM job WHERE state = 'succeeded'")

            threading.Thread(
                target=bounce_broker,
                args=(rabbit, done_jobs, total // 5, 5.0, bounces, bounced),
                daemon=True,
            ).start()
        else:
            bounced.set()
        try:
            while (
                unsettled(pool) or not bounced.is_set()
            ) and time.monotonic() - started < DEADLINE_S:
                time.sleep(1.0)
            queues = [config.names.work_queue(lane) for lane in config.worker.lanes]
            queues += [config.names.tier_queue(name) for name in TIERS.names]
            quiet = time.monotonic()
            # Re-delayed duplicates come back and are dropped; outbox rows a killed relay held
            # are reclaimed (after reclaim_after) and sent again.
            while (
                sum(queue_depths(amqp, queues).values())
                or count(pool, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
            ) and time.monotonic() - quiet < 30:
                time.sleep(0.5)
            depths = queue_depths(amqp, queues)
        finally:
            supervisor.stop()
            fleet.join(timeout=120)
        with pool.connection() as conn:
            states: dict[Any, Any] = dict(
                conn.execute("SELECT state::text, count(*) FROM job GROUP BY 1").fetchall()
            )
        commits = count(pool, "SELECT count(*) FROM audit_commit")
        succeeded = count(pool, "SELECT count(*) FROM job WHERE state = 'succeeded'")
        unsent = count(pool, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
        executions = count(pool, "SELECT coalesce(sum(attempts), 0) FROM job")
    tally: Counter[str] = Counter()
    for path in tmp_path.glob("*.log"):
        tally.update(path.read_text().split())
    figure(
        f"rabbitmq chaos tally (seed {seed}): jobs={total} claims={executions} "
        f"respawns={supervisor.respawns} commits={commits} states={states} "
        f"step results={dict(tally)} queues={depths} unsent={unsent} bounce={bounces} "
        f"wall={time.monotonic() - started:.1f}s"
    )
    if BOUNCE:
        assert len(bounces) == 2, f"the broker was not bounced: {bounces}"
    assert sum(states.values()) == total, "a job was lost"
    assert set(states) <= {"succeeded", "failed", "cancelled", "awaiting_human"}, states
    assert commits == succeeded, "a succeeded job without exactly one commit"
    assert supervisor.respawns >= total * 0.05, "the chaos did not happen"
    assert tally["stale"] >= 1, "no settle from a lost lease reached the fence"
    assert sum(depths.values()) == 0, f"messages left at quiescence: {depths}"
    assert unsent == 0, "outbox rows left unsent"
