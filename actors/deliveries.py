"""A project's deliveries: a consumer on its dedicated lane queues, buffering pointers.

A delivery stays unacknowledged while its job is claimed (the broker's lease is the held
delivery; PostgreSQL's lease decides every commit) and is acknowledged once the settle
committed, whether or not the settle applied. The pika connection lives in its own thread;
other threads ack, reject and publish through ``add_callback_threadsafe``. A reconnect starts
a new epoch: deliveries from an older channel are forgotten (the broker redelivers them), and
acks for them are skipped.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions

from actors.amqp import parameters

log = logging.getLogger(__name__)

REASON_HEADER = "x-vibey-reason"
DETAIL_HEADER = "x-vibey-detail"


@dataclass(frozen=True, slots=True)
class Delivery:
    tag: int
    epoch: int
    body: bytes
    routing_key: str
    redelivered: bool


class ProjectDeliveries:
    """Consumes ``queues`` with ``prefetch`` and buffers what arrives. ``start()`` first."""

    def __init__(self, *, url: str, queues: Sequence[str], prefetch: int) -> None:
        self._params = parameters(url)  # one per node: tried in order
        self._queues = tuple(queues)
        self._prefetch = prefetch
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._arrived = threading.Condition()
        self._stopping = threading.Event()
        self._connected = threading.Event()
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._epoch = 0
        self._thread = threading.Thread(target=self._run, name="deliveries", daemon=True)

    def start(self, *, timeout: float = 10.0) -> None:
        self._thread.start()
        if not self._connected.wait(timeout):
            raise TimeoutError(f"could not consume {self._queues} within {timeout}s")

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop consuming; buffered deliveries not taken go back to the queue (requeue)."""
        self._stopping.set()
        self._thread.join(timeout=timeout)

    # -- taking and settling ---------------------------------------------------------------

    def take(self, timeout: float = 0.0) -> Delivery | None:
        """The next buffered delivery, waiting up to ``timeout`` seconds for one."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._arrived.wait(remaining):
                    return None
            return self._buffer.popleft()

    def put_back(self, deliveries: Sequence[Delivery]) -> None:
        """Return untaken deliveries to the front of the buffer, in order."""
        with self._arrived:
            self._buffer.extendleft(reversed(deliveries))

    def wait(self, timeout: float) -> bool:
        """True as soon as a delivery is buffered (or already is)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._arrived.wait(remaining):
                    return False
            return True

    def ack(self, delivery: Delivery) -> None:
        self._call(delivery, lambda channel: channel.basic_ack(delivery.tag))

    def reject(self, delivery: Delivery, *, reason: str, detail: str, dead_exchange: str) -> None:
        """Dead-letter with a reason: republish to the dead-letter exchange with the reason in
        the headers, then ack (a plain reject would carry no reason)."""
        headers = {REASON_HEADER: reason, DETAIL_HEADER: detail[:500]}

        def dead_letter(channel: Any) -> None:
            properties = pika.BasicProperties(delivery_mode=2, headers=headers)
            channel.basic_publish(dead_exchange, delivery.routing_key, delivery.body, properties)
            channel.basic_ack(delivery.tag)

        self._call(delivery, dead_letter)

    def republish(self, delivery: Delivery, *, exchange: str, body: bytes, **props: Any) -> None:
        """Publish a copy (to a wait tier, say), then ack the original, on this channel."""

        def hop(channel: Any) -> None:
            properties = pika.BasicProperties(delivery_mode=2, **props)
            channel.basic_publish(exchange, delivery.routing_key, body, properties)
            channel.basic_ack(delivery.tag)

        self._call(delivery, hop)

    def _call(self, delivery: Delivery, action: Callable[[Any], None]) -> None:
        connection, epoch = self._connection, self._epoch
        if connection is None or delivery.epoch != epoch:
            return  # its channel is gone: the broker has requeued it already

        def run() -> None:
            if self._epoch == delivery.epoch and self._channel is not None:
                action(self._channel)

        try:
            connection.add_callback_threadsafe(run)
        except pika.exceptions.AMQPError:
            log.warning("deliveries: connection closed before settling tag %s", delivery.tag)

    # -- the consumer thread ---------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._consume()
            except pika.exceptions.AMQPError as exc:
                log.warning("deliveries: consumer on %s lost its connection: %s", self._queues, exc)
                time.sleep(0.5)
            finally:
                with self._arrived:
                    self._buffer.clear()  # tags of a dead channel are void

    def _consume(self) -> None:
        connection = pika.BlockingConnection(self._params)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self._prefetch)
            self._epoch += 1
            epoch = self._epoch
            for queue in self._queues:
                channel.basic_consume(queue, self._receiver(epoch))
            self._connection, self._channel = connection, channel
            self._connected.set()
            while not self._stopping.is_set():
                connection.process_data_events(time_limit=0.05)
            connection.process_data_events(time_limit=0)  # acks queued before the stop
            self._return_buffered(channel)
        finally:
            self._channel = None
            if connection.is_open:
                connection.close()

    def _receiver(self, epoch: int) -> Callable[..., None]:
        def on_message(_channel: Any, method: Any, _properties: Any, body: bytes) -> None:
            delivery = Delivery(
                method.delivery_tag, epoch, body, method.routing_key, method.redelivered
            )
            with self._arrived:
                self._buffer.append(delivery)
                self._arrived.notify_all()

        return on_message

    def _return_buffered(self, channel: Any) -> None:
        """On stop: cancel, then give back every buffered delivery nobody took."""
        for tag in list(channel.consumer_tags):
            channel.basic_cancel(tag)
        with self._arrived:
            untaken, self._buffer = list(self._buffer), collections.deque()
        for delivery in untaken:
            channel.basic_nack(delivery.tag, requeue=True)
