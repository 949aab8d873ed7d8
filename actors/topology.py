"""The RabbitMQ topology as code: names, queue arguments and idempotent declarations.

Every name starts with a configurable prefix (``[bus] prefix``, default ``vibey``); the vhost is
the connection's. With the default prefix::

    vibey.jobs                     topic exchange, durable      dispatch
    vibey.jobs.<lane>              quorum queue                 a lane's shared fleet;
                                                                binds shared.<lane>.*
    vibey.jobs.<lane>.p.<project>  quorum queue                 a project's dedicated workers;
                                                                binds dedicated.<lane>.<project>
    vibey.wait.<tier>              fanout exchange, durable     a fixed delay: publish here with
    vibey.wait.<tier>              quorum queue, no consumers   the real routing key; on expiry
                                                                the message dead-letters to
                                                                vibey.jobs and keeps that key
    vibey.jobs.dlx                 fanout exchange, durable     poison pointers
    vibey.jobs.dead                quorum queue, binds the DLX  parked by the reconciler

A pointer vibey dead-letters itself (a malformed body) carries why in its headers
(``REASON_HEADER``, ``DETAIL_HEADER``), which the reconciler keeps when it parks it.

Work queues carry ``x-delivery-limit`` and dead-letter to ``vibey.jobs.dlx`` (at-least-once,
which needs ``x-overflow=reject-publish``, or RabbitMQ silently falls back to at-most-once).
Tier queues carry ``x-message-ttl`` and ``x-dead-letter-exchange=vibey.jobs`` and no
``x-dead-letter-routing-key``. Never route into a tier queue through the default exchange: the
routing key would be the queue's name, and the expired message would be unroutable.

Only arguments the broker honours are sent (:class:`actors.capabilities.BrokerCapabilities`):
RabbitMQ 3.10 accepts unknown ``x-`` arguments silently. Queue arguments are immutable, so a
changed setting (say the delivery limit) needs a drained and deleted queue or a new prefix.

Exceptions::

    TopologyError (Exception)   the broker refused a declaration or binding
    └── TopologyMismatch        a queue or exchange exists with another type or arguments (406)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any

import pika.exceptions

from actors.capabilities import BrokerCapabilities

# Characters that would change the meaning of a routing or binding key, and whitespace.
_FORBIDDEN = re.compile(r"[.*#\s]")
_MAX_NAME_BYTES = 255  # AMQP short string
RESERVED_LANES = frozenset({"dead"})  # vibey.jobs.dead is the dead-letter queue
REASON_HEADER = "x-vibey-reason"  # why vibey dead-lettered a pointer
DETAIL_HEADER = "x-vibey-detail"

QUORUM = "quorum"
AT_LEAST_ONCE = "at-least-once"
REJECT_PUBLISH = "reject-publish"


class TopologyError(Exception):
    """The broker refused a declaration or a binding; the channel is closed."""

    def __init__(self, message: str, *, name: str, reply_code: int, reply_text: str) -> None:
        super().__init__(message)
        self.name = name
        self.reply_code = reply_code
        self.reply_text = reply_text


class TopologyMismatch(TopologyError):
    """A queue or exchange already exists with another type or other arguments."""


def check_token(value: str, what: str) -> str:
    """``value`` when it can stand as one word of a routing key, else ValueError."""
    if not value or _FORBIDDEN.search(value):
        raise ValueError(
            f"{what} {value!r} cannot be used in a routing key: it must be non-empty and "
            "contain no '.', '*', '#' or whitespace"
        )
    return value


def _checked_name(name: str) -> str:
    if len(name.encode()) > _MAX_NAME_BYTES:
        raise ValueError(f"{name!r} is longer than {_MAX_NAME_BYTES} bytes: use shorter ids")
    return name


@dataclass(frozen=True, slots=True)
class QueueNames:
    """Every exchange, queue and routing key name, under one prefix."""

    prefix: str = "vibey"

    def __post_init__(self) -> None:
        if not self.prefix or re.search(r"[*#\s]", self.prefix):
            raise ValueError(
                f"the bus prefix {self.prefix!r} must be non-empty and contain no '*', '#' "
                "or whitespace: fix prefix under [bus] (or VIBEY_BUS_PREFIX)"
            )

    @property
    def work_exchange(self) -> str:
        return f"{self.prefix}.jobs"

    @property
    def dead_exchange(self) -> str:
        return f"{self.prefix}.jobs.dlx"

    @property
    def dead_queue(self) -> str:
        return f"{self.prefix}.jobs.dead"

    def work_queue(self, lane: str, project: str | None = None) -> str:
        """The lane's shared queue, or with ``project`` that project's dedicated queue."""
        base = f"{self.work_exchange}.{_lane(lane)}"
        if project is None:
            return _checked_name(base)
        return _checked_name(f"{base}.p.{check_token(project, 'project id')}")

    def routing_key(self, lane: str, project: str, dedicated: bool = False) -> str:
        kind = "dedicated" if dedicated else "shared"
        return _checked_name(f"{kind}.{_lane(lane)}.{check_token(project, 'project id')}")

    def binding_key(self, lane: str, project: str | None = None) -> str:
        """What the queue ``work_queue(lane, project)`` binds on the work exchange."""
        if project is None:
            return f"shared.{_lane(lane)}.*"
        return self.routing_key(lane, project, dedicated=True)

    def tier_exchange(self, tier: str) -> str:
        return _checked_name(f"{self.prefix}.wait.{check_token(tier, 'wait tier name')}")

    def tier_queue(self, tier: str) -> str:
        return _checked_name(f"{self.prefix}.wait.{check_token(tier, 'wait tier name')}")


def _lane(lane: str) -> str:
    check_token(lane, "lane")
    if lane in RESERVED_LANES:
        raise ValueError(f"lane {lane!r} is reserved: its queue would be the dead-letter queue")
    return lane


@dataclass(frozen=True, slots=True)
class Binding:
    exchange: str
    routing_key: str


@dataclass(frozen=True, slots=True)
class ExchangeSpec:
    name: str
    type: str


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    arguments: Mapping[str, Any]
    bindings: tuple[Binding, ...]


CONSUMER_TIMEOUT_FIX = (
    "raise consumer_timeout_seconds under [queue.rabbitmq] (VIBEY_QUEUE_CONSUMER_TIMEOUT) "
    "or shorten [queue.lease_seconds]"
)


def consumer_timeout_problem(timeout: timedelta, longest_lease: timedelta) -> str | None:
    """What is wrong with the work queues' consumer timeout against the longest lease, or
    None: it must be above it, or a step holding its delivery that long would lose its channel
    (:data:`CONSUMER_TIMEOUT_FIX` says how to fix it). The one check: ``vibey worker`` refuses
    to start on it, ``vibey doctor`` reports it."""
    if timeout > longest_lease:
        return None
    return (
        f"consumer_timeout_seconds ({timeout.total_seconds():g} s) is not above the longest "
        f"lease ({longest_lease.total_seconds():g} s): a step holding its delivery that long "
        "would lose its channel"
    )


@dataclass(frozen=True, slots=True)
class Topology:
    """The declared objects for some lanes, wait tiers and dedicated projects."""

    names: QueueNames
    tiers: Mapping[str, timedelta]
    lanes: Sequence[str]
    _: KW_ONLY
    dedicated_projects: Sequence[str] = ()
    delivery_limit: int = 20
    consumer_timeout: timedelta = timedelta(hours=6)
    max_tier_length: int = 1_000_000
    _tier_ms: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lanes = tuple(_lane(lane) for lane in self.lanes)
        projects = tuple(check_token(p, "project id") for p in self.dedicated_projects)
        _require(bool(lanes), "a topology needs at least one lane")
        _require(len(set(lanes)) == len(lanes), f"lanes repeat: {lanes}")
        _require(self.delivery_limit >= 0, f"delivery_limit must be >= 0: {self.delivery_limit}")
        _require(_ms(self.consumer_timeout) > 0, "consumer_timeout must be at least 1 ms")
        _require(self.max_tier_length >= 1, f"max_tier_length must be >= 1: {self.max_tier_length}")
        tier_ms = {check_token(name, "wait tier name"): _ms(d) for name, d in self.tiers.items()}
        for name, ms in tier_ms.items():
            _require(ms > 0, f"wait tier {name!r} must last at least 1 ms")
        object.__setattr__(self, "lanes", lanes)
        object.__setattr__(self, "dedicated_projects", tuple(dict.fromkeys(projects)))
        object.__setattr__(self, "tiers", MappingProxyType(dict(self.tiers)))
        object.__setattr__(self, "_tier_ms", MappingProxyType(tier_ms))

    # -- what is declared (pure) --------------------------------------------------------------

    def exchanges(self) -> tuple[ExchangeSpec, ...]:
        names = self.names
        tiers = tuple(ExchangeSpec(names.tier_exchange(t), "fanout") for t in self._tier_ms)
        return (
            ExchangeSpec(names.work_exchange, "topic"),
            ExchangeSpec(names.dead_exchange, "fanout"),
            *tiers,
        )

    def queues(self, caps: BrokerCapabilities) -> tuple[QueueSpec, ...]:
        """Every queue, in declaration order: dead-letter targets before their sources."""
        shared = (self._work_queue(caps, lane, None) for lane in self.lanes)
        dedicated = (
            self._work_queue(caps, lane, project)
            for project in self.dedicated_projects
            for lane in self.lanes
        )
        tiers = (self._tier_queue(tier) for tier in self._tier_ms)
        return (self._dead_queue(caps), *shared, *dedicated, *tiers)

    def dedicated_queue(self, caps: BrokerCapabilities, lane: str, project: str) -> QueueSpec:
        self._known_lane(lane)
        return self._work_queue(caps, lane, project)

    def queue_arguments(self, queue: str, caps: BrokerCapabilities) -> dict[str, Any]:
        """The arguments ``queue`` is declared with on a broker with ``caps``."""
        for spec in self.queues(caps):
            if spec.name == queue:
                return dict(spec.arguments)
        for lane in self.lanes:
            stem = f"{self.names.work_queue(lane)}.p."
            if queue.startswith(stem):
                return dict(self._work_queue(caps, lane, queue[len(stem) :]).arguments)
        raise ValueError(
            f"{queue!r} is not a queue of this topology (prefix {self.names.prefix!r})"
        )

    # -- declaring (idempotent) ---------------------------------------------------------------

    def declare(self, channel: Any, caps: BrokerCapabilities) -> None:
        """Declare every exchange, queue and binding on a pika ``BlockingChannel``.

        Raises :class:`TopologyMismatch` when an object exists with other arguments; the
        channel is then closed by the broker.
        """
        for exchange in self.exchanges():
            _declare_exchange(channel, exchange)
        for queue in self.queues(caps):
            _declare_queue(channel, queue)

    def declare_dedicated(
        self, channel: Any, caps: BrokerCapabilities, lane: str, project: str
    ) -> None:
        """Declare one project's dedicated queue for ``lane`` (and the exchanges it needs)."""
        spec = self.dedicated_queue(caps, lane, project)
        _declare_exchange(channel, ExchangeSpec(self.names.work_exchange, "topic"))
        _declare_exchange(channel, ExchangeSpec(self.names.dead_exchange, "fanout"))
        _declare_queue(channel, self._dead_queue(caps))
        _declare_queue(channel, spec)

    # -- one queue each -----------------------------------------------------------------------

    def _work_queue(self, caps: BrokerCapabilities, lane: str, project: str | None) -> QueueSpec:
        arguments: dict[str, Any] = {
            "x-queue-type": QUORUM,
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": self.names.dead_exchange,
            "x-dead-letter-strategy": AT_LEAST_ONCE,
            "x-overflow": REJECT_PUBLISH,
        }
        if caps.per_queue_consumer_timeout:
            arguments["x-consumer-timeout"] = _ms(self.consumer_timeout)
        binding = Binding(self.names.work_exchange, self.names.binding_key(lane, project))
        return QueueSpec(self.names.work_queue(lane, project), arguments, (binding,))

    def _tier_queue(self, tier: str) -> QueueSpec:
        arguments: dict[str, Any] = {
            "x-queue-type": QUORUM,
            "x-message-ttl": self._tier_ms[tier],
            "x-dead-letter-exchange": self.names.work_exchange,
            "x-dead-letter-strategy": AT_LEAST_ONCE,
            "x-overflow": REJECT_PUBLISH,
            "x-max-length": self.max_tier_length,
        }
        binding = Binding(self.names.tier_exchange(tier), "")
        return QueueSpec(self.names.tier_queue(tier), arguments, (binding,))

    def _dead_queue(self, caps: BrokerCapabilities) -> QueueSpec:
        arguments: dict[str, Any] = {"x-queue-type": QUORUM}
        if caps.default_delivery_limit_20:
            # 4.x would otherwise drop a parked pointer after 20 returns (it has no DLX).
            arguments["x-delivery-limit"] = -1
        binding = Binding(self.names.dead_exchange, "")
        return QueueSpec(self.names.dead_queue, arguments, (binding,))

    def _known_lane(self, lane: str) -> None:
        if lane not in self.lanes:
            raise ValueError(f"unknown lane {lane!r}: the topology's lanes are {self.lanes}")


