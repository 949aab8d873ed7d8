"""Domain events in PostgreSQL: the record, and the outbox the event publisher drains.

:func:`emit_on` writes drafts (``workflows.events.Draft``) in the caller's transaction, so an
event exists exactly when the change it reports committed. :class:`EventLog` reads them back
(``vibey events tail``, by-reference payloads) and gives the publisher its batches
(:meth:`EventLog.publish_batch`): rows locked ``FOR UPDATE SKIP LOCKED`` while they are sent,
marked published only once the broker confirmed them, so several publishers are harmless and
a publisher that dies leaves its rows for the next.

A project belongs to a tenant (:meth:`EventLog.set_tenant`); one never assigned belongs to
``default``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from store.db import Conn, Pool, fetch_all, fetch_one, transaction
from store.sql import load
from workflows.events import DomainEvent, Draft, EventType

Q = load("events.sql")
__all__ = ["EventLog", "emit_on", "event_from_row"]


def emit_on(
    conn: Conn,
    project_id: str,
    drafts: Sequence[Draft],
    *,
    correlation_id: str | None = None,
    causation_id: str | None = None,
) -> list[UUID]:
    """Write ``drafts`` as events of ``project_id`` in the caller's transaction (sent in a
    pipeline, read by nobody); returns their ids."""
    if not drafts:
        return []
    ids, events = drafted(drafts)
    conn.execute(
        Q["insert_events"].encode(),
        {
            "project_id": project_id,
            "correlation_id": correlation_id,
            "causation_id": causation_id,
            "events": events,
        },
    )
    return ids


def drafted(drafts: Sequence[Draft]) -> tuple[list[UUID], Jsonb]:
    """New ids for ``drafts``, and ``insert_events``' ``events``: the drafts with those ids
    as one JSON array."""
    ids = [uuid.uuid4() for _ in drafts]
    rows = [
        {"event_id": str(i), "event_type": d.event_type.value, "payload": dict(d.payload)}
        for i, d in zip(ids, drafts, strict=True)
    ]
    return ids, Jsonb(rows)


def event_from_row(row: Mapping[str, Any]) -> DomainEvent:
    return DomainEvent(
        event_id=row["event_id"],
        event_type=EventType(row["event_type"]),
        timestamp=row["occurred_at"],
        tenant_id=row["tenant_id"],
        project_id=row["project_id"],
        correlation_id=row["correlation_id"],
        causation_id=row["causation_id"],
        payload=row["payload"],
    )


class EventLog:
    def __init__(self, *, pool: Pool) -> None:
        self._pool = pool

    def emit(
        self,
        project_id: str,
        drafts: Sequence[Draft],
        *,
        correlation_id: str | None = None,
        causation_id: str | None = None,
    ) -> list[UUID]:
        with transaction(self._pool) as conn:
            return emit_on(
                conn,
                project_id,
                drafts,
                correlation_id=correlation_id,
                causation_id=causation_id,
            )

    def recent(
        self,
        *,
        limit: int = 20,
        after: int = 0,
        tenant: str | None = None,
        project: str | None = None,
        event_type: str | None = None,
        newest: bool = True,
    ) -> list[tuple[int, DomainEvent]]:
        """Events after seq ``after`` (the newest ``limit`` of them, or with ``newest=False``
        the oldest), in seq order, with their seqs. ``event_type`` may be a family
        (``gate``)."""
        params = {
            "after": after,
            "limit": limit,
            "tenant": tenant,
            "project": project,
            "type": event_type,
        }
        with transaction(self._pool) as conn:
            rows = fetch_all(conn, Q["recent_events" if newest else "events_after"], params)
        return [(row["seq"], event_from_row(row)) for row in rows]

    def payload(self, event_id: UUID) -> dict[str, Any] | None:
        """The full payload of an event (what a by-reference envelope points at)."""
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["event_payload"], {"event_id": event_id})
        return None if row is None else dict(row["payload"])

    def set_tenant(self, project_id: str, tenant_id: str) -> None:
        with transaction(self._pool) as conn:
            conn.execute(
                Q["set_tenant"].encode(), {"project_id": project_id, "tenant_id": tenant_id}
            )

    def tenant_of(self, project_id: str) -> str:
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["tenant_of"], {"project_id": project_id})
        return "default" if row is None else str(row["tenant_id"])

    @contextmanager
    def publish_batch(
        self, *, limit: int = 200
    ) -> Iterator[tuple[list[tuple[int, DomainEvent]], Callable[[Sequence[int]], None]]]:
        """Unpublished events (locked for this transaction) and the function that marks the
        ones the broker confirmed; the marks commit when the block ends without error."""
        with transaction(self._pool) as conn:
            rows = fetch_all(conn, Q["claim_unpublished"], {"limit": limit})

            def mark(seqs: Sequence[int]) -> None:
                if seqs:
                    conn.execute(Q["mark_published"].encode(), {"seqs": list(seqs)})

            yield [(row["seq"], event_from_row(row)) for row in rows], mark
