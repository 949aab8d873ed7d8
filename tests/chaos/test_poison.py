"""Poison isolation on the RabbitMQ backend (failure-modes K2).

Ten always-crashing jobs (their handler SIGKILLs its own worker process on every attempt)
among 500 healthy ones, run by a supervised fleet of real Dramatiq worker processes, at
prefetch 1 and at Dramatiq's default prefetch (2 × threads). Every job may be attempted 3
times; the work queues' broker delivery limit (5) is only a backstop.

Invariants: each poison job ends ``awaiting_human`` behind a ``delivery_exhausted`` gate after
at most 3 attempts (PostgreSQL's attempt counter is the authority); none of the 500 healthy
jobs is parked (all succeed); nothing is lost; every job is terminal or parked; at quiescence
the work, tier and dead-letter queues are empty and the outbox has nothing unsent.

Reproduce with ``VIBEY_POISON_SEED=<seed printed by the run>`` (the seed picks the job ids,
the poison jobs' places in the enqueue order, and through the ids each healthy job's work
time).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

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
from actors.worker import WorkerConfig
from store.jobs import PostgresJobRepository
from tests.amqp_fixtures import Amqp
from tests.chaos.figures import figure
from tests.chaos.fleet import count, queue_depths
from tests.chaos.poison_handlers import KIND
from workflows.dispatch import WaitTiers
from workflows.queue import DELIVERY_EXHAUSTED, EnqueueRequest

pytestmark = pytest.mark.chaos

PROJECT = "poison"
HEALTHY = 500
POISON = 10
PROCESSES = 4
THREADS = 4
MAX_ATTEMPTS = 3
DELIVERY_LIMIT = 5
LEASE = timedelta(seconds=2)
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))
DEADLINE_S = 75.0
QUIET_S = 15.0
SETTLED = ("succeeded", "failed", "cancelled", "awaiting_human")


def enqueue(repo: PostgresJobRepository, seed: int) -> set[uuid.UUID]:
    """HEALTHY + POISON jobs in a seeded order; returns the poison jobs' ids."""
    rng = random.Random(seed)
    poison_at = set(rng.sample(range(HEALTHY + POISON), POISON))
    requests = []
    poison: set[uuid.UUID] = set()
    for index in range(HEALTHY + POISON):
        job_id = uuid.UUID(int=rng.getrandbits(128), version=4)
        is_poison = index in poison_at
        if is_poison:
            poison.add(job_id)
        requests.append(
            EnqueueRequest(
                project_id=PROJECT,
                kind=KIND,
                subject=f"job-{index}",
                payload={"poison": True} if is_poison else {},
                max_attempts=MAX_ATTEMPTS,
                job_id=job_id,
            )
        )
    for offset in range(0, len(requests), 200):
        repo.enqueue_batch(requests[offset : offset + 200])
    return poison


def unsettled(pool: ConnectionPool) -> int:
    states = ", ".join(f"'{s}'" for s in SETTLED)
    return count(pool, f"SELECT count(*) FROM job WHERE state NOT IN ({states})")


def stop_fleet(supervisor: Supervisor, fleet: threading.Thread) -> None:
    """Graceful stop; whatever is still alive after a minute is killed by its pid."""
    supervisor.stop()
    fleet.join(timeout=60)
    for pid in supervisor.pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    fleet.join(timeout=10)


