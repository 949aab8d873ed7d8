"""A live view of the domain events: a thread that tells a callback about each event on the
``vibey.events`` exchange, for a screen that shows what PostgreSQL holds (the web console).

::

    watch = EventWatch(url=amqp_url, exchange="vibey.events")
    watch.start(on_event=print, on_state=lambda up: print("live" if up else "away"))
    ...
    watch.stop()

It consumes (``actors.event_consumer.consume``) an exclusive, auto-deleted queue the broker
names (``declare_queue(..., queue="", transient=True)``), bound with ``bindings`` (``#``:
every event), without acks: a view that missed an event reads PostgreSQL again, so nothing is
deduplicated or dead-lettered here, and no queue outlives the connection. ``on_event`` gets
the decoded event, or None for a body the codec refuses (something was published all the
same). ``on_state(True)`` is called once the queue is bound (from then on no event is
missed), ``on_state(False)`` when the connection is lost; it connects again after
:data:`RECONNECT_BACKOFF_S` (the next delay at each failure, the last one repeated), until
stopped. Both callbacks run on the watch's thread: hand off to another thread or loop there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from actors import amqp
from actors.event_consumer import consume, declare_queue
from workflows.events import EXCHANGE, DomainEvent, EventCodecError, decode

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)  # then 10 s, until the broker answers
HEARTBEAT_S = 10  # a silently dead connection is noticed within about twice this
OnEvent = Callable[[DomainEvent | None], None]
OnState = Callable[[bool], None]


class EventWatch:
    def __init__(
        self,
        *,
        url: str,
        exchange: str = EXCHANGE,
        bindings: Sequence[str] = ("#",),
        backoff_s: Sequence[float] = RECONNECT_BACKOFF_S,
        name: str = "vibey-event-watch",
    ) -> None:
        self._url = url if "heartbeat=" in url else amqp.with_query(url, f"heartbeat={HEARTBEAT_S}")
        self.exchange = exchange
        self._bindings = tuple(bindings)
        self._backoff = tuple(backoff_s)
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.attempts = 0  # connections tried
        self.connects = 0  # connections that were bound
        self.seen = 0

    def start(self, *, on_event: OnEvent, on_state: OnState) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(on_event, on_state), name=self._name, daemon=True
        )
        self._thread.start()

    def stop(self, *, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, on_event: OnEvent, on_state: OnState) -> None:
        failures = 0
        while not self._stop.is_set():
            ready = threading.Event()
            self.attempts += 1
            try:
                self._consume(ready, on_event, on_state)
            except Exception as exc:  # noqa: BLE001 - the broker, or a callback: both again
                failures = 0 if ready.is_set() else failures + 1
                delay = self._backoff[min(failures, len(self._backoff) - 1)]
                self._lost(exc, failures, delay, on_state if ready.is_set() else None)
                self._stop.wait(delay)
            else:
                if ready.is_set():
                    on_state(False)

    def _consume(self, ready: threading.Event, on_event: OnEvent, on_state: OnState) -> None:
        """One connection, until it is lost (raises) or the watch is stopped."""

        def bound() -> None:
            ready.set()
            self.connects += 1
            if self.connects > 1:
                log.info("events: the live view is connected again")
            on_state(True)

        consume(
            self._url,
            declare=self._declare,
            on_message=lambda _channel, _method, _props, body: self._deliver(body, on_event),
            stop=self._stop,
            prefetch=0,  # no acks, nothing to hold back
            auto_ack=True,
            on_ready=bound,
        )

    def _declare(self, channel: Any) -> str:
        return declare_queue(
            channel, exchange=self.exchange, queue="", bindings=self._bindings, transient=True
        )

    def _lost(self, exc: Exception, failures: int, delay: float, on_state: OnState | None) -> None:
        why = repr(exc)[:200]  # pika's repr names the cause; its str is often empty
        if not isinstance(exc, amqp.AMQPError | OSError):
            log.error("events: the live view failed (%s); again in %.1fs", why, delay)
        if on_state is not None:
            log.warning("events: the live view lost the broker (%s); again in %.1fs", why, delay)
            on_state(False)
        elif failures == 1:
            log.warning(
                "events: the live view cannot reach the broker (%s); again in %.1fs", why, delay
            )
        else:
            log.debug(
                "events: still no broker (attempt %d: %s); again in %.1fs", failures, why, delay
            )

    def _deliver(self, body: bytes, on_event: OnEvent) -> None:
        self.seen += 1
        try:
            event: DomainEvent | None = decode(body)
        except EventCodecError as exc:
            log.debug("events: the live view got a body the codec refuses (%s)", exc)
            event = None
        on_event(event)
