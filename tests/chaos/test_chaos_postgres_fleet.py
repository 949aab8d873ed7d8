"""Chaos on the postgres backend's real fleet: `vibey worker`'s supervisor and drive loop.

The PostgreSQL chaos test (test_chaos_postgres.py) drives the job repository from a worker
the test wrote; this one runs what `vibey worker` runs on ``backend = "postgres"``: the
supervisor, PostgresRuntime's drive threads (SKIP LOCKED claims, LISTEN/NOTIFY wakeups, the
reaper) and the StepRunner's settle. Worker processes SIGKILL themselves after the work and
after the settle on about one execution in seven (decided from the seed), a few stall past
their lease so their settle must be refused, and the supervisor respawns the dead.

Invariants: nothing lost; every job terminal or parked; exactly one commit per succeeded job
(the audit trigger's primary key); settles from lost leases refused ≥ 1; no outbox row (the
postgres backend dispatches nothing). Reproduce with ``VIBEY_CHAOS_SEED=<seed>``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from psycopg_pool import ConnectionPool

from actors.config import (
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.fleet import Supervisor
from actors.worker import WorkerConfig
from store.jobs import PostgresJobRepository
from tests.chaos.figures import figure
from tests.chaos.fleet import chaos_seed, count
from tests.chaos.test_chaos_rabbitmq import enqueue_chains, unsettled
from tests.commit_audit import COMMIT_AUDIT

pytestmark = pytest.mark.chaos

WORKERS = 6
LEASE = timedelta(seconds=3)
DEADLINE_S = 600


def test_sigkilled_postgres_backend_workers_lose_nothing_and_commit_once(
    pg_url: str, tmp_path: Path
) -> None:
    seed = chaos_seed("postgres fleet", lease=LEASE)
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        queue=QueueSettings(
            backend="postgres",
            poll_interval_seconds=1,
            lease_seconds={"default": LEASE.total_seconds()},
            rabbitmq=RabbitMqSettings(reconcile_interval_seconds=1),
        ),
        worker=WorkerSettings(threads=2, handlers="tests.chaos.rabbit_chaos:HANDLERS"),
        crash_points="tests.chaos.rabbit_chaos:CRASH",
        tally_dir=str(tmp_path),
    )
    started = time.monotonic()
    with ConnectionPool(
        pg_url, min_size=1, max_size=4, open=True, kwargs={"autocommit": True}
    ) as pool:
        with pool.connection() as conn:
            conn.execute(COMMIT_AUDIT.encode())
        total = enqueue_chains(PostgresJobRepository(pool=pool, leases=config.queue.lease), seed)
        supervisor = Supervisor(config, processes=WORKERS)
        fleet = threading.Thread(target=supervisor.run, daemon=True)
        fleet.start()
        try:
            while unsettled(pool) and time.monotonic() - started < DEADLINE_S:
                time.sleep(1.0)
        finally:
            supervisor.stop()
            fleet.join(timeout=120)
        with pool.connection() as conn:
            states: dict[str, int] = dict(
                conn.execute("SELECT state::text, count(*) FROM job GROUP BY 1").fetchall()
            )
        commits = count(pool, "SELECT count(*) FROM audit_commit")
        succeeded = count(pool, "SELECT count(*) FROM job WHERE state = 'succeeded'")
        outbox = count(pool, "SELECT count(*) FROM job_outbox")
        executions = count(pool, "SELECT coalesce(sum(attempts), 0) FROM job")
    tally: Counter[str] = Counter()
    for path in tmp_path.glob("*.log"):
        tally.update(path.read_text().split())
    doubles = commits - succeeded
    figure(
        f"postgres fleet chaos tally (seed {seed}): jobs={total} claims={executions} "
        f"kills={supervisor.respawns} commits={commits} lost={total - sum(states.values())} "
        f"double={doubles} states={states} step results={dict(tally)} outbox={outbox} "
        f"wall={time.monotonic() - started:.1f}s"
    )
    assert sum(states.values()) == total, "a job was lost"
    assert set(states) <= {"succeeded", "failed", "cancelled", "awaiting_human"}, states
    assert commits == succeeded, "a succeeded job without exactly one commit"
    assert supervisor.respawns >= total * 0.05, "the chaos did not happen"
    assert tally["stale"] >= 1, "no settle from a lost lease reached the fence"
    assert outbox == 0, "the postgres backend wrote dispatch pointers"
    assert os.environ["VIBEY_CHAOS_SEED"] == str(seed)