def stop_forkserver() -> None:
    """The Supervisor's forkserver was started for this test: stop it (it exits when its
    alive pipe closes; its pid is reaped)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # private: no public way to stop it
    with contextlib.suppress(Exception):
        server._stop()  # type: ignore[attr-defined]


@pytest.mark.parametrize("prefetch", [1, 2 * THREADS], ids=["prefetch-1", "prefetch-default"])
def test_poison_jobs_park_and_healthy_jobs_never_do(
    pg_url: str, amqp: Amqp, tmp_path: Path, prefetch: int
) -> None:
    seed = int(os.environ.get("VIBEY_POISON_SEED") or random.SystemRandom().randrange(2**31))
    figure(f"\npoison seed: {seed} (rerun with VIBEY_POISON_SEED={seed}), prefetch {prefetch}")
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(
            lease_seconds={"default": LEASE.total_seconds()},
            rabbitmq=RabbitMqSettings(
                wait_tiers_seconds=TIERS.seconds,
                prefetch=prefetch,
                delivery_limit=DELIVERY_LIMIT,
                reconcile_interval_seconds=1,
                redispatch_after_seconds=8,
                reclaim_after_seconds=5,
            ),
        ),
        worker=WorkerSettings(threads=THREADS, handlers="tests.chaos.poison_handlers:HANDLERS"),
        tally_dir=str(tmp_path),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # recorded: cleanup
    connection.close()
    queues = [config.names.work_queue(lane) for lane in config.worker.lanes]
    queues += [config.names.tier_queue(name) for name in TIERS.names]
    queues.append(config.names.dead_queue)
    started = time.monotonic()
    with ConnectionPool(
        pg_url, min_size=1, max_size=4, open=True, kwargs={"autocommit": True}
    ) as pool:
        # Enqueued with dispatch on and no relay: the fleet's reconcilers drain the outbox.
        repo = PostgresJobRepository(pool=pool, leases=config.queue.lease, dispatch=True)
        poison = enqueue(repo, seed)
        supervisor = Supervisor(config, processes=PROCESSES)
        fleet = threading.Thread(target=supervisor.run, daemon=True)
        fleet.start()
        try:
            while unsettled(pool) and time.monotonic() - started < DEADLINE_S:
                time.sleep(0.5)
            settled_s = time.monotonic() - started
            quiet = time.monotonic()
            # Re-delayed pointers come back and are dropped; outbox rows a killed relay held
            # are reclaimed (after reclaim_after) and sent again.
            while (
                sum(queue_depths(amqp, queues).values())
                or count(pool, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
            ) and time.monotonic() - quiet < QUIET_S:
                time.sleep(0.5)
        finally:
            stop_fleet(supervisor, fleet)
            stop_forkserver()
        depths = queue_depths(amqp, queues)  # the fleet is gone: unacked ones are ready again
        with pool.connection() as conn:
            rows = conn.execute(
                b"SELECT j.id, j.state::text, j.attempts, "
                b"       (SELECT array_agg(g.kind) FROM gate g "
                b"        WHERE g.job_id = j.id AND g.answered_at IS NULL), j.last_error "
                b"FROM job j"
            ).fetchall()
        unsent = count(pool, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
    wall = time.monotonic() - started
    jobs = {row[0]: (row[1], row[2], tuple(row[3] or ())) for row in rows}
    healthy = {job_id: v for job_id, v in jobs.items() if job_id not in poison}
    poisoned = {job_id: v for job_id, v in jobs.items() if job_id in poison}
    tally: Counter[str] = Counter()
    for path in tmp_path.glob("*.log"):
        tally.update(path.read_text().split())
    healthy_states = Counter(state for state, _, _ in healthy.values())
    healthy_retried = sum(1 for _, attempts, _ in healthy.values() if attempts > 1)
    # Why a healthy job parked: the reaper's "lease expired on attempt 3 of 3" means it was
    # running in a worker process a poison job killed, on each of its attempts.
    errors = {row[0]: row[4] for row in rows}
    healthy_parked = Counter(
        errors[job_id] for job_id, (state, _, _) in healthy.items() if state == "awaiting_human"
    )
    figure(
        f"poison tally (seed {seed}, prefetch {prefetch}): jobs={len(jobs)} "
        f"respawns={supervisor.respawns} "
        f"parks={sum(1 for s, _, _ in jobs.values() if s == 'awaiting_human')} "
        f"poison (state, attempts, gates)={dict(Counter(poisoned.values()))} "
        f"healthy states={dict(healthy_states)} healthy retried={healthy_retried} "
        f"healthy max attempts={max((a for _, a, _ in healthy.values()), default=0)} "
        f"healthy parked by reason={dict(healthy_parked)} "
        f"step results={dict(tally)} queues={depths} unsent={unsent} "
        f"settled in {settled_s:.1f}s, wall {wall:.1f}s"
    )
    assert len(jobs) == HEALTHY + POISON, "a job was lost"
    assert len(poisoned) == POISON
    assert all(state in SETTLED for state, _, _ in jobs.values()), "a job neither ended nor parked"
    for job_id, (state, attempts, gates) in poisoned.items():
        assert state == "awaiting_human", f"poison job {job_id} is {state}"
        assert gates == (DELIVERY_EXHAUSTED,), f"poison job {job_id} gates: {gates}"
        assert attempts in range(1, MAX_ATTEMPTS + 1), f"poison job {job_id}: {attempts} attempts"
    assert healthy_states == Counter({"succeeded": HEALTHY}), (
        f"healthy jobs parked or failed: {dict(healthy_states)}"
    )
    assert supervisor.respawns >= 1, "no poison job ever killed its worker"
    assert sum(depths.values()) == 0, f"messages left at quiescence: {depths}"
    assert unsent == 0, "outbox rows left unsent"
