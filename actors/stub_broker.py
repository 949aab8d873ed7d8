"""A stub beside the broker seam, as Dramatiq ships ``StubBroker``: what the step path
publishes, kept in memory.

:class:`Publisher` is what the step runner and the outage path ask of a broker (one confirmed
publish; ``actors.broker.VibeyBroker`` is the real one). :class:`StubPublisher` records each
publish (``published``) and each unit's pointers handed over after commit (``submit``, the
relay's ``after_commit`` hook: ``actors.relay.Relay.submit`` is the real one), so a unit test
can assert what would have reached RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from store.unit_of_work import OutboxRow


class Publisher(Protocol):
    def publish(
        self,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> None:
        """Publish one message, confirmed; raises when the broker refused it."""
        ...


@dataclass(frozen=True, slots=True)
class Published:
    exchange: str
    routing_key: str
    body: bytes
    headers: Mapping[str, Any]
    message_id: str | None


@dataclass
class StubPublisher:
    """Keeps what it was given; ``refuse`` makes every publish raise it instead."""

    published: list[Published] = field(default_factory=list)
    submitted: list[OutboxRow] = field(default_factory=list)
    refuse: Exception | None = None

    def publish(
        self,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.published.append(
            Published(exchange, routing_key, body, dict(headers or {}), message_id)
        )

    def submit(self, pointers: Sequence[OutboxRow]) -> None:
        """The relay's hook: a committed unit's pointers."""
        self.submitted.extend(pointers)
