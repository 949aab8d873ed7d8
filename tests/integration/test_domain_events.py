"""Domain events on real PostgreSQL and RabbitMQ: published once confirmed, under their routing
key and tenant; the example consumer applies each once however often it is delivered, loses
nothing when killed mid-effect, and dead-letters malformed messages with the reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika.exceptions
import pytest
from psycopg_pool import ConnectionPool

from actors.event_consumer import EventConsumer
from actors.event_publisher import EventPublisher, EventService, declare_exchange
from examples import event_tally
from store.event_inbox import EventInbox
from store.events import EventLog
from store.gate_deadlines import GateDeadlines
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.workflows import WorkflowStore
from tests.amqp_fixtures import Amqp
from tests.deadline_definition import Deadlined
from workflows.engine import Registry, Status
from workflows.events import INLINE_LIMIT, Draft, EventType, binding_key, decode, encode, to_json

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def exchange(amqp: Amqp) -> str:
    name = f"{amqp.prefix}.events"
    amqp.exchanges.add(name)
    return name


@pytest.fixture
def store(pool: ConnectionPool) -> WorkflowStore:
    registry = Registry([Deadlined(deadline=None)])
    return WorkflowStore(pool=pool, jobs=PostgresJobRepository(pool=pool), registry=registry)


@pytest.fixture
def publisher(pool: ConnectionPool, amqp: Amqp, exchange: str) -> Iterator[EventPublisher]:
    published = EventPublisher(url=amqp.url, events=EventLog(pool=pool), exchange=exchange)
    yield published
    published.close()


def probe(amqp: Amqp, exchange: str, key: str) -> tuple[Any, str]:
    channel = amqp.channel()
    declare_exchange(channel, exchange)
    queue = f"{amqp.prefix}.probe"
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, routing_key=key)
    return channel, queue


def drain(channel: Any, queue: str) -> list[tuple[Any, Any, bytes]]:
    got: list[tuple[Any, Any, bytes]] = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((method, properties, body))


def running(consumer: EventConsumer, done: Callable[[], bool], timeout: float = 30) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not done():
            assert time.monotonic() < deadline, "the consumer did not finish"
            assert thread.is_alive(), "the consumer died"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(10)


def count(pool: ConnectionPool, query: str) -> int:
    with pool.connection() as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_events_are_published_once_confirmed_under_tenant_project_and_type(
    pool: ConnectionPool, amqp: Amqp, exchange: str, store: WorkflowStore, publisher: EventPublisher
) -> None:
    channel, queue = probe(amqp, exchange, binding_key(event_type="gate"))
    EventLog(pool=pool).set_tenant("acme-shop", "acme")
    store.start("shop", definition="deadlined")
    store.start("acme-shop", definition="deadlined")
    assert count(pool, "SELECT count(*) FROM domain_event WHERE published_at IS NULL") == 4
    assert publisher.publish_pending() == 4
    assert publisher.publish_pending() == 0
    got = drain(channel, queue)
    assert sorted(m.routing_key for m, _, _ in got) == [
        "acme.acme-shop.gate.opened",
        "default.shop.gate.opened",
    ]
    for method, properties, body in got:
        event = decode(body)
        assert event.event_type is EventType.GATE_OPENED and event.routing_key == method.routing_key
        assert properties.message_id == str(event.event_id) and event.payload["gate"] == "approve"
        assert event.correlation_id is not None
    assert count(pool, "SELECT count(*) FROM domain_event WHERE published_at IS NULL") == 0


def test_duplicated_and_redelivered_events_have_one_effect_and_malformed_ones_are_dead_lettered(
    pool: ConnectionPool, amqp: Amqp, exchange: str, store: WorkflowStore, publisher: EventPublisher
) -> None:
    queue = f"{amqp.prefix}.tally"
    amqp.queues.add(queue)
    tally = event_tally.consumer(amqp_url=amqp.url, pool=pool, queue=queue, exchange=exchange)
    channel = amqp.channel()
    tally.declare(channel)
    for n in range(3):
        store.start(f"p{n}", definition="deadlined")
    events = publisher.publish_pending()
    with pool.connection() as conn:  # a publisher that died before marking: all sent again
        conn.execute("UPDATE domain_event SET published_at = NULL")
    assert publisher.publish_pending() == events
    (_, first), *_ = EventLog(pool=pool).recent(newest=False)
    wire = encode(first)
    for _ in range(2):  # and a third and fourth copy of one
        channel.basic_publish(exchange, first.routing_key, wire)
    bad_version = json.dumps(to_json(first) | {"version": 2}).encode()
    missing = json.dumps({k: v for k, v in to_json(first).items() if k != "tenant_id"}).encode()
    for body in (b"not json", bad_version, missing):
        channel.basic_publish(exchange, first.routing_key, body)
    total = 2 * events + 2 + 3
    running(tally, lambda: tally.applied + tally.duplicates + tally.dead == total)
    assert (tally.applied, tally.duplicates, tally.dead) == (events, events + 2, 3)
    assert count(pool, "SELECT count(*) FROM example_event_tally") == events
    assert count(pool, "SELECT count(DISTINCT event_id) FROM example_event_tally") == events
    with pool.connection() as conn:
        dead = conn.execute(
            "SELECT reason, detail FROM dead_letter WHERE queue = %s ORDER BY id", (queue,)
        ).fetchall()
    assert [r for r, _ in dead] == ["malformed_event"] * 3
    assert "not JSON" in dead[0][1] and "version 2" in dead[1][1] and "tenant_id" in dead[2][1]


def test_a_consumer_killed_mid_effect_loses_nothing(
    pool: ConnectionPool,
    pg_url: str,
    amqp: Amqp,
    exchange: str,
    store: WorkflowStore,
    publisher: EventPublisher,
) -> None:
    queue = f"{amqp.prefix}.tally"
    amqp.queues.add(queue)
    tally = event_tally.consumer(amqp_url=amqp.url, pool=pool, queue=queue, exchange=exchange)
    tally.declare(amqp.channel())
    for n in range(3):
        store.start(f"k{n}", definition="deadlined")
    events = publisher.publish_pending()
    argv = [sys.executable, "-m", "examples.event_tally", "--pg", pg_url, "--amqp", amqp.url]
    argv += ["--queue", queue, "--exchange", exchange, "--pause", "60"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline() for _ in range(2)]
        assert lines[0].strip() == "ready" and lines[1].startswith("handling "), lines
        child.send_signal(signal.SIGKILL)  # inside the effect's transaction
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    running(tally, lambda: tally.applied + tally.duplicates == events)
    assert (tally.applied, tally.duplicates) == (events, 0)
    assert count(pool, "SELECT count(*) FROM example_event_tally") == events
    assert count(pool, "SELECT count(DISTINCT event_id) FROM example_event_tally") == events


def test_a_large_payload_travels_by_reference_and_arrives_whole(
    pool: ConnectionPool, amqp: Amqp, exchange: str, publisher: EventPublisher
) -> None:
    channel, queue = probe(amqp, exchange, binding_key(project="big"))
    payload = {"step": "s", "result": {"text": "x" * (INLINE_LIMIT * 2)}}
    (event_id,) = EventLog(pool=pool).emit("big", [Draft(EventType.STEP_SETTLED, payload)])
    assert publisher.publish_pending() == 1
    ((_, _, body),) = drain(channel, queue)
    assert len(body) < INLINE_LIMIT
    travelled = decode(body)
    assert travelled.payload == {} and travelled.payload_ref is not None
    channel.basic_publish(exchange, travelled.routing_key, body)
    seen: list[Any] = []
    consumer = EventConsumer(
        url=amqp.url,
        inbox=EventInbox(pool=pool, consumer="big"),
        queue=queue,
        bindings=[binding_key(project="big")],
        effect=lambda _conn, event: seen.append(event.payload),
        exchange=exchange,
    )
    running(consumer, lambda: bool(seen))
    assert seen == [payload] and travelled.event_id == event_id


def test_the_event_service_expires_a_two_second_gate_and_publishes_what_happened(
    pool: ConnectionPool, pg_url: str, amqp: Amqp, exchange: str
) -> None:
    channel, queue = probe(amqp, exchange, binding_key(project="timed"))
    registry = Registry([Deadlined(deadline=timedelta(seconds=2))])
    store = WorkflowStore(
        pool=pool, jobs=PostgresJobRepository(pool=pool), registry=registry, ledger=Ledger(pool)
    )
    events = EventLog(pool=pool)
    publisher = EventPublisher(url=amqp.url, events=events, exchange=exchange)
    service = EventService(
        publisher=publisher,
        sweep=GateDeadlines(pool=pool, workflows=store).sweep,
        interval=0.2,
    )
    service.start()
    try:
        started = store.start("timed", definition="deadlined").workflow
        began = time.monotonic()
        while store.get(started.id).status is Status.RUNNING:
            assert time.monotonic() - began < 10, "the deadline never fired"
            time.sleep(0.1)
        assert store.get(started.id).status is Status.COMPLETED
        types: list[str] = []
        while "workflow.completed" not in types:
            assert time.monotonic() - began < 15, types
            types += [decode(body).event_type.value for _, _, body in drain(channel, queue)]
            time.sleep(0.05)
    finally:
        service.stop()
    assert types == [
        "workflow.started",
        "gate.opened",
        "gate.expired",
        "gate.answered",
        "workflow.completed",
    ]


def test_a_transient_consumer_sees_what_follows_and_leaves_no_queue(
    pool: ConnectionPool, amqp: Amqp, exchange: str, store: WorkflowStore, publisher: EventPublisher
) -> None:
    queue = f"{amqp.prefix}.live"
    seen: list[str] = []
    live = EventConsumer(
        url=amqp.url,
        inbox=EventInbox(pool=pool, consumer=queue),
        queue=queue,
        bindings=[binding_key(project="live", event_type="gate")],
        effect=lambda _conn, event: seen.append(event.event_type.value),
        exchange=exchange,
        transient=True,
    )
    stop = threading.Event()
    thread = threading.Thread(target=live.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while queue_state(amqp, queue) != "exclusive":  # declared by the live consumer
        assert time.monotonic() < deadline
        time.sleep(0.05)
    store.start("live", definition="deadlined")
    publisher.publish_pending()
    try:
        deadline = time.monotonic() + 10
        while seen != ["gate.opened"]:
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(10)
    assert queue_state(amqp, queue) == "absent"


def queue_state(amqp: Amqp, queue: str) -> str:
    """``absent``, ``exclusive`` (another connection's) or ``shared``, by a passive declare."""
    connection = amqp.connect()
    try:
        connection.channel().queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return {404: "absent", 405: "exclusive"}[exc.reply_code]
    return "shared"
