"""A project's consumer: buffering, waking, and the drain on stop."""

from __future__ import annotations

import time

import pika

from actors.deliveries import ProjectDeliveries
from tests.amqp_fixtures import Amqp


def declare_queue(amqp: Amqp) -> str:
    name = f"{amqp.prefix}.deliveries"
    amqp.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    return name


def publish(amqp: Amqp, queue: str, n: int) -> None:
    channel = amqp.connect().channel()
    channel.confirm_delivery()
    for i in range(n):
        channel.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))


def ready(amqp: Amqp, queue: str) -> int:
    return int(amqp.connect().channel().queue_declare(queue, passive=True).method.message_count)


def test_wait_wakes_when_a_delivery_is_buffered(amqp: Amqp) -> None:
    queue = declare_queue(amqp)
    deliveries = ProjectDeliveries(url=amqp.url, queues=[queue], prefetch=4)
    deliveries.start()
    try:
        assert deliveries.wait(0.2) is False
        started = time.monotonic()
        publish(amqp, queue, 1)
        assert deliveries.wait(5.0) is True and time.monotonic() - started < 2.0
        taken = deliveries.take()
        assert taken is not None and taken.body == b"m0"
        deliveries.ack(taken)
    finally:
        deliveries.stop()
    assert ready(amqp, queue) == 0


def test_stop_returns_untaken_deliveries_and_the_broker_redelivers_held_ones(amqp: Amqp) -> None:
    queue = declare_queue(amqp)
    publish(amqp, queue, 6)
    deliveries = ProjectDeliveries(url=amqp.url, queues=[queue], prefetch=6)
    deliveries.start()
    deadline = time.monotonic() + 5
    while len(deliveries._buffer) < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    held = deliveries.take()
    acked = deliveries.take()
    assert held is not None and acked is not None
    deliveries.ack(acked)
    deliveries.stop()  # cancels, requeues the 4 untaken, closes (the held one goes back too)
    deadline = time.monotonic() + 5
    while ready(amqp, queue) != 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready(amqp, queue) == 5
