"""The loop services' RabbitMQ objects (seed 000 §2, §13), declared by code at start.

===============================  =========================  =====================================
object                           type                       arguments / bindings
===============================  =========================  =====================================
``<p>.runs``                     direct exchange            run requests and probes
``<p>.runs.<engine>``            quorum queue               key ``<engine>``; ``x-delivery-limit``
                                                            (3), DLX ``<p>.runs.dlx``,
                                                            at-least-once, reject-publish,
                                                            ``x-consumer-timeout`` where honoured
``<p>.runs.<engine>.probe``      classic queue              key ``<engine>.probe``: probes never
                                                            wait behind a long run
``<p>.runs.dlx``                 fanout exchange            run requests that crashed their
``<p>.runs.dead``                quorum queue               service, and forged ones (with the
                                                            ``x-vibey-rejected`` reason header),
                                                            kept for the operator
``<p>.runs.dead.answers``        quorum queue               a copy of each (the fanout's second
                                                            queue): a loop service answers the
                                                            caller ``dead_lettered`` from it
``<p>.runs.control``             topic exchange             each service instance binds an
                                                            exclusive, auto-delete queue on
                                                            ``<engine>``: stop, wind_down
caller reply queue               exclusive, auto-delete,    named in ``reply_to``: accepted,
                                 server-named               progress and result for that caller
===============================  =========================  =====================================

Features are detected, not assumed (:mod:`actors.capabilities`): quorum queues exist on 3.10
and 4.x alike; ``x-consumer-timeout`` is set only where it is honoured (3.12+), and on 4.x
(whose quorum queues default to a delivery limit of 20) the dead queue takes ``-1`` so a
dead request is kept.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from datetime import timedelta
from typing import Any

from actors.capabilities import BrokerCapabilities
from actors.topology import Binding, ExchangeSpec, QueueSpec, TopologyError, check_token

QUORUM, AT_LEAST_ONCE, REJECT_PUBLISH = "quorum", "at-least-once", "reject-publish"
REJECTED_HEADER = "x-vibey-rejected"
PROBE_TTL = timedelta(minutes=5)  # a probe nobody answered in time is of no use to anyone


@dataclass(frozen=True, slots=True)
class RunsTopology:
    """The run objects of one prefix, for the engines named."""

    prefix: str
    engines: tuple[str, ...]
    _: KW_ONLY
    delivery_limit: int = 3
    consumer_timeout: timedelta = timedelta(hours=6)

    def __post_init__(self) -> None:
        check_token(self.prefix, "prefix")
        for engine in self.engines:
            check_token(engine, "engine id")
        if self.delivery_limit < 1:
            raise ValueError(f"delivery_limit must be at least 1, got {self.delivery_limit}")

    # -- names ---------------------------------------------------------------------------------

    @property
    def exchange(self) -> str:
        return f"{self.prefix}.runs"

    @property
    def control_exchange(self) -> str:
        return f"{self.prefix}.runs.control"

    @property
    def dead_exchange(self) -> str:
        return f"{self.prefix}.runs.dlx"

    @property
    def dead_queue(self) -> str:
        return f"{self.prefix}.runs.dead"

    @property
    def dead_answers_queue(self) -> str:
        return f"{self.prefix}.runs.dead.answers"

    def queue(self, engine: str) -> str:
        return f"{self.prefix}.runs.{engine}"

    def probe_queue(self, engine: str) -> str:
        return f"{self.prefix}.runs.{engine}.probe"

    @staticmethod
    def run_key(engine: str) -> str:
        return engine

    @staticmethod
    def probe_key(engine: str) -> str:
        return f"{engine}.probe"

    # -- what is declared (pure) ---------------------------------------------------------------

    def exchanges(self) -> tuple[ExchangeSpec, ...]:
        return (
            ExchangeSpec(self.exchange, "direct"),
            ExchangeSpec(self.dead_exchange, "fanout"),
            ExchangeSpec(self.control_exchange, "topic"),
        )

    def queues(self, caps: BrokerCapabilities) -> tuple[QueueSpec, ...]:
        """Every durable queue, dead-letter target first."""
        dead: dict[str, Any] = {"x-queue-type": QUORUM}
        if caps.default_delivery_limit_20:
            dead["x-delivery-limit"] = -1
        specs = [
            QueueSpec(self.dead_queue, dead, (Binding(self.dead_exchange, ""),)),
            QueueSpec(self.dead_answers_queue, dead, (Binding(self.dead_exchange, ""),)),
        ]
        for engine in self.engines:
            specs.append(self._run_queue(engine, caps))
            probe = {"x-message-ttl": int(PROBE_TTL.total_seconds() * 1000)}
            binding = Binding(self.exchange, self.probe_key(engine))
            specs.append(QueueSpec(self.probe_queue(engine), probe, (binding,)))
        return tuple(specs)

    def _run_queue(self, engine: str, caps: BrokerCapabilities) -> QueueSpec:
        arguments: dict[str, Any] = {
            "x-queue-type": QUORUM,
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": self.dead_exchange,
            "x-dead-letter-strategy": AT_LEAST_ONCE,
            "x-overflow": REJECT_PUBLISH,
        }
        if caps.per_queue_consumer_timeout:
            arguments["x-consumer-timeout"] = int(self.consumer_timeout.total_seconds() * 1000)
        binding = Binding(self.exchange, self.run_key(engine))
        return QueueSpec(self.queue(engine), arguments, (binding,))

    # -- declaring (idempotent) ----------------------------------------------------------------

    def declare(self, channel: Any, caps: BrokerCapabilities) -> None:
        """Every exchange, queue and binding, on a pika ``BlockingChannel``."""
        for exchange in self.exchanges():
            _guarded(
                lambda e=exchange: channel.exchange_declare(e.name, e.type, durable=True),
                exchange.name,
            )
        for queue in self.queues(caps):
            _guarded(
                lambda q=queue: channel.queue_declare(
                    q.name, durable=True, arguments=dict(q.arguments)
                ),
                queue.name,
            )
            for binding in queue.bindings:
                _guarded(
                    lambda q=queue, b=binding: channel.queue_bind(
                        q.name, b.exchange, routing_key=b.routing_key
                    ),
                    queue.name,
                )

    def declare_control_queue(self, channel: Any, engine: str) -> str:
        """A service instance's own control queue (exclusive, auto-delete, server-named),
        bound on ``<engine>``; its name."""
        frame = channel.queue_declare("", exclusive=True, auto_delete=True)
        name: str = frame.method.queue
        channel.queue_bind(name, self.control_exchange, routing_key=engine)
        return name

    def delete(self, channel: Any) -> None:
        """Deletes every queue and exchange (tests and ``vibey down --purge``)."""
        for queue in self.queues(BrokerCapabilities()):
            channel.queue_delete(queue.name)
        for exchange in self.exchanges():
            channel.exchange_delete(exchange.name)


def declare_reply_queue(channel: Any) -> str:
    """A caller's reply queue (exclusive, auto-delete, server-named); its name."""
    frame = channel.queue_declare("", exclusive=True, auto_delete=True)
    name: str = frame.method.queue
    return name


def _guarded(declare: Any, name: str) -> None:
    try:
        declare()
    except Exception as exc:
        code = getattr(exc, "reply_code", None)
        if code is None:
            raise
        text = str(getattr(exc, "reply_text", exc))
        raise TopologyError(
            f"RabbitMQ refused {name!r}: {code} {text}. An existing object with other "
            "arguments must be drained and deleted, or choose a new prefix under [bus]",
            name=name,
            reply_code=int(code),
            reply_text=text,
        ) from exc
