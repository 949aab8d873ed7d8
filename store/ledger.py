"""The ledger in PostgreSQL: append events with a gapless per-project seq, read, verify.

``ledger_event`` is append-only in the database itself (a trigger refuses UPDATE, DELETE
and TRUNCATE; the privileges are revoked from PUBLIC: ``migrations/0005_ledger.sql``). An
append is one statement (``append_events`` in ``store/sql/ledger.sql``): it moves the
project's ``ledger_head`` forward by the number of events and inserts them at the seqs it
freed. The head row stays locked until the writing transaction ends, so appenders of one
project serialise on it, seqs are gapless, and a transaction that rolls back (or whose
process dies) takes its seqs with it. Appenders of different projects do not wait on each
other. ``seq`` is the order; ``recorded_at`` is the writing transaction's start and may not
be monotonic in it.

:func:`append_on` (also :meth:`Ledger.append_on`) writes on the caller's connection, in its
transaction (a step's settle writes its events with it); :meth:`Ledger.append` opens its own.
Writers are strict: only a :class:`~workflows.ledger.NewEvent` of an
:class:`~workflows.ledger.EventKind` is written.
Readers are forward compatible: a stored kind this vibey does not know is read as an
:class:`~workflows.ledger.UnrecognizedEventKind`.

Exceptions::

    StoreError
    └── LedgerWriteRefused   an event this vibey may not write (see NewEvent)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any
from uuid import UUID

from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from store.db import Conn, Pool, fetch_all, fetch_one, statement, transaction
from store.errors import StoreError
from store.retry import retried
from store.sql import load
from workflows.ledger import (
    EventKind,
    LedgerEvent,
    LedgerVerification,
    NewEvent,
    parse_kind,
    verify_events,
)

Q = load("ledger.sql")
# verify streams the events through a server-side cursor, this many rows a round trip.
VERIFY_BATCH = 2000

__all__ = ["Ledger", "LedgerVerification", "LedgerWriteRefused", "append_on"]


def append_on(
    conn: Conn,
    project_id: str,
    events: Sequence[NewEvent],
    *,
    causation_id: str | None = None,
    correlation_id: str | None = None,
    job_id: UUID | None = None,
    workflow_id: UUID | None = None,
) -> list[LedgerEvent]:
    """Append ``events`` in order within the caller's transaction: they get the next seqs of
    ``project_id``, and every other appender of that project waits until the transaction
    ends. All the events share the ids given. Returns them as stored."""
    _check_writable(project_id, events)
    if not events:
        return []
    rows = fetch_all(
        conn,
        Q["append_events"],
        {
            "project_id": project_id,
            "n": len(events),
            "kinds": [e.kind.value for e in events],
            "payloads": [Jsonb(dict(e.payload)) for e in events],
            "digests": [e.digest for e in events],
            "causation_id": causation_id,
            "correlation_id": correlation_id,
            "job_id": job_id,
            "workflow_id": workflow_id,
        },
    )
    rows.sort(key=lambda r: int(r["seq"]))
    return [
        LedgerEvent(
            project_id=project_id,
            seq=int(row["seq"]),
            kind=event.kind,
            payload=event.payload,
            digest=event.digest,
            causation_id=causation_id,
            correlation_id=correlation_id,
            job_id=job_id,
            workflow_id=workflow_id,
            recorded_at=row["recorded_at"],
        )
        for event, row in zip(events, rows, strict=True)
    ]


class LedgerWriteRefused(StoreError):
    pass


class Ledger:
    """Appends to, reads and verifies projects' ledgers on ``pool``."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    @retried("append to the ledger", idempotent=False)
    def append(
        self,
        project_id: str,
        events: Sequence[NewEvent],
        *,
        causation_id: str | None = None,
        correlation_id: str | None = None,
        job_id: UUID | None = None,
        workflow_id: UUID | None = None,
    ) -> list[LedgerEvent]:
        """Append ``events`` in order, in a transaction of their own."""
        with transaction(self._pool) as conn:
            return self.append_on(
                conn,
                project_id,
                events,
                causation_id=causation_id,
                correlation_id=correlation_id,
                job_id=job_id,
                workflow_id=workflow_id,
            )

    # On the caller's connection, in its transaction: see :func:`append_on`.
    append_on = staticmethod(append_on)

    @retried("read the ledger", idempotent=True)
    def read(
        self, project_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[LedgerEvent]:
        """The project's events with seq > ``after``, in seq order, at most ``limit``."""
        with statement(self._pool) as conn:
            rows = fetch_all(
                conn, Q["read_events"], {"project_id": project_id, "after": after, "limit": limit}
            )
        return [event_from_row(row) for row in rows]

    @retried("read the ledger's head", idempotent=True)
    def head(self, project_id: str) -> int:
        """The project's last assigned seq; 0 when it has never had an event."""
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["head"], {"project_id": project_id})
        return 0 if row is None else int(row["last_seq"])

    @retried("verify the ledger", idempotent=True)
    def verify(self, project_id: str) -> LedgerVerification:
        """Recompute every digest and check the seqs and the head, in one snapshot
        (:func:`workflows.ledger.verify_events`)."""
        with transaction(self._pool) as conn:
            conn.execute(Q["verify_snapshot"].encode())
            row = fetch_one(conn, Q["head"], {"project_id": project_id})
            last_seq = 0 if row is None else int(row["last_seq"])
            return verify_events(_stream(conn, project_id), last_seq=last_seq)


def _stream(conn: Conn, project_id: str) -> Iterator[LedgerEvent]:
    with conn.cursor(name="ledger_verify", row_factory=dict_row) as cur:
        cur.itersize = VERIFY_BATCH
        cur.execute(Q["all_events"].encode(), {"project_id": project_id})
        for row in cur:
            yield event_from_row(row)


def _check_writable(project_id: str, events: Sequence[NewEvent]) -> None:
    if not isinstance(project_id, str) or not project_id:
        raise LedgerWriteRefused(f"a ledger needs a project id, not {project_id!r}")
    for index, event in enumerate(events):
        if not isinstance(event, NewEvent) or not isinstance(event.kind, EventKind):
            kind: Any = getattr(event, "kind", None)
            raise LedgerWriteRefused(
                f"event {index} of {len(events)} for {project_id} is not a NewEvent of a known "
                f"kind ({type(event).__name__}, kind {kind!r}): a kind this vibey does not "
                "know is read, never written"
            )


def event_from_row(row: DictRow) -> LedgerEvent:
    return LedgerEvent(
        project_id=row["project_id"],
        seq=int(row["seq"]),
        kind=parse_kind(row["kind"]),
        payload=row["payload"],
        digest=row["digest"],
        causation_id=row["causation_id"],
        correlation_id=row["correlation_id"],
        job_id=row["job_id"],
        workflow_id=row["workflow_id"],
        recorded_at=row["recorded_at"],
    )
