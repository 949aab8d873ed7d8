"""The event publisher: drains ``domain_event`` rows to the ``vibey.events`` topic exchange.

A row is written in the transaction of the change it reports; this publisher sends it after
that commit (it looks every ``publish_every`` seconds, a tenth of a second by default), a batch
in one AMQP transaction, under ``<tenant>.<project>.<event_type>``, its payload by reference
when large (``workflows.events.by_reference``). Rows are locked while they are sent and marked
published only once the broker committed them: a publisher that dies mid-batch leaves them for
the next, so an event may reach the broker twice (consumers dedupe by ``event_id``), never
zero times. Several publishers at once skip each other's rows.

:class:`EventService` is the thread a worker or the reconciler runs: publish, then sweep the
gate deadlines and reminders (``store.gate_deadlines``), every ``interval``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from actors import amqp
from store.errors import StoreError
from store.events import EventLog
from workflows.events import EXCHANGE, VERSION, by_reference, encode

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 0.1  # how often the publisher looks for events to send
VERSION_HEADER = "x-vibey-event-version"


def declare_exchange(channel: Any, exchange: str = EXCHANGE) -> None:
    channel.exchange_declare(exchange, exchange_type="topic", durable=True)


class EventPublisher:
    def __init__(
        self, *, url: str, events: EventLog, exchange: str = EXCHANGE, batch: int = 200
    ) -> None:
        self._url = url
        self._events = events
        self.exchange = exchange
        self._batch = batch
        self._connection: amqp.BlockingConnection | None = None
        self._channel: Any = None
        self.published = 0

    def publish_pending(self) -> int:
        """Publish every unpublished event (batch by batch); returns how many were sent."""
        total = 0
        while True:
            sent = self._publish_batch()
            total += sent
            if sent < self._batch:
                return total

    def _publish_batch(self) -> int:
        with self._events.publish_batch(limit=self._batch) as (rows, mark):
            if not rows:
                return 0
            channel = self._open()
            # pika's own channel under the blocking one: its publish queues the frames, where
            # the blocking channel's flushes the socket at every message; the batch's
            # tx_commit flushes them all and waits for the broker's answer.
            queue = channel._impl
            try:
                for _seq, event in rows:
                    queue.basic_publish(
                        self.exchange,
                        event.routing_key,
                        encode(by_reference(event)),
                        amqp.BasicProperties(
                            content_type="application/json",
                            delivery_mode=2,
                            message_id=str(event.event_id),
                            type=event.event_type.value,
                            headers={VERSION_HEADER: VERSION},
                        ),
                    )
                channel.tx_commit()  # the batch's one round trip: the broker holds them all
            except amqp.AMQPError:
                self.close()  # nothing is marked: the rows wait for the next pass
                raise
            mark([seq for seq, _ in rows])
        self.published += len(rows)
        return len(rows)

    def _open(self) -> Any:
        if self._channel is None or not self._channel.is_open:
            self.close()
            self._connection = amqp.connect(self._url)
            channel = self._connection.channel()
            # A transaction per batch, not a confirm per message: pika's blocking channel in
            # confirm mode waits for each message's confirm before it sends the next.
            channel.tx_select()
            declare_exchange(channel, self.exchange)
            self._channel = channel
        return self._channel

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(amqp.AMQPError):  # already going
                connection.close()


class EventService:
    """A thread: publish pending events every ``publish_every`` seconds (``publisher``: none
    on the postgres backend, where the events stay readable in PostgreSQL) and run ``sweep``
    every ``interval`` seconds.

    It polls: nothing notifies it of a commit that wrote events (a ``NOTIFY`` at every such
    commit serialised the commits of concurrent steps behind PostgreSQL's notification
    lock; migrations/0018). A pass finds nothing at the cost of one indexed read, and under
    load a pass sends what many commits wrote."""

    def __init__(
        self,
        *,
        publisher: EventPublisher | None,
        sweep: Callable[[], Any] | None = None,
        interval: float = 1.0,
        publish_every: float = PUBLISH_EVERY_S,
    ) -> None:
        self._publisher = publisher
        self._sweep = sweep
        self._interval = interval
        self._publish_every = min(publish_every, interval)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="vibey-events", daemon=True)
        self._thread.start()

    def stop(self, *, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._publisher is not None:
            self._publisher.close()

    def run_once(self) -> None:
        if self._sweep is not None:
            self._sweep()
        if self._publisher is not None:
            self._publisher.publish_pending()
        self.passes += 1

    def _run(self) -> None:
        pause = self._interval if self._publisher is None else self._publish_every
        swept = -self._interval
        while not self._stop.is_set():
            try:
                if time.monotonic() - swept >= self._interval:
                    swept = time.monotonic()
                    self.run_once()
                elif self._publisher is not None:
                    self._publisher.publish_pending()
            except (StoreError, amqp.AMQPError) as exc:
                log.warning("events: %s; again in %.1fs", exc, self._interval)
            except Exception:
                log.exception("events: a pass failed; again in %.1fs", self._interval)
            if self._stop.wait(pause):
                return
