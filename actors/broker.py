"""Dramatiq on RabbitMQ, adapted to carry vibey's dispatch pointers.

Dramatiq stays the transport and the worker runtime (processes × threads, prefetch, graceful
shutdown, middleware hooks); PostgreSQL owns state, attempts and delays. What fights that is
neutralised here:

* **The wire format is the pointer**, ``vibey.job.dispatch/1`` (``workflows.dispatch``), not
  Dramatiq's JSON: the consumer decodes it strictly into a Dramatiq message for the step actor
  of the queue it came from. A malformed body is dead-lettered with its reason and never
  reaches an actor.
* **No delay queues, no ``eta``**: ``declare_queue`` emits no ``declare_delay_queue``, so the
  worker starts no ``.DQ`` consumer (nothing is held in worker memory); delays are wait tiers.
* **The topology is vibey's** (``actors.topology``), declared once at start; Dramatiq's own
  declarations (classic queues with ``.DQ``/``.XQ`` siblings) are never made. ``enqueue`` is
  refused: pointers are published by the outbox relay, never by Dramatiq.
* **No stale acks**: Dramatiq acknowledges through whichever consumer is current, so after a
  channel closed (``consumer_timeout``, a broker restart) a finished step would acknowledge an
  old delivery tag on the new channel — another message. Each message remembers the consumer
  (channel) it came from, and an ack or nack on any other consumer is skipped: the broker
  redelivers that message, and its stale generation or live lease turns it into a no-op.
* **No Retries, Callbacks, Pipelines, Results or AgeLimit**: the middleware list is empty
  unless a caller adds vibey's own.

Only this module (and the relay and topology modules beside it) import pika.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any
from uuid import UUID

import pika
from dramatiq import Message, MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer, _RabbitmqMessage
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Middleware

from actors.amqp import with_query
from actors.relay import SOLO_HEADER, TRACE_HEADERS
from actors.topology import DETAIL_HEADER, REASON_HEADER
from workflows.dispatch import EnvelopeError, decode

log = logging.getLogger(__name__)

STEP_ACTOR_PREFIX = "run_step@"
PUBLISH_ATTEMPTS = 3  # a re-delay's publish, each on a fresh connection after a lost one
_CONSUMER_SERIALS = itertools.count(1)


def step_actor_name(queue: str) -> str:
    return f"{STEP_ACTOR_PREFIX}{queue}"


class PointerConsumer(_RabbitmqConsumer):
    """Decodes pointers; acknowledges only deliveries of its own channel."""

    def __init__(self, broker: VibeyBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)
        self.serial = next(_CONSUMER_SERIALS)  # unlike id(), never reused by a later consumer
        self._dead_exchange = broker.dead_exchange

    def __next__(self) -> MessageProxy | None:
        try:
            method, properties, body = next(self.iterator)
            if method is None:
                return None
        except (
            AssertionError,
            pika.exceptions.AMQPConnectionError,
            pika.exceptions.AMQPChannelError,
        ) as exc:
            raise ConnectionClosed(exc) from None
        try:
            envelope = decode(body)
        except EnvelopeError as exc:
            self._dead_letter(method, body, str(exc.reason), str(exc))
            return None
        message: Message[None] = Message(
            queue_name=self.queue_name,
            actor_name=step_actor_name(self.queue_name),
            args=(),
            kwargs={
                "job_id": str(envelope.job_id),
                "project_id": envelope.project_id,
                "seq": envelope.dispatch_seq,
                "kind": envelope.kind,
                "routing_key": method.routing_key,
                "delivery": _delivery_count(properties),
                "solo": _solo(properties),
                "redelivered": bool(method.redelivered),
                **_workflow(properties, envelope.job_id),
                **_trace(properties),
            },
            options={},
            message_id=envelope.message_id,
        )
        proxy = _RabbitmqMessage(method.redelivered, method.delivery_tag, message)
        proxy.options["vibey_consumer"] = self.serial
        self.known_tags.add(method.delivery_tag)
        return proxy

    def _dead_letter(self, method: Any, body: bytes, reason: str, detail: str) -> None:
        """Republish to the dead-letter exchange with the reason, then ack: the consumer
        thread owns this channel, so this runs inline, in order."""
        log.warning("dead-lettering a malformed pointer on %s: %s", self.queue_name, detail)
        properties = pika.BasicProperties(
            delivery_mode=2, headers={REASON_HEADER: reason, DETAIL_HEADER: detail[:500]}
        )
        self.channel.basic_publish(self._dead_exchange, method.routing_key, body, properties)
        self.channel.basic_ack(method.delivery_tag)

    def ack(self, message: MessageProxy) -> None:
        if self._mine(message, "ack"):
            super().ack(message)

    def nack(self, message: MessageProxy) -> None:
        if self._mine(message, "nack"):
            super().nack(message)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        """Hand ``messages`` (delivered here, never started) back to their queue at once:
        Basic.Reject with requeue, sent by the thread that owns the connection. Dramatiq's
        RabbitMQ consumer does nothing here and leaves them to the channel's close, so a
        draining worker held its buffered pointers until its drain ended."""
        for message in messages:
            if not self._mine(message, "requeue") or message._tag not in self.known_tags:
                continue
            self.known_tags.remove(message._tag)
            try:
                self.connection.add_callback_threadsafe(
                    partial(self.channel.basic_reject, message._tag, requeue=True)
                )
            except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
                raise ConnectionClosed(exc) from None  # closed: the broker requeued it

    def _mine(self, message: MessageProxy, what: str) -> bool:
        if message.options.get("vibey_consumer") == self.serial:
            return True
        log.warning(
            "not settling (%s) %s: its channel closed since it was delivered; the broker "
            "redelivers it and its generation or lease makes that a no-op",
            what,
            message.message_id,
        )
        return False

    def close(self) -> None:
        """Dramatiq's close stops at the channel: once the broker closed it (consumer_timeout,
        a 406) ``channel.close()`` raises and the connection is never closed, one leaked
        connection per channel error. Close the connection whatever the channel did."""
        try:
            super().close()
        finally:
            if self.connection.is_open:
                try:
                    self.connection.close()
                except pika.exceptions.AMQPError:
                    log.debug("closing the consumer's connection failed", exc_info=True)


def _delivery_count(properties: Any) -> int:
    """Quorum queues count redeliveries (channel deaths, requeues) in ``x-delivery-count``.
    A publisher can forge the header: anything but a non-negative int counts as 0."""
    headers = properties.headers if isinstance(properties.headers, dict) else {}
    raw = headers.get("x-delivery-count", 0)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0


def _trace(properties: Any) -> dict[str, Any]:
    """``trace``: the W3C trace headers a traced relay sent (``actors.tracing``), if any."""
    headers = properties.headers if isinstance(properties.headers, dict) else {}
    carrier = {k: headers[k] for k in TRACE_HEADERS if isinstance(headers.get(k), str)}
    return {"trace": carrier} if carrier else {}


def _workflow(properties: Any, job_id: UUID) -> dict[str, Any]:
    """``workflow``: the job's workflow as the relay named it (``correlation_id``: the
    workflow, else the job itself), if any: a hint for the runner (``StepRunner.run``)."""
    correlation = properties.correlation_id
    if not isinstance(correlation, str) or correlation == str(job_id):
        return {}
    return {"workflow": correlation}


def _solo(properties: Any) -> bool:
    headers = properties.headers if isinstance(properties.headers, dict) else {}
    return headers.get(SOLO_HEADER) is True


class VibeyBroker(RabbitmqBroker):
    """A RabbitmqBroker whose queues are vibey's lane queues, declared by ``declare``."""

    def __init__(
        self,
        *,
        url: str,
        dead_exchange: str,
        declare: Callable[[Any], None],
        middleware: list[Middleware] | None = None,
        heartbeat: int = 30,
    ) -> None:
        super().__init__(
            url=with_query(url, f"heartbeat={heartbeat}"),  # every node's URL
            confirm_delivery=True,
            middleware=middleware or [],
        )
        self.dead_exchange = dead_exchange
        self._declare = declare
        self._declared = False

    @property
    def consumer_class(self) -> type[PointerConsumer]:
        return PointerConsumer

    def declare_queue(self, queue_name: str, *, ensure: bool = False) -> None:
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)  # and no delay queue, ever
        if ensure:
            self._ensure_queue(queue_name)

    def _ensure_queue(self, queue_name: str) -> None:
        if not self._declared:
            self._declare(self.channel)
            self._declared = True

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        raise RuntimeError(
            "vibey publishes pointers through the outbox relay; Dramatiq's enqueue is not used"
        )

    def publish(
        self,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> None:
        """Publish on this thread's confirm-mode channel (mandatory): used to re-delay a
        pointer through a wait tier."""
        properties = pika.BasicProperties(
            delivery_mode=2,
            content_type="application/json",
            message_id=message_id,
            headers=dict(headers) if headers else None,
        )
        # This thread's connection may have died while the thread waited (on PostgreSQL, say,
        # past the broker's heartbeat timeout): a new one is opened and the publish sent again,
        # as Dramatiq's own enqueue does, rather than the pointer being dropped.
        for attempt in range(1, PUBLISH_ATTEMPTS + 1):
            try:
                self.channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)
                return
            except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
                if isinstance(exc, pika.exceptions.UnroutableError):
                    raise
                del self.connection
                if attempt == PUBLISH_ATTEMPTS:
                    raise ConnectionClosed(exc) from exc
                log.warning(
                    "publish to %s: attempt %d/%d failed (%s); reconnecting",
                    exchange,
                    attempt,
                    PUBLISH_ATTEMPTS,
                    exc,
                )
