"""Webhooks: domain events POSTed, signed, to the URLs of ``[notify.webhooks.<name>]``.

Built as an events consumer (:class:`actors.event_consumer.EventConsumer`), never inside the
step path: a workflow's transaction writes its events, and whatever happens to a webhook later
(a dead endpoint, a slow one) cannot delay it. The consumer queues one delivery per matching
webhook in the transaction that marks the event consumed (``store.webhooks``); one deliverer
thread per webhook POSTs them, so one dead endpoint does not hold back another's.

Each POST carries the event's JSON (the codec's, payload inline) and::

    X-Vibey-Timestamp: <unix seconds>
    X-Vibey-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>
    X-Vibey-Event-Id, X-Vibey-Event-Type

A receiver checks both with :func:`verify` (a stale timestamp is refused: replay). A 2xx
answer delivers; anything else (an error status, a refused connection, a timeout) is recorded
as an attempt and retried after :data:`BACKOFF_S`, until ``max_attempts`` are spent.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping

from actors.event_consumer import EventConsumer
from actors.webhook_spec import WebhookSpec
from store.db import Conn, Pool
from store.event_inbox import Effect, EventInbox
from store.webhooks import Delivery, WebhookDeliveries, add_delivery_on
from workflows.events import EXCHANGE, DomainEvent, binding_key, encode

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Vibey-Signature"
TIMESTAMP_HEADER = "X-Vibey-Timestamp"
BACKOFF_S = (1.0, 5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0)
REPLAY_TOLERANCE_S = 300.0
Post = Callable[[str, bytes, Mapping[str, str], float], int]


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify(
    secret: str,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    *,
    now: float,
    tolerance_s: float = REPLAY_TOLERANCE_S,
) -> bool:
    """True when ``signature`` signs ``body`` at ``timestamp`` and the timestamp is recent."""
    if timestamp is None or signature is None or not timestamp.isdigit():
        return False
    if abs(now - int(timestamp)) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, int(timestamp), body), signature)


def webhook_effect(specs: Iterable[WebhookSpec]) -> Effect:
    """The consumer's effect: a delivery for each webhook that wants the event."""
    listed = tuple(specs)

    def effect(conn: Conn, event: DomainEvent) -> None:
        body = encode(event)
        for spec in listed:
            if spec.wants(event.event_type.value):
                add_delivery_on(
                    conn,
                    webhook=spec.name,
                    event_id=event.event_id,
                    event_type=event.event_type.value,
                    url=spec.url,
                    body=body,
                )

    return effect


def post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> int:
    """POST ``body``; the status (an HTTP error's too). Raises ``OSError`` when unreachable."""
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class WebhookDeliverer:
    """POSTs one webhook's due deliveries, recording every attempt."""

    def __init__(
        self,
        *,
        spec: WebhookSpec,
        deliveries: WebhookDeliveries,
        clock: Callable[[], float] = time.time,
        send: Post = post,
        backoff_s: tuple[float, ...] = BACKOFF_S,
    ) -> None:
        self.spec = spec
        self._deliveries = deliveries
        self._clock = clock
        self._send = send
        self._backoff = backoff_s

    def deliver_due(self) -> int:
        due = self._deliveries.claim(self.spec.name, hold_s=self.spec.timeout_s + 30)
        for delivery in due:
            self._attempt(delivery)
        return len(due)

    def _attempt(self, delivery: Delivery) -> None:
        stamp = int(self._clock())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "vibey-webhooks",
            TIMESTAMP_HEADER: str(stamp),
            SIGNATURE_HEADER: sign(self.spec.secret, stamp, delivery.body),
            "X-Vibey-Event-Id": str(delivery.event_id),
            "X-Vibey-Event-Type": delivery.event_type,
        }
        started = time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            status = self._send(delivery.url, delivery.body, headers, self.spec.timeout_s)
        except (OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        took = int((time.monotonic() - started) * 1000)
        if status is not None and 200 <= status < 300:
            outcome, delay = "delivered", 0.0
        elif delivery.attempt >= self.spec.max_attempts:
            outcome, delay = "failed", 0.0
        else:
            outcome = "retry"
            delay = self._backoff[min(delivery.attempt - 1, len(self._backoff) - 1)]
        if outcome != "delivered":
            log.warning(
                "webhook %s: attempt %d/%d of event %s: %s",
                self.spec.name,
                delivery.attempt,
                self.spec.max_attempts,
                delivery.event_id,
                error or f"HTTP {status}",
            )
        self._deliveries.record(
            delivery,
            status_code=status,
            error=error,
            duration_ms=took,
            outcome=outcome,
            retry_in_s=delay,
        )


class WebhookService:
    """The webhooks' events consumer and one deliverer thread per webhook."""

    def __init__(
        self,
        *,
        amqp_url: str,
        pool: Pool,
        specs: Iterable[WebhookSpec],
        exchange: str = EXCHANGE,
        queue: str = "vibey.notify.webhooks",
        interval: float = 0.5,
        backoff_s: tuple[float, ...] = BACKOFF_S,
    ) -> None:
        self.specs = tuple(specs)
        kinds = sorted({e for spec in self.specs for e in spec.events})
        bindings = [binding_key() if e == "*" else binding_key(event_type=e) for e in kinds]
        self.consumer = EventConsumer(
            url=amqp_url,
            inbox=EventInbox(pool=pool, consumer=queue),
            queue=queue,
            bindings=bindings,
            effect=webhook_effect(self.specs),
            exchange=exchange,
        )
        deliveries = WebhookDeliveries(pool=pool)
        self.deliverers = [
            WebhookDeliverer(spec=spec, deliveries=deliveries, backoff_s=backoff_s)
            for spec in self.specs
        ]
        self._interval = interval
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        targets: list[tuple[Callable[[], None], str]] = [(self._consume, "webhooks-consumer")]
        targets += [(self._delivering(d), f"webhook-{d.spec.name}") for d in self.deliverers]
        for target, name in targets:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, *, timeout: float = 10.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def _consume(self) -> None:
        while not self._stop.is_set():
            try:
                self.consumer.run(self._stop)
            except Exception:
                log.exception("webhooks: the events consumer stopped; again in 1s")
                self._stop.wait(1.0)

    def _delivering(self, deliverer: WebhookDeliverer) -> Callable[[], None]:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    sent = deliverer.deliver_due()
                except Exception:
                    log.exception("webhook %s: a delivery pass failed", deliverer.spec.name)
                    sent = 0
                if not sent:
                    self._stop.wait(self._interval)

        return loop
