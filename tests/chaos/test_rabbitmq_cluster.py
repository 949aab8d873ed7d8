"""A three-node RabbitMQ cluster on loopback under a worker fleet: nodes die mid-run.

Three private nodes (own ports, data and cookie) form a cluster; vibey's topology is declared
on it, so every work, tier and dead-letter queue is a quorum queue replicated on all three.
A supervised fleet of Dramatiq workers, given all three AMQP URLs, runs chains of dependent
steps (in the second test, whole protocol workflows with their gates answered). Mid-run the
build queue's leader node is SIGKILLed and 12 s later started again (it rejoins), then another
node is stopped for 8 s (stop_app / start_app). Each fault waits for progress (steps succeeded
since the run began, then since the leader came back), so both land on a fleet at work
whatever the box's speed.

Invariants: nothing lost (every job terminal), exactly one commit per succeeded job (the
audit trigger's primary key), at quiescence the work and tier queues are empty on the
surviving cluster and the outbox has nothing unsent: the fleet reconnected to the surviving
nodes by itself. It prints its counts.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pika
import pytest
from psycopg_pool import ConnectionPool

from actors.amqp import parameters
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
from tests.chaos.figures import figure
from tests.chaos.fleet import await_progress, chaos_seed, count
from tests.chaos.rabbit_cluster import CTL_TIMEOUT_S, ClusterNode, rabbit_cluster
from tests.chaos.test_chaos_rabbitmq import STEPS, unsettled
from tests.chaos.test_chaos_workflows import SCRIPT, answer_for
from tests.commit_audit import COMMIT_AUDIT
from workflows.dispatch import WaitTiers
from workflows.engine import Registry, Status
from workflows.protocol import DEFINITIONS
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import EnqueueRequest

pytestmark = pytest.mark.chaos

CHAINS = int(os.environ.get("VIBEY_CLUSTER_CHAINS", "150"))
WORKERS = 3
LEASE = timedelta(seconds=5)
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))
DEADLINE_S = 420


def enqueue(repo: PostgresJobRepository, seed: int, first: int = 0) -> int:
    """CHAINS chains, numbered from ``first``; returns how many jobs."""
    rng = random.Random(seed if first == 0 else f"{seed}:{first}")
    requests = []
    for chain in range(first, first + CHAINS):
        previous: tuple[uuid.UUID, ...] = ()
        for kind in STEPS:
            job_id = uuid.UUID(int=rng.getrandbits(128), version=4)
            requests.append(
                EnqueueRequest(
                    project_id="cluster",
                    kind=kind,
                    subject=f"chain-{chain}",
                    depends_on=previous,
                    job_id=job_id,
                    max_attempts=10,
                )
            )
            previous = (job_id,)
    repo.enqueue_batch(requests)
    return len(requests)


def leader_of(nodes: list[ClusterNode], queue: str) -> ClusterNode:
    listing = nodes[0].rabbit.ctl("list_queues", "name", "leader", "members", timeout=240)
    for line in listing.splitlines():
        name, _, rest = line.partition("\t")
        if name == queue:
            leader = rest.split("\t")[0]
            assert rest.count("@localhost") == 4, f"{queue} is not on all three nodes: {rest}"
            return next(node for node in nodes if node.name == leader)
    raise AssertionError(f"{queue} not found: {listing}")


def depths(url: str, queues: list[str]) -> dict[str, int]:
    connection = pika.BlockingConnection(parameters(url, timeout=5))
    try:
        channel = connection.channel()
        return {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}
    finally:
        connection.close()


PROGRESS = 5  # steps succeeded before each fault
PROGRESS_WAIT_S = 60.0  # the bound when no step is left to run


def faults(
    nodes: list[ClusterNode],
    queue: str,
    steps_done: Callable[[], int],
    log: list[str],
    done: threading.Event,
    top_up: Callable[[], None],
) -> None:
    """Each fault once the fleet made progress; ``top_up`` gives it more work first when it
    ran out (a node restart can outlast the whole workload), so both land on a fleet at work
    and none waits out ``PROGRESS_WAIT_S``."""
    try:
        top_up()
        at = await_progress(steps_done, PROGRESS, PROGRESS_WAIT_S)
        leader = leader_of(nodes, queue)
        leader.kill()
        log.append(f"killed the leader {leader.name} at {at} steps")
        time.sleep(12)
        leader.start()
        log.append(f"restarted {leader.name}")
        top_up()
        at = await_progress(steps_done, PROGRESS, PROGRESS_WAIT_S)
        other = next(node for node in nodes if node is not leader)
        other.rabbit.ctl("stop_app", timeout=CTL_TIMEOUT_S)
        log.append(f"stopped {other.name} at {at} steps")
        time.sleep(8)
        other.rabbit.ctl("start_app", timeout=CTL_TIMEOUT_S)
        log.append(f"started {other.name}")
    finally:
        done.set()


def steps_done(pool: ConnectionPool) -> Callable[[], int]:
    return lambda: count(pool, "SELECT count(*) FROM job WHERE state = 'succeeded'")


def test_a_fleet_on_a_three_node_cluster_survives_its_nodes_dying(
    pg_url: str, tmp_path: Path
) -> None:
    seed = chaos_seed("rabbitmq cluster")
    with rabbit_cluster(3) as nodes:
        url = ";".join(node.rabbit.url for node in nodes)
        config = WorkerConfig(
            database=DatabaseSettings(url=pg_url),
            bus=BusSettings(amqp_url=url),
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
            tally_dir=str(tmp_path),
        )
        connection = pika.BlockingConnection(parameters(url))
        config.topology().declare(connection.channel(), detect(connection))
        connection.close()
        build_queue = config.names.work_queue("build")
        leader_of(nodes, build_queue)  # replicated on all three before the run
        started = time.monotonic()
        with ConnectionPool(
            pg_url, min_size=1, max_size=4, open=True, kwargs={"autocommit": True}
        ) as pool:
            with pool.connection() as conn:
                conn.execute(COMMIT_AUDIT.encode())
            repo = PostgresJobRepository(pool=pool, leases=config.queue.lease, dispatch=True)
            batches = [enqueue(repo, seed)]

            def top_up() -> None:  # another CHAINS chains when none is left to run
                if not unsettled(pool):
                    batches.append(enqueue(repo, seed, first=CHAINS * len(batches)))

            supervisor = Supervisor(config, processes=WORKERS)
            fleet = threading.Thread(target=supervisor.run, daemon=True)
            fleet.start()
            log: list[str] = []
            faulted = threading.Event()
            threading.Thread(
                target=faults,
                args=(nodes, build_queue, steps_done(pool), log, faulted, top_up),
                daemon=True,
            ).start()
            queues = [config.names.work_queue(lane) for lane in config.worker.lanes]
            queues += [config.names.tier_queue(name) for name in TIERS.names]
            try:
                while (unsettled(pool) or not faulted.is_set()) and (
                    time.monotonic() - started < DEADLINE_S
                ):
                    time.sleep(1.0)
                quiet = time.monotonic()
                while (
                    sum(depths(url, queues).values())
                    or count(pool, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
                ) and time.monotonic() - quiet < 60:
                    time.sleep(0.5)
                left = depths(url, queues)
            finally:
                supervisor.stop()
                fleet.join(timeout=120)
            with pool.connection() as conn:
                states: dict[str, int] = dict(
                    conn.execute("SELECT state::text, count(*) FROM job GROUP BY 1").fetchall()
                )
            commits = count(pool, "SELECT count(*) FROM audit_commit")
            succeeded = count(pool, "SELECT count(*) FROM job WHERE state = 'succeeded'")
            unsent = count(pool, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
            claims = count(pool, "SELECT coalesce(sum(attempts), 0) FROM job")
    total = sum(batches)
    figure(
        f"rabbitmq cluster (seed {seed}): jobs={total} claims={claims} faults={log} "
        f"commits={commits} lost={total - sum(states.values())} double={commits - succeeded} "
        f"states={states} queues={left} unsent={unsent} respawns={supervisor.respawns} "
        f"wall={time.monotonic() - started:.1f}s"
    )
    assert len(log) == 4, f"the faults did not all happen: {log}"
    assert sum(states.values()) == total, "a job was lost"
    assert states == {"succeeded": total}, states
    assert commits == succeeded == total, "a succeeded job without exactly one commit"
    assert sum(left.values()) == 0, f"messages left at quiescence: {left}"
    assert unsent == 0, "outbox rows left unsent"


PROTOCOL_WORKFLOWS = int(os.environ.get("VIBEY_CLUSTER_WORKFLOWS", "8"))


def test_protocol_workflows_on_a_three_node_cluster_survive_its_nodes_dying(
    pg_url: str, tmp_path: Path
) -> None:
    """The same faults under whole protocol workflows (scripted engine, git worktrees, gates
    answered as they open): every workflow completes, each step's result is recorded once,
    every history replays and every ledger verifies, nothing is leased or left unsent."""
    seed = chaos_seed("rabbitmq cluster, protocol workflows", lease=LEASE)
    with rabbit_cluster(3) as nodes:
        url = ";".join(node.rabbit.url for node in nodes)
        config = WorkerConfig(
            database=DatabaseSettings(url=pg_url),
            bus=BusSettings(amqp_url=url),
            queue=QueueSettings(
                lease_seconds=dict.fromkeys(("default", *STEP_KINDS), LEASE.total_seconds()),
                rabbitmq=RabbitMqSettings(
                    wait_tiers_seconds=TIERS.seconds,
                    reconcile_interval_seconds=1,
                    redispatch_after_seconds=8,
                    reclaim_after_seconds=5,
                ),
            ),
            worker=WorkerSettings(threads=2),
            engine=EngineSettings(workspace=str(tmp_path / "work")),
        )
        connection = pika.BlockingConnection(parameters(url))
        config.topology().declare(connection.channel(), detect(connection))
        connection.close()
        build_queue = config.names.work_queue("build")
        leader_of(nodes, build_queue)
        started = time.monotonic()
        with ConnectionPool(
            pg_url, min_size=1, max_size=4, open=True, kwargs={"autocommit": True}
        ) as pool:
            jobs = PostgresJobRepository(pool=pool, leases=config.queue.lease, dispatch=True)
            ledger = Ledger(pool)
            store = WorkflowStore(
                pool=pool, jobs=jobs, registry=Registry(DEFINITIONS), ledger=ledger
            )
            ids: list[uuid.UUID] = []

            def more() -> None:
                for n in range(len(ids), len(ids) + PROTOCOL_WORKFLOWS):
                    start = store.start(
                        f"cl{n:02d}",
                        definition="vibey-protocol",
                        input={"engine": {"name": "scripted", "script": SCRIPT}},
                    )
                    ids.append(start.workflow.id)

            def top_up() -> None:  # more workflows when every one finished
                if all(store.get(i).status.finished for i in list(ids)):
                    more()

            more()
            supervisor = Supervisor(config, processes=WORKERS)
            fleet = threading.Thread(target=supervisor.run, daemon=True)
            fleet.start()
            log: list[str] = []
            faulted = threading.Event()
            threading.Thread(
                target=faults,
                args=(nodes, build_queue, steps_done(pool), log, faulted, top_up),
                daemon=True,
            ).start()
            answered = 0
            try:
                while time.monotonic() - started < DEADLINE_S:
                    for gate, _waited in store.inbox():
                        store.answer(gate.id, answer_for(gate), by="chaos")
                        answered += 1
                    if faulted.is_set() and all(store.get(i).status.finished for i in list(ids)):
                        break
                    time.sleep(0.3)
                quiet = time.monotonic()
                while (
                    count(pool, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
                    and time.monotonic() - quiet < 60
                ):
                    time.sleep(0.5)
            finally:
                supervisor.stop()
                fleet.join(timeout=120)
            workflows = [store.get(i) for i in ids]
            with pool.connection() as conn:
                dupes = conn.execute(
                    "SELECT workflow_id, event->>'step', count(*) FROM workflow_history "
                    "WHERE event->>'type' = 'step_succeeded' GROUP BY 1, 2 HAVING count(*) > 1"
                ).fetchall()
            total = count(pool, "SELECT count(*) FROM job")
            commits = count(
                pool,
                "SELECT count(*) FROM workflow_history WHERE event->>'type' = 'step_succeeded'",
            )
            live = count(pool, "SELECT count(*) FROM job WHERE state IN ('ready', 'leased')")
            unsent = count(pool, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
            claims = count(pool, "SELECT coalesce(sum(attempts), 0) FROM job")
            verified = [store.verify(i) for i in ids]
            ledgers = [ledger.verify(wf.project_id) for wf in workflows]
    unfinished = [w.project_id for w in workflows if w.status is not Status.COMPLETED]
    figure(
        f"rabbitmq cluster, protocol (seed {seed}): workflows={len(ids)} jobs={total} "
        f"claims={claims} faults={log} commits={commits} lost={len(unfinished) + live} "
        f"double={len(dupes)} gates answered={answered} unsent={unsent} "
        f"respawns={supervisor.respawns} wall={time.monotonic() - started:.1f}s"
    )
    assert len(log) == 4, f"the faults did not all happen: {log}"
    assert unfinished == [], [(w.project_id, w.status.value, w.phase) for w in workflows]
    assert dupes == [], f"a step's result recorded more than once: {dupes}"
    assert all(v.ok for v in verified), [v.divergence for v in verified if not v.ok]
    assert all(v.ok for v in ledgers), [v.problem for v in ledgers if not v.ok]
    assert live == 0 and unsent == 0
