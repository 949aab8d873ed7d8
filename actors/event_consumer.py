"""An idempotent consumer of domain events: a helper for users, and the webhooks' base.

::

    def effect(conn, event):          # conn: the transaction the dedupe row commits in
        conn.execute("INSERT INTO my_table ...", ...)

    consumer = EventConsumer(
        url=amqp_url,
        inbox=EventInbox(pool=pool, consumer="my-app"),
        queue="my-app.events",
        bindings=[binding_key(event_type="gate")],     # every gate.* event
        effect=effect,
    )
    consumer.run(stop)                # until stop is set

Each delivery is decoded with the strict codec (``workflows.events.decode``; a by-reference
payload is fetched from PostgreSQL and checked against its SHA-256), then applied through
:meth:`store.event_inbox.EventInbox.handle`: the effect and the dedupe row commit together, and
only then is the message acked. A duplicate or redelivered event is acked without a second
effect; a consumer killed mid-effect loses nothing (the broker redelivers the unacked message).
A malformed message is dead-lettered (PostgreSQL's ``dead_letter``, with the codec's reason)
and acked; an effect that raises is retried once by redelivery, then dead-lettered with its
error — it never blocks the queue.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from actors import amqp
from actors.event_publisher import declare_exchange
from store.event_inbox import Effect, EventInbox
from workflows.events import EXCHANGE, DomainEvent, EventCodecError, decode, resolved

log = logging.getLogger(__name__)

MALFORMED = "malformed_event"
EFFECT_FAILED = "effect_failed"
OnMessage = Callable[[Any, Any, amqp.BasicProperties, bytes], None]


def declare_queue(
    channel: Any, *, exchange: str, queue: str, bindings: Sequence[str], transient: bool
) -> str:
    """Declare ``exchange`` and ``queue`` bound to it by each of ``bindings``; the queue's name.

    ``transient``: exclusive and auto-deleted (it lives as long as the connection); with
    ``queue=""`` the broker names it, so several such views never share one."""
    declare_exchange(channel, exchange)
    if transient:
        declared = channel.queue_declare(queue, exclusive=True, auto_delete=True)
    else:
        declared = channel.queue_declare(queue, durable=True)
    name = queue or str(declared.method.queue)
    for key in bindings:
        channel.queue_bind(name, exchange, routing_key=key)
    return name


def consume(
    url: str,
    *,
    declare: Callable[[Any], str],
    on_message: OnMessage,
    stop: threading.Event,
    prefetch: int,
    poll: float = 0.2,
    auto_ack: bool = False,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """One connection: ``declare`` the queue, consume it with ``on_message`` until ``stop``
    is set (``on_ready`` once it is bound and consumed). A lost connection raises
    ``amqp.AMQPError`` (or ``OSError``): whether to connect again is the caller's choice."""
    connection = amqp.connect(url)
    try:
        channel = connection.channel()
        queue = declare(channel)
        channel.basic_qos(prefetch_count=prefetch)
        channel.basic_consume(queue, on_message, auto_ack=auto_ack)
        if on_ready is not None:
            on_ready()
        while not stop.is_set():
            connection.process_data_events(time_limit=poll)
    finally:
        if connection.is_open:
            with contextlib.suppress(amqp.AMQPError):  # already going
                connection.close()


class EventConsumer:
    def __init__(
        self,
        *,
        url: str,
        inbox: EventInbox,
        queue: str,
        bindings: Sequence[str],
        effect: Effect,
        exchange: str = EXCHANGE,
        prefetch: int = 16,
        transient: bool = False,
    ) -> None:
        """``transient``: the queue lives as long as this consumer's connection (exclusive,
        auto-deleted), for a live view such as the console's that reads history from
        PostgreSQL (``store.events.EventLog.recent``) and only what follows from here."""
        self._url = url
        self._inbox = inbox
        self.queue = queue
        self._bindings = tuple(bindings)
        self._effect = effect
        self._exchange = exchange
        self._prefetch = prefetch
        self._transient = transient
        self.applied = 0
        self.duplicates = 0
        self.dead = 0

    def declare(self, channel: Any) -> str:
        return declare_queue(
            channel,
            exchange=self._exchange,
            queue=self.queue,
            bindings=self._bindings,
            transient=self._transient,
        )

    def run(self, stop: threading.Event, *, poll: float = 0.2) -> None:
        """Consume until ``stop`` is set."""
        consume(
            self._url,
            declare=self.declare,
            on_message=self._on_message,
            stop=stop,
            prefetch=self._prefetch,
            poll=poll,
        )

    def _on_message(
        self, channel: Any, method: Any, properties: amqp.BasicProperties, body: bytes
    ) -> None:
        try:
            event = self._read(body)
        except EventCodecError as exc:
            self._dead(channel, method, properties, body, MALFORMED, str(exc))
            return
        try:
            applied = self._inbox.handle(event, self._effect)
        except Exception as exc:  # noqa: BLE001 - a user's effect: retried once, then kept
            if not method.redelivered:
                log.warning(
                    "events: %s on %s failed (%s); once more", self.queue, event.event_id, exc
                )
                channel.basic_nack(method.delivery_tag, requeue=True)
                return
            self._dead(
                channel, method, properties, body, EFFECT_FAILED, f"{type(exc).__name__}: {exc}"
            )
            return
        if applied:
            self.applied += 1
        else:
            self.duplicates += 1
        channel.basic_ack(method.delivery_tag)

    def _read(self, body: bytes) -> DomainEvent:
        event = decode(body)
        if event.payload_ref is None:
            return event
        payload = self._inbox.payload(event.event_id)
        if payload is None:
            raise EventCodecError(f"event {event.event_id}: its payload is not in PostgreSQL")
        return resolved(event, payload)

    def _dead(
        self,
        channel: Any,
        method: Any,
        properties: amqp.BasicProperties,
        body: bytes,
        reason: str,
        detail: str,
    ) -> None:
        log.warning("events: %s dead-letters a message (%s: %s)", self.queue, reason, detail)
        self._inbox.dead_letter(
            queue=self.queue,
            routing_key=method.routing_key,
            reason=reason,
            detail=detail,
            body=body,
            headers=properties.headers,
            message_id=properties.message_id,
        )
        self.dead += 1
        channel.basic_ack(method.delivery_tag)
