"""Chaos: workers SIGKILLed in the middle of in-place chains (``actors.in_place``).

Three short steps per workflow, so a worker that settles ``a`` holds ``b`` and runs it itself,
then ``c``; half the workflows schedule all three at their start (each waiting on the one
before), half schedule each step when the one before succeeded (``one-by-one``). The crash
point kills a seeded fraction of the processes right after a settle committed
(``tests/chaos/in_place_chaos.py``): the next step's outbox row is released and unsent, and no
broker message carries it. Workflows are started until at least ``KILLS`` kills cut a chain (by
construction, whatever the box's speed). At the end: every workflow completed, no step recorded
twice, nothing leased or unsent (once the drain took back the rows that killed relays had
claimed, after ``reclaim_after``), and a cut chain went on within one reconcile interval of its
kill: the next drain pass sends the held row (a reconciler of its own runs beside the fleet, as
`vibey reconcile` does in a cluster; the workers' reconcilers die with them). A cut whose
drainer is killed too before it sent the row waits for ``reclaim_after`` beside that: every cut
is bounded by two intervals plus ``reclaim_after``; the median by one.

Reproduce with ``VIBEY_CHAOS_SEED=<seed printed by the run>``.
"""

from __future__ import annotations

import statistics
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from uuid import UUID

import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
    WorkflowSettings,
)
from actors.fleet import Supervisor
from actors.reconcile_service import ReconcileService
from actors.worker import WorkerConfig
from store.jobs import PostgresJobRepository
from store.workflows import WorkflowStore
from tests.amqp_fixtures import Amqp
from tests.chaos.figures import figure
from tests.chaos.fleet import chaos_seed
from tests.tiny_definition import THREE_STEPS
from workflows.engine import Registry
from workflows.protocol.kinds import STEP_KINDS

pytestmark = pytest.mark.chaos

BATCH = 300  # workflows started at once; another batch while too few chains were cut
MAX_WORKFLOWS = 1500
KILLS = 20  # kills that cut a chain, at least
INTERVAL = timedelta(seconds=2)  # the reconcilers' pass
RECLAIM = timedelta(seconds=4)  # rows a killed relay had claimed are drained again after this
SLACK_S = 2.0  # a pass's own time, the publish and the claim, on a loaded box
DEADLINE_S = 300.0
# Both kinds of chain: the next step waiting on its dependency (released by the ack), and the
# next step inserted by the settle's decision (its outbox row written held).
DEFINITIONS = ("three-steps", "one-by-one")


def cut_chains(pool: ConnectionPool, kills: Path) -> list[tuple[UUID, float]]:
    """(job, kill time) of every kill right after a settle that held a next step."""
    found: list[tuple[UUID, float]] = []
    for log in kills.glob("kills-*.log"):
        for line in log.read_text().splitlines():
            job, at = line.split()
            found.append((UUID(job), float(at)))
    with pool.connection() as conn:
        parents = {  # a step with a next one: a or b (either definition)
            row[0]
            for row in conn.execute(
                "SELECT id FROM job WHERE id = ANY(%s) AND step IN ('a', 'b')",
                ([job for job, _ in found],),
            )
        }
    return [(job, at) for job, at in found if job in parents]


