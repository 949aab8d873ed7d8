"""The project routes on a real PostgreSQL (and the relay on a real RabbitMQ): written once,
read by every publisher, followed through NOTIFY; and the pointer fields the outbox carries."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pika
import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.relay import Relay, Router
from actors.topology import Topology
from store.dispatch import DispatchRecords
from store.jobs import PostgresJobRepository
from store.routes import RouteCache, dedicate, list_routes, read_routes, undedicate
from tests.amqp_fixtures import Amqp
from workflows.dispatch import WaitTiers, decode
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import EnqueueRequest

TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))


@pytest.fixture
def pool(pg_url: str) -> Iterator[ConnectionPool]:
    with ConnectionPool(
        pg_url, min_size=1, max_size=4, open=True, kwargs={"autocommit": True}
    ) as p:
        yield p


def test_dedicate_is_idempotent_and_undedicate_undoes_it(pool: ConnectionPool) -> None:
    assert dedicate(pool, "acme", by="test") is True
    assert dedicate(pool, "acme", by="again") is False
    (route,) = list_routes(pool)
    assert (route.project_id, route.dedicated_by) == ("acme", "test")
    assert "acme" in read_routes(pool)
    assert undedicate(pool, "acme") is True
    assert undedicate(pool, "acme") is False
    assert "acme" not in read_routes(pool)


def test_the_cache_follows_a_change_made_by_another_process(
    pool: ConnectionPool, pg_url: str
) -> None:
    cache = RouteCache(url=pg_url, pool=pool, refresh=timedelta(hours=1)).start()
    try:
        assert "acme" not in cache
        reads = cache.reads
        with ConnectionPool(pg_url, min_size=1, max_size=1, open=True) as other:
            dedicate(other, "acme", by="elsewhere")
            assert cache.wait_for(["acme"], timeout=5), "the NOTIFY did not refresh the cache"
            undedicate(other, "acme")
            assert cache.wait_for(["acme"], present=False, timeout=5)
        assert cache.reads > reads  # re-read on notification, not on the hourly backstop
    finally:
        cache.stop()


def test_dedicating_resends_the_projects_claimable_pointers(pool: ConnectionPool) -> None:
    repo = PostgresJobRepository(pool=pool, dispatch=True)
    job = repo.enqueue(EnqueueRequest(project_id="acme", kind="design.spec")).job
    with pool.connection() as conn:
        conn.execute("UPDATE job_outbox SET sent_at = now()")
    assert dedicate(pool, "acme", by="test")
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT job_id, dispatch_seq, key FROM job_outbox WHERE sent_at IS NULL"
        ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [(job.id, 1)] and ":route:" in rows[0][2]


def test_outbox_rows_carry_the_jobs_priority(pool: ConnectionPool) -> None:
    repo = PostgresJobRepository(pool=pool, dispatch=True)
    job = repo.enqueue(EnqueueRequest(project_id="acme", kind="design.spec", priority=7)).job
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT priority, workflow_id FROM job_outbox WHERE job_id = %s", (job.id,)
        ).fetchone()
    assert row == (7, None)


def test_the_relay_routes_by_the_table_and_sets_the_correlation_id(
    pool: ConnectionPool, pg_url: str, amqp: Amqp
) -> None:
    connection = amqp.connect()
    topology = Topology(
        amqp.names,
        dict(zip(TIERS.names, TIERS.tiers, strict=True)),
        ("interactive", "build"),
        dedicated_projects=("acme",),
    )
    topology.declare(amqp.channel(connection), detect(connection))
    cache = RouteCache(url=pg_url, pool=pool).start()
    records = DispatchRecords(pool=pool, relay_id="routes-test")
    relay = Relay(
        url=amqp.url,
        records=records,
        router=Router(names=amqp.names, tiers=TIERS, dedicated=cache, kinds=STEP_KINDS),
    )
    relay.start()
    repo = PostgresJobRepository(
        pool=pool, dispatch=True, relay_id="routes-test", after_commit=relay.submit
    )
    try:
        shared = repo.enqueue(EnqueueRequest(project_id="acme", kind="design.spec")).job
        dedicate(pool, "acme", by="test")
        assert cache.wait_for(["acme"], timeout=5)
        with pool.connection() as conn:  # the resend of the first pointer: not under test here
            conn.execute("DELETE FROM job_outbox WHERE key LIKE '%%:route:%%'")
        mine = repo.enqueue(EnqueueRequest(project_id="acme", kind="design.verify")).job
        assert relay.flush(timeout=10)
    finally:
        relay.stop()
        cache.stop()
    channel = connection.channel()
    got: dict[str, list[tuple[str, pika.BasicProperties]]] = {}
    for queue in (
        amqp.names.work_queue("interactive"),
        topology.names.work_queue("interactive", "acme"),
    ):
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            got.setdefault(queue, []).append((str(decode(body).job_id), properties))
    shared_q, dedicated_q = (
        amqp.names.work_queue("interactive"),
        amqp.names.work_queue("interactive", "acme"),
    )
    assert [j for j, _ in got[shared_q]] == [str(shared.id)]
    assert [j for j, _ in got[dedicated_q]] == [str(mine.id)]
    ((_, properties),) = got[dedicated_q]
    assert properties.correlation_id == str(mine.id)  # a plain job: no workflow
    assert properties.priority is None  # quorum queues on 3.x ignore priorities: none sent
    assert relay.priorities.honoured is False
