"""Webhook deliveries in PostgreSQL: one per (webhook, event), every attempt recorded.

The webhook consumer adds a delivery in the transaction that marks its event consumed
(:func:`add_delivery_on`), so an event is queued for each webhook exactly once; the deliverer
claims due ones (:meth:`WebhookDeliveries.claim`), records each attempt, and marks the delivery
delivered, due again later (backoff), or failed when its attempts are spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from store.db import Conn, Pool, fetch_all, transaction
from store.sql import load

Q = load("webhooks.sql")


@dataclass(frozen=True, slots=True)
class Delivery:
    id: int
    webhook: str
    event_id: UUID
    event_type: str
    url: str
    body: bytes
    attempt: int  # the attempt this claim makes (1 for the first)


def add_delivery_on(
    conn: Conn, *, webhook: str, event_id: UUID, event_type: str, url: str, body: bytes
) -> None:
    conn.execute(
        Q["add_delivery"].encode(),
        {
            "webhook": webhook,
            "event_id": event_id,
            "event_type": event_type,
            "url": url,
            "body": body,
        },
    )


class WebhookDeliveries:
    def __init__(self, *, pool: Pool) -> None:
        self._pool = pool

    def claim(self, webhook: str, *, limit: int = 20, hold_s: float = 60.0) -> list[Delivery]:
        with transaction(self._pool) as conn:
            rows = fetch_all(
                conn, Q["claim_due"], {"webhook": webhook, "limit": limit, "hold_s": hold_s}
            )
        return [
            Delivery(
                id=r["id"],
                webhook=r["webhook"],
                event_id=r["event_id"],
                event_type=r["event_type"],
                url=r["url"],
                body=bytes(r["body"]),
                attempt=r["attempts"],
            )
            for r in rows
        ]

    def record(
        self,
        delivery: Delivery,
        *,
        status_code: int | None,
        error: str | None,
        duration_ms: int,
        outcome: str,
        retry_in_s: float = 0.0,
    ) -> None:
        """Record one attempt and what follows: ``delivered``, ``retry`` or ``failed``."""
        with transaction(self._pool) as conn:
            conn.execute(
                Q["record_attempt"].encode(),
                {
                    "delivery_id": delivery.id,
                    "attempt": delivery.attempt,
                    "status_code": status_code,
                    "error": None if error is None else error[:2000],
                    "duration_ms": duration_ms,
                },
            )
            if outcome == "delivered":
                conn.execute(Q["delivered"].encode(), {"id": delivery.id})
            elif outcome == "failed":
                conn.execute(Q["given_up"].encode(), {"id": delivery.id})
            else:
                conn.execute(Q["retry_later"].encode(), {"id": delivery.id, "delay_s": retry_in_s})

    def deliveries(self, webhook: str | None = None) -> list[dict[str, Any]]:
        with transaction(self._pool) as conn:
            return [dict(r) for r in fetch_all(conn, Q["deliveries"], {"webhook": webhook})]

    def attempts(self, webhook: str | None = None) -> list[dict[str, Any]]:
        with transaction(self._pool) as conn:
            return [dict(r) for r in fetch_all(conn, Q["attempts"], {"webhook": webhook})]
