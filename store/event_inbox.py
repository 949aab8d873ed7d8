"""The idempotent consumer's half in PostgreSQL: an event's effect commits once per consumer.

:meth:`EventInbox.handle` runs a consumer's effect inside one transaction that also inserts
``(consumer, event_id)`` into ``event_consumed`` (``ON CONFLICT DO NOTHING``): a duplicate or
redelivered event finds its row and is skipped; a consumer killed mid-effect rolls both back,
and the broker, never acked, delivers the event again. The effect must write through the
connection it is given (its writes are the transaction's) to be exactly once.

:meth:`EventInbox.dead_letter` keeps a message the consumer cannot read (``dead_letter``, the
table `vibey dead-letters` lists) with the reason, so nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from store.db import Conn, Pool, fetch_one, transaction
from store.sql import load
from workflows.events import DomainEvent

Q = load("event_inbox.sql")
Effect = Callable[[Conn, DomainEvent], None]


class EventInbox:
    def __init__(self, *, pool: Pool, consumer: str) -> None:
        if not consumer:
            raise ValueError("a consumer has a name: its events are deduplicated under it")
        self._pool = pool
        self.consumer = consumer

    def handle(self, event: DomainEvent, effect: Effect) -> bool:
        """Apply ``effect`` to ``event`` unless this consumer already did; True when applied."""
        with transaction(self._pool) as conn:
            row = fetch_one(
                conn, Q["consume"], {"consumer": self.consumer, "event_id": event.event_id}
            )
            if row is None:
                return False
            effect(conn, event)
            return True

    def seen(self, event_id: UUID) -> bool:
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["seen"], {"consumer": self.consumer, "event_id": event_id})
        return row is not None

    def payload(self, event_id: UUID) -> dict[str, Any] | None:
        """The payload a by-reference event points at."""
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["payload"], {"event_id": event_id})
        return None if row is None else dict(row["payload"])

    def dead_letter(
        self,
        *,
        queue: str,
        routing_key: str,
        reason: str,
        detail: str,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> int:
        with transaction(self._pool) as conn:
            row = fetch_one(
                conn,
                Q["dead_letter"],
                {
                    "queue": queue,
                    "routing_key": routing_key,
                    "reason": reason,
                    "detail": detail[:2000],
                    "body": body,
                    "headers": Jsonb({k: str(v) for k, v in (headers or {}).items()}),
                    "message_id": message_id,
                },
            )
        assert row is not None
        return int(row["id"])
