"""The event publisher: drains ``domain_event`` rows to the ``vibey.events`` topic exchange.

A row is written in the transaction of the change it reports; this publisher sends it after
that commit (woken by ``NOTIFY vibey_domain_event``, or every ``interval`` regardless), with
publisher confirms, under ``<tenant>.<project>.<event_type>``, its payload by reference when
large (``workflows.events.by_reference``). Rows are locked while they are sent and marked
published only once the broker confirmed them: a publisher that dies mid-batch leaves them for
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
from store.notify import PostgresJobReadyNotifier
from workflows.events import EXCHANGE, VERSION, by_reference, encode

log = logging.getLogger(__name__)

EVENT_CHANNEL = "vibey_domain_event"  # the NOTIFY channel of migrations/0011_events.sql
STOP_POLL_S = 0.1  # how soon the service's thread notices stop() between passes
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
            try:
                for _seq, event in rows:
                    channel.basic_publish(
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
            channel.confirm_delivery()
            declare_exchange(channel, self.exchange)
            self._channel = channel
        return self._channel

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(amqp.AMQPError):  # already going
                connection.close()


class EventService:
    """A thread: publish pending events (``publisher``: none on the postgres backend, where
    the events stay readable in PostgreSQL) and run ``sweep`` every ``interval`` seconds."""

    def __init__(
        self,
        *,
        pg_url: str,
        publisher: EventPublisher | None,
        sweep: Callable[[], Any] | None = None,
        interval: float = 1.0,
    ) -> None:
        self._publisher = publisher
        self._sweep = sweep
        self._interval = interval
        self._notifier = PostgresJobReadyNotifier(url=pg_url, channel=EVENT_CHANNEL)
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
        self._notifier.close()

    def run_once(self) -> None:
        if self._sweep is not None:
            self._sweep()
        if self._publisher is not None:
            self._publisher.publish_pending()
        self.passes += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except (StoreError, amqp.AMQPError) as exc:
                log.warning("events: %s; again in %.1fs", exc, self._interval)
            except Exception:
                log.exception("events: a pass failed; again in %.1fs", self._interval)
            self._wait()

    def _wait(self) -> None:
        """Until a notification, the interval, or stop(): the wait is cut in short slices, so a
        stopping process does not sit out the rest of an interval."""
        deadline = time.monotonic() + self._interval
        while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if self._notifier.wait_for(None, min(left, STOP_POLL_S)):
                return
