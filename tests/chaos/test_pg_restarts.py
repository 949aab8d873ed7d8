"""Chaos: a private PostgreSQL server restarted several times under protocol workflows.

A `vibey worker` fleet (2 processes x 4 threads, reconciling every 2 s) on either backend runs
whole protocol workflows (the demo script, gates answered here) against a private server (its
own port and data folder, ``tests/chaos/private_postgres.py``) that is stopped and started
again four times mid-run: twice with a fast shutdown (every session ended, a checkpoint) and
twice with an immediate stop (a crash: no checkpoint, WAL replayed at the next start). Each
stop waits for progress (``PROGRESS`` more steps succeeded since the server last answered
again), so it lands on a fleet at work that came back from the stop before, whatever the box's
speed; with no step left to run, it happens after ``PROGRESS_WAIT_S`` all the same.

Invariants: every workflow completes with the fleet never restarted, no step's result is
recorded twice, every history replays to its stored state, every project's ledger verifies,
nothing is left leased. It prints its counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from psycopg_pool import ConnectionPool

from actors.relay import Relay, Router
from store.dispatch import DispatchRecords
from store.errors import StoreError
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.migrate import migrate
from store.workflows import WorkflowStore
from tests.acceptance.stack import DEMO_SCRIPT
from tests.amqp_fixtures import Amqp
from tests.chaos.figures import figure
from tests.chaos.pg_blips import sample, vibey_worker, worker_env
from tests.chaos.private_postgres import PrivatePostgres, private_postgres
from tests.chaos.test_pg_blips import answer_for, declare_topology, recorded_twice
from vibey.cli_workflow import read_script
from workflows.dispatch import DEFAULT_WAIT_TIERS
from workflows.engine import Registry, Status
from workflows.protocol import DEFINITIONS

pytestmark = pytest.mark.chaos

WORKFLOWS = 6
DEADLINE_S = 420.0
STOPS = ("fast", "immediate", "fast", "immediate")
DOWN_S = 4.0


PROGRESS = 2  # steps succeeded since the server answered again, before the next stop
PROGRESS_WAIT_S = 30.0


def restarts(
    server: PrivatePostgres,
    steps_done: Callable[[], int | None],
    log: list[str],
    at: list[int],
    done: threading.Event,
) -> None:
    try:
        for mode in STOPS:
            base: int | None = None
            deadline = time.monotonic() + PROGRESS_WAIT_S
            while time.monotonic() < deadline:
                now = steps_done()  # None while the server does not answer yet
                if base is None:
                    base = now
                elif now is not None and now >= base + PROGRESS:
                    break
                time.sleep(0.2)
            at.append(steps_done() or 0)
            server.stop(mode)
            time.sleep(DOWN_S)
            server.start()
            log.append(mode)
    finally:
        done.set()


@pytest.mark.parametrize("backend", ["rabbitmq", "postgres"])
def test_restarts_of_the_database_lose_no_workflow_step(
    backend: str, amqp: Amqp, tmp_path: Path
) -> None:
    declare_topology(amqp)
    script = read_script(DEMO_SCRIPT)
    extra = {
        "VIBEY_ENGINE_WORKSPACE": str(tmp_path / "work"),
        "VIBEY_QUEUE_RECONCILE_INTERVAL": "2",
        "VIBEY_QUEUE_BACKEND": backend,
        "VIBEY_QUEUE_POLL_INTERVAL": "1",
    }
    with private_postgres() as server:
        migrate(server.url)
        env = worker_env(server.url, amqp.url, amqp.prefix, extra)
        log: list[str] = []
        faulted = threading.Event()
        answered = 0
        with (
            vibey_worker(env, tmp_path / "worker.log") as worker,
            ConnectionPool(server.url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool,
        ):
            relay = None
            if backend == "rabbitmq":
                records = DispatchRecords(pool=pool, relay_id="restart-test")
                router = Router(names=amqp.names, tiers=DEFAULT_WAIT_TIERS)
                relay = Relay(url=amqp.url, records=records, router=router)
                relay.start()
            jobs = PostgresJobRepository(
                pool=pool,
                dispatch=relay is not None,
                relay_id="restart-test",
                after_commit=None if relay is None else relay.submit,
            )
            ledger = Ledger(pool)
            registry = Registry(DEFINITIONS)
            store = WorkflowStore(pool=pool, jobs=jobs, registry=registry, ledger=ledger)
            ids = [
                store.start(
                    f"rs{n:02d}",
                    definition="vibey-protocol",
                    input={"engine": {"name": "scripted", "script": script}},
                ).workflow.id
                for n in range(WORKFLOWS)
            ]

            def steps_done() -> int | None:
                point = sample(server.url, "SELECT count(*) FROM job WHERE state = 'succeeded'")
                return None if point is None else point[1]

            stopped_at: list[int] = []
            threading.Thread(
                target=restarts, args=(server, steps_done, log, stopped_at, faulted), daemon=True
            ).start()
            started = time.monotonic()
            try:
                while time.monotonic() - started < DEADLINE_S:
                    try:
                        for gate, _waited in store.inbox():
                            store.answer(gate.id, answer_for(gate), by="restart-test")
                            answered += 1
                        if faulted.is_set() and all(store.get(i).status.finished for i in ids):
                            break
                    except StoreError:  # the server is down: look again
                        pass
                    time.sleep(0.3)
                faulted.wait(timeout=60)
                workflows = [store.get(i) for i in ids]
                verified = [store.verify(i) for i in ids]
                ledgers = [ledger.verify(wf.project_id) for wf in workflows]
            finally:
                if relay is not None:
                    relay.stop()
            alive = worker.poll() is None
        twice = recorded_twice(server.url)
        steps = sample(server.url, "SELECT count(*) FROM job WHERE state = 'succeeded'")
        jobs_total = sample(server.url, "SELECT count(*) FROM job")
        leased = sample(server.url, "SELECT count(*) FROM job WHERE state = 'leased'")
        claims = sample(server.url, "SELECT coalesce(sum(attempts), 0) FROM job")
    assert steps is not None and jobs_total is not None and leased is not None
    assert claims is not None
    unfinished = [w for w in workflows if w.status is not Status.COMPLETED]
    figure(
        f"\npg restarts ({backend}): workflows={WORKFLOWS} jobs={jobs_total[1]} "
        f"claims={claims[1]} kills={len(log)} ({'/'.join(log)}, at {stopped_at} steps done) "
        f"commits={steps[1]} "
        f"lost={len(unfinished)} double={twice} gates_answered={answered} "
        f"ledger_events={sum(v.count for v in ledgers)} wall={time.monotonic() - started:.1f}s"
    )
    assert log == list(STOPS), f"the restarts did not all happen: {log}"
    assert alive, "the fleet exited: it must ride out the restarts"
    assert unfinished == [], [(w.project_id, w.status.value, w.phase) for w in unfinished]
    assert twice == 0, "a step's result was recorded twice"
    assert all(v.ok for v in verified), [v.divergence for v in verified if not v.ok]
    assert all(v.ok for v in ledgers), [v.problem for v in ledgers if not v.ok]
    assert leased[1] == 0
