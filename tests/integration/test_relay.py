"""The outbox relay against real PostgreSQL and RabbitMQ: marked sent only after a routed
confirm, routed through a wait tier when not due, drained when nobody holds a row."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pika
import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.relay import Relay, Router
from actors.topology import Topology
from store.dispatch import DispatchRecords
from store.jobs import PostgresJobRepository
from tests.amqp_fixtures import Amqp
from workflows.dispatch import WaitTiers, decode
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import EnqueueRequest

P = "proj"
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))


@pytest.fixture
def pool(pg_url: str) -> Iterator[ConnectionPool]:
    with ConnectionPool(
        pg_url, min_size=2, max_size=8, open=True, kwargs={"autocommit": True}
    ) as p:
        yield p


def declare(amqp: Amqp, lanes: tuple[str, ...] = ("interactive", "build")) -> None:
    connection = amqp.connect()
    topology = Topology(
        amqp.names, {name: tier for name, tier in zip(TIERS.names, TIERS.tiers, strict=True)}, lanes
    )
    topology.declare(amqp.channel(connection), detect(connection))


@pytest.fixture
def relay(amqp: Amqp, pool: ConnectionPool) -> Iterator[Relay]:
    records = DispatchRecords(pool=pool, relay_id="relay-test")
    relay = Relay(
        url=amqp.url,
        records=records,
        router=Router(names=amqp.names, tiers=TIERS, kinds=STEP_KINDS),
    )
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()


def repo_for(pool: ConnectionPool, relay: Relay | None) -> PostgresJobRepository:
    return PostgresJobRepository(
        pool=pool,
        dispatch=True,
        relay_id="relay-test" if relay else None,
        after_commit=relay.submit if relay else None,
    )


def get(amqp: Amqp, queue: str) -> list[tuple[pika.spec.Basic.GetOk, pika.BasicProperties, bytes]]:
    channel = amqp.connect().channel()
    messages: list[Any] = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return messages
        messages.append((method, properties, body))


def unsent(pool: ConnectionPool) -> list[tuple]:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT id, claimed_by FROM job_outbox WHERE sent_at IS NULL"
        ).fetchall()


def test_a_committed_pointer_is_published_and_marked_after_its_confirm(amqp, pool, relay) -> None:
    declare(amqp)
    job = repo_for(pool, relay).enqueue(EnqueueRequest(project_id=P, kind="design.spec")).job
    assert relay.flush(timeout=10)
    (message,) = get(amqp, amqp.names.work_queue("interactive"))
    method, properties, body = message
    envelope = decode(body)
    assert (envelope.job_id, envelope.dispatch_seq, envelope.kind) == (job.id, 1, "design.spec")
    assert properties.message_id == f"{job.id}:1" and properties.delivery_mode == 2
    assert method.routing_key == f"shared.interactive.{P}"
    assert unsent(pool) == []
    with pool.connection() as conn:
        row = conn.execute("SELECT dispatched_at FROM job WHERE id = %s", (job.id,)).fetchone()
    assert row is not None and row[0] is not None


def test_a_pointer_not_yet_due_waits_in_a_tier_and_arrives_in_its_work_queue(
    amqp, pool, relay
) -> None:
    declare(amqp)
    repo_for(pool, relay).enqueue(
        EnqueueRequest(project_id=P, kind="build.implement", delay=timedelta(seconds=1.5))
    )
    assert relay.flush(timeout=10)
    started = time.monotonic()
    work = amqp.names.work_queue("build")
    assert get(amqp, work) == []
    arrived: list = []
    while not arrived and time.monotonic() - started < 5:
        time.sleep(0.05)
        arrived = get(amqp, work)
    waited = time.monotonic() - started
    assert len(arrived) == 1 and 0.7 < waited < 3.0
    assert arrived[0][0].routing_key == f"shared.build.{P}"  # kept through the dead-letter hop


def test_an_unroutable_pointer_is_never_marked_sent(amqp, pool, relay) -> None:
    declare(amqp, lanes=("interactive",))  # no queue takes the build lane
    repo_for(pool, relay).enqueue(EnqueueRequest(project_id=P, kind="build.verify"))
    assert relay.flush(timeout=10)
    assert relay.returned == 1 and relay.published == 0
    (row,) = unsent(pool)
    assert row[1] is None  # given back for the next drain


def test_drain_publishes_rows_nobody_holds_and_reclaims_a_dead_relays(amqp, pool, relay) -> None:
    declare(amqp)
    unclaimed = repo_for(pool, None)
    dead = PostgresJobRepository(pool=pool, dispatch=True, relay_id="relay-dead")
    unclaimed.enqueue(EnqueueRequest(project_id=P, kind="design.spec", subject="a"))
    dead.enqueue(EnqueueRequest(project_id=P, kind="design.spec", subject="b"))
    assert relay.drain(reclaim_after=timedelta(minutes=5)) == 1
    assert relay.flush(timeout=10)  # "a" is sent before a zero reclaim window could take it
    time.sleep(0.05)
    assert relay.drain(reclaim_after=timedelta(0)) == 1
    assert relay.flush(timeout=10)
    assert unsent(pool) == []
    assert len(get(amqp, amqp.names.work_queue("interactive"))) == 2


def test_confirms_are_pipelined(amqp, pool, relay) -> None:
    declare(amqp)
    repo = repo_for(pool, relay)
    started = time.perf_counter()
    for offset in range(0, 1000, 100):
        repo.enqueue_batch(
            [
                EnqueueRequest(project_id=P, kind="design.spec", subject=f"s{i}")
                for i in range(offset, offset + 100)
            ]
        )
    assert relay.flush(timeout=30)
    elapsed = time.perf_counter() - started
    assert relay.published == 1000 and unsent(pool) == []
    print(f"relay: 1000 pointers committed, published and confirmed in {elapsed:.2f}s")
