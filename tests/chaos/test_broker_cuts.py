"""Broker connections cut and stalled mid-run, through a TCP proxy between the fleet and
RabbitMQ: every worker's consumers, publishers, relay and reconciler go through it.

Mid-run the proxy resets every connection, later holds every byte for 8 s (a network that
hangs rather than fails), then resets every connection again. Each fault waits for progress
(a share of the jobs succeeded since the one before), so all three land while work is left,
whatever the box's speed, and each one after the first needs the fleet to have come back. The
fleet must reconnect on its own. Invariants: nothing lost (every job succeeded), exactly one
commit per job (the audit trigger's primary key), at quiescence the work and tier queues are
empty and the outbox has nothing unsent. It prints its counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

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
from tests.chaos.fleet import chaos_seed, count, queue_depths
from tests.chaos.tcp_proxy import TcpProxy, tcp_proxy
from tests.chaos.test_chaos_rabbitmq import unsettled
from tests.chaos.test_rabbitmq_cluster import TIERS, enqueue
from tests.commit_audit import COMMIT_AUDIT

pytestmark = pytest.mark.chaos

WORKERS = 3
DEADLINE_S = 300


def through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    creds = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{creds}127.0.0.1:{port}"))


def faults(
    proxy: TcpProxy,
    succeeded: Callable[[], int],
    total: int,
    log: list[str],
    done: threading.Event,
) -> None:
    """Each fault once a further share of the jobs succeeded: 10%, 40%, 70% (events, not a
    clock), so every one lands mid-run and the second and third after the fleet recovered."""
    try:
        for share, fault in ((0.1, "cut"), (0.4, "stall"), (0.7, "cut")):
            deadline = time.monotonic() + DEADLINE_S
            while succeeded() < share * total and time.monotonic() < deadline:
                time.sleep(0.1)
            if fault == "cut":
                log.append(f"cut {proxy.cut()} connections at {succeeded()}/{total}")
            else:
                at = succeeded()
                proxy.stall(8)
                log.append(f"stalled 8 s at {at}/{total}")
    finally:
        done.set()


def test_cut_and_stalled_broker_connections_lose_nothing(
    pg_url: str, amqp: Amqp, tmp_path: Path
) -> None:
    seed = chaos_seed("broker cuts")
    target = urlsplit(amqp.url)
    with tcp_proxy(
        listen_port=0, target=(target.hostname or "127.0.0.1", target.port or 5672)
    ) as proxy:
        config = WorkerConfig(
            database=DatabaseSettings(url=pg_url),
            bus=BusSettings(amqp_url=through(amqp.url, proxy.port), prefix=amqp.prefix),
            queue=QueueSettings(
                lease_seconds={"default": 5},
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
        connection = amqp.connect()
        config.topology().declare(amqp.channel(connection), detect(connection))
        connection.close()
        started = time.monotonic()
        with ConnectionPool(
            pg_url, min_size=1, max_size=4, open=True, kwargs={"autocommit": True}
        ) as pool:
            with pool.connection() as conn:
                conn.execute(COMMIT_AUDIT.encode())
            repo = PostgresJobRepository(pool=pool, leases=config.queue.lease, dispatch=True)
            total = enqueue(repo, seed)
            supervisor = Supervisor(config, processes=WORKERS)
            fleet = threading.Thread(target=supervisor.run, daemon=True)
            fleet.start()
            log: list[str] = []
            faulted = threading.Event()

            def done_jobs() -> int:
                return count(pool, "SELECT count(*) FROM job WHERE state = 'succeeded'")

            threading.Thread(
                target=faults, args=(proxy, done_jobs, total, log, faulted), daemon=True
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
                    sum(queue_depths(amqp, queues).values())
                    or count(pool, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL")
                ) and time.monotonic() - quiet < 60:
                    time.sleep(0.5)
                left = queue_depths(amqp, queues)
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
        accepted = proxy.accepted
    figure(
        f"broker cuts (seed {seed}): jobs={total} claims={claims} faults={log} "
        f"connections accepted={accepted} commits={commits} "
        f"lost={total - sum(states.values())} double={commits - succeeded} states={states} "
        f"queues={left} unsent={unsent} wall={time.monotonic() - started:.1f}s"
    )
    assert len(log) == 3, f"the faults did not all happen: {log}"
    assert accepted > WORKERS * 2, "the fleet never reconnected through the proxy"
    assert states == {"succeeded": total}, states
    assert commits == succeeded == total, "a succeeded job without exactly one commit"
    assert sum(left.values()) == 0, f"messages left at quiescence: {left}"
    assert unsent == 0, "outbox rows left unsent"