def _declare_exchange(channel: Any, exchange: ExchangeSpec) -> None:
    with _refusals("exchange", exchange.name):
        channel.exchange_declare(exchange.name, exchange.type, durable=True)


def _declare_queue(channel: Any, queue: QueueSpec) -> None:
    with _refusals("queue", queue.name):
        channel.queue_declare(queue.name, durable=True, arguments=dict(queue.arguments))
    for binding in queue.bindings:
        with _refusals("binding of queue", queue.name):
            channel.queue_bind(queue.name, binding.exchange, routing_key=binding.routing_key)


@contextmanager
def _refusals(kind: str, name: str) -> Iterator[None]:
    """Translate the broker closing the channel into a :class:`TopologyError`."""
    try:
        yield
    except pika.exceptions.ChannelClosedByBroker as exc:
        code, text = exc.reply_code, str(exc.reply_text)
        if code == 406 and "inequivalent arg" in text:
            raise TopologyMismatch(
                _mismatch_message(kind, name, text), name=name, reply_code=code, reply_text=text
            ) from exc
        raise TopologyError(
            f"RabbitMQ refused the {kind} {name!r}: {code} {text}",
            name=name,
            reply_code=code,
            reply_text=text,
        ) from exc


def _mismatch_message(kind: str, name: str, text: str) -> str:
    vhost = re.search(r"in vhost '([^']*)'", text)
    where = f" -p {vhost.group(1)}" if vhost else ""
    drop = f"rabbitmqctl delete_queue{where} {name}" if kind == "queue" else "delete it"
    return (
        f"the {kind} {name!r} already exists with another type or other arguments ({text}). "
        f"Its type and arguments are immutable: drain it and delete it ({drop}), "
        "or choose a new prefix (prefix under [bus], or VIBEY_BUS_PREFIX)"
    )


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _ms(duration: timedelta) -> int:
    return duration // timedelta(milliseconds=1)