def unsent_count(pool: ConnectionPool) -> int:
    with pool.connection() as conn:
        [(unsent,)] = conn.execute("SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
    return int(unsent)


def resumed_after(pool: ConnectionPool, cut: list[tuple[UUID, float]]) -> list[float]:
    """Seconds from each cut to the send of the next step's pointer it held (its outbox row
    marked sent: by a drain's relay once the broker confirmed it). From there the pointer
    waits in the queue like any other; under a backlog that wait is the queue's, not the
    cut's."""
    waits = []
    with pool.connection() as conn:
        for job, at in cut:
            row = conn.execute(  # the next step's job: waiting on it, or inserted by its settle
                "SELECT min(o.sent_at) FROM job j JOIN job n ON n.workflow_id = j.workflow_id"
                " AND n.step = CASE j.step WHEN 'a' THEN 'b' ELSE 'c' END"
                " JOIN job_outbox o ON o.job_id = n.id WHERE j.id = %s",
                (job,),
            ).fetchone()
            sent: datetime | None = None if row is None else row[0]
            if sent is not None:
                waits.append(sent.timestamp() - at)
    return waits


def test_sigkilled_mid_chain_workers_lose_nothing_and_resume_within_an_interval(
    pg_url: str, amqp: Amqp, tmp_path: Path
) -> None:
    seed = chaos_seed("in-place")
    kills = tmp_path / "kills"
    kills.mkdir()
    lease = timedelta(seconds=5)
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(
            lease_seconds=dict.fromkeys(("default", *STEP_KINDS), lease.total_seconds()),
            rabbitmq=RabbitMqSettings(
                reconcile_interval_seconds=INTERVAL.total_seconds(),
                redispatch_after_seconds=30,
                reclaim_after_seconds=RECLAIM.total_seconds(),
                in_place_steps=16,
                # A chain ends at a kill, not at its wall-time budget: however slow the box,
                # the steps continue in place unless the chaos cuts them.
                in_place_ms=60_000,
            ),
        ),
        worker=WorkerSettings(threads=4, handlers="tests.chaos.in_place_chaos:HANDLERS"),
        workflow=WorkflowSettings(definitions="tests.chaos.in_place_chaos:DEFINITIONS"),
        crash_points="tests.chaos.in_place_chaos:CRASH",
        tally_dir=str(kills),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # cleaned up
    connection.close()
    supervisor = Supervisor(config, processes=3)
    # A reconciler of its own, as a fleet runs one (`vibey reconcile`): never killed here.
    stop = threading.Event()
    reconciler = ReconcileService(config, owner="in-place-chaos-reconciler")
    reconciling = threading.Thread(target=reconciler.run, args=(stop,), daemon=True)
    fleet = threading.Thread(target=supervisor.run, daemon=True)
    started = time.monotonic()
    ids: list[UUID] = []
    with ConnectionPool(pg_url, min_size=1, max_size=4, kwargs={"autocommit": True}) as pool:
        jobs = PostgresJobRepository(pool=pool, leases=config.queue.lease, dispatch=True)
        store = WorkflowStore(pool=pool, jobs=jobs, registry=Registry(THREE_STEPS))

        def more() -> None:
            for _ in range(BATCH):
                n = len(ids)
                definition = DEFINITIONS[n % len(DEFINITIONS)]
                ids.append(store.start(f"ip{n:04d}", definition=definition).workflow.id)

        more()
        fleet.start()
        reconciling.start()
        try:
            while time.monotonic() - started < DEADLINE_S:
                if all(store.get(i).status.finished for i in ids):
                    if len(cut_chains(pool, kills)) >= KILLS or len(ids) >= MAX_WORKFLOWS:
                        break
                    more()
                time.sleep(0.5)
            # A relay killed between the broker's confirm and its mark-sent leaves its row
            # claimed (the step ran; the row is not sent): the drain takes it back after
            # reclaim_after. Every row is sent within that and two passes, or the test fails.
            quiet = (RECLAIM + INTERVAL + INTERVAL).total_seconds() + SLACK_S
            settle_by = time.monotonic() + quiet
            while unsent_count(pool) and time.monotonic() < settle_by:
                time.sleep(0.2)
        finally:
            supervisor.stop()
            fleet.join(timeout=120)
            stop.set()
            reconciling.join(timeout=60)
        statuses = {store.get(i).status.value for i in ids}
        cut = cut_chains(pool, kills)
        waits = resumed_after(pool, cut)
        with pool.connection() as conn:
            dupes = conn.execute(
                "SELECT workflow_id, event->>'step', count(*) FROM workflow_history "
                "WHERE event->>'type' = 'step_succeeded' GROUP BY 1, 2 HAVING count(*) > 1"
            ).fetchall()
            [(leased,)] = conn.execute("SELECT count(*) FROM job WHERE state = 'leased'")
            [(unsent,)] = conn.execute("SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
            unsent_rows = conn.execute(
                "SELECT o.key, o.claimed_by, o.claimed_at, o.created_at, j.state, j.dispatch_seq,"
                " now() FROM job_outbox o JOIN job j ON j.id = o.job_id WHERE o.sent_at IS NULL"
            ).fetchall()
            [(in_place,)] = conn.execute(
                "SELECT count(*) FROM job_outbox WHERE sent_at IS NOT NULL AND claimed_by IS NULL"
            )
            [(steps,)] = conn.execute("SELECT count(*) FROM job WHERE state = 'succeeded'")
    figure(
        f"in-place chaos tally (seed {seed}): workflows={len(ids)} steps={steps} "
        f"in place={in_place} respawns={supervisor.respawns} chains cut={len(cut)} "
        f"resumed after: median {statistics.median(waits or [0]):.2f}s, "
        f"max {max(waits, default=0):.2f}s (interval {INTERVAL.total_seconds():g}s, "
        f"reclaim {RECLAIM.total_seconds():g}s) "
        f"wall={time.monotonic() - started:.1f}s"
    )
    assert statuses == {"completed"}, statuses
    assert dupes == [], f"a step's result recorded more than once: {dupes}"
    assert leased == 0 and unsent == 0, unsent_rows
    assert len(cut) >= KILLS, f"the chaos did not happen: {len(cut)} chains cut"
    assert in_place >= len(ids), "the steps did not continue in place"
    assert len(waits) == len(cut)
    assert statistics.median(waits) <= INTERVAL.total_seconds() + SLACK_S, sorted(waits)
    bound = (INTERVAL + RECLAIM + INTERVAL).total_seconds() + SLACK_S
    assert max(waits) <= bound, sorted(waits)[-5:]
