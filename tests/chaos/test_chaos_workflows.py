"""Chaos: whole protocol workflows on a Dramatiq fleet whose processes are SIGKILLed.

Four worker processes run the real protocol handlers (scripted engine, git worktrees) while
the rabbit chaos crash points kill about one execution in five (before the claim, after the
work, after the settle) and stall a few past their lease. Gates are answered as they open.
Workflows are started until at least ``KILLS`` worker processes died (by construction,
whatever the box's speed): ``WORKFLOWS`` at first, one more each time all have finished short of
it.
At the end: every workflow completed, each step's result was recorded once (one job per step
name, one ``step_succeeded`` per step), every history replays to its stored state, every
project's ledger verifies (gapless, digests match), nothing is leased and nothing is unsent.

Reproduce with ``VIBEY_CHAOS_SEED=<seed printed by the run>``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    EngineSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.fleet import Supervisor
from actors.worker import WorkerConfig
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.workflows import WorkflowStore
from tests.acceptance.stack import cooperative
from tests.amqp_fixtures import Amqp
from tests.chaos.figures import figure
from tests.chaos.fleet import chaos_seed
from workflows.engine import Registry, Status
from workflows.protocol import DEFINITIONS
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import Gate

pytestmark = pytest.mark.chaos

WORKFLOWS = 10
MAX_WORKFLOWS = 40
KILLS = 5  # worker processes killed by the crash points (and respawned), at least
DEADLINE_S = 240.0
LEASE = timedelta(seconds=3)
SCRIPT = {
    "design": {"questions": [{"id": "who", "question": "Who is it for?", "answers": []}]},
    "build": {"work_items": [{"id": "core", "title": "Core"}, {"id": "cli", "title": "CLI"}]},
}


def answer_for(gate: Gate) -> str:
    """What a cooperative person answers (the e2e tests' answerer)."""
    return cooperative({"name": gate.name, "kind": gate.kind, "answers": list(gate.answers)})


def test_sigkilled_workers_lose_no_workflow_step_or_ledger_event(
    pg_url: str, amqp: Amqp, tmp_path: Path
) -> None:
    seed = chaos_seed("workflow", lease=LEASE)
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(
            # Every kind's lease short, the protocol's declared ones (2 h for build.implement) too.
            lease_seconds=dict.fromkeys(("default", *STEP_KINDS), LEASE.total_seconds()),
            rabbitmq=RabbitMqSettings(
                wait_tiers_seconds=(1, 5),
                reconcile_interval_seconds=1,
                redispatch_after_seconds=8,
                reclaim_after_seconds=5,
            ),
        ),
        worker=WorkerSettings(threads=2),
        engine=EngineSettings(workspace=str(tmp_path / "work")),
        crash_points="tests.chaos.rabbit_chaos:CRASH",
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # cleaned up
    connection.close()
    supervisor = Supervisor(config, processes=4)
    fleet = threading.Thread(target=supervisor.run, daemon=True)
    started = time.monotonic()
    with ConnectionPool(pg_url, min_size=1, max_size=4, kwargs={"autocommit": True}) as pool:
        jobs = PostgresJobRepository(pool=pool, leases=config.queue.lease, dispatch=True)
        ledger = Ledger(pool)
        store = WorkflowStore(pool=pool, jobs=jobs, registry=Registry(DEFINITIONS), ledger=ledger)
        ids: list[UUID] = []

        def more() -> None:
            n = len(ids)
            given = {"engine": {"name": "scripted", "script": SCRIPT}}
            ids.append(
                store.start(f"wf{n:02d}", definition="vibey-protocol", input=given).workflow.id
            )

        for _ in range(WORKFLOWS):
            more()
        fleet.start()
        answered = 0
        try:
            while time.monotonic() - started < DEADLINE_S:
                for gate, _waited in store.inbox():
                    store.answer(gate.id, answer_for(gate), by="chaos")
                    answered += 1
                if all(store.get(i).status.finished for i in ids):
                    if supervisor.respawns >= KILLS or len(ids) >= MAX_WORKFLOWS:
                        break
                    more()  # the chaos is short of its count: more work for it to land on
                time.sleep(0.2)
        finally:
            supervisor.stop()
            fleet.join(timeout=120)
        workflows = [store.get(i) for i in ids]
        with pool.connection() as conn:
            dupes = conn.execute(
                "SELECT workflow_id, event->>'step', count(*) FROM workflow_history "
                "WHERE event->>'type' = 'step_succeeded' GROUP BY 1, 2 HAVING count(*) > 1"
            ).fetchall()
            [(leased,)] = conn.execute("SELECT count(*) FROM job WHERE state = 'leased'")
            [(succeeded,)] = conn.execute("SELECT count(*) FROM job WHERE state = 'succeeded'")
            [(attempts,)] = conn.execute("SELECT coalesce(sum(attempts), 0) FROM job")
        verified = [store.verify(i) for i in ids]
        ledgers = [ledger.verify(wf.project_id) for wf in workflows]
    figure(
        f"workflow chaos tally (seed {seed}): workflows={len(ids)} "
        f"statuses={sorted({w.status.value for w in workflows})} steps={succeeded} "
        f"claims={attempts} respawns={supervisor.respawns} gates answered={answered} "
        f"ledger events={sum(v.count for v in ledgers)} wall={time.monotonic() - started:.1f}s"
    )
    assert all(w.status is Status.COMPLETED for w in workflows), [
        (w.project_id, w.status.value, w.phase, w.reason) for w in workflows
    ]
    assert dupes == [], f"a step's result recorded more than once: {dupes}"
    assert all(v.ok for v in verified), [v.divergence for v in verified if not v.ok]
    assert all(v.ok for v in ledgers), [v.problem for v in ledgers if not v.ok]
    assert leased == 0
    assert supervisor.respawns >= KILLS, "the chaos did not happen"
