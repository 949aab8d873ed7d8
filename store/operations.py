"""What operators read, and what keeps the outbox bounded (``store/sql/operations.sql``).

* reconcile heartbeats: every reconciling process upserts its last pass;
* dead letters kept: a message the dead-letter queue held that names no job vibey can park
  is stored with its reason, never only logged (``vibey queue dead`` lists them);
* :meth:`OperationsStore.prune_outbox`: sent outbox rows past their retention, in batches;
* the counts behind the metrics, ``vibey queue stats`` and ``vibey doctor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from store.db import Pool, fetch_all, fetch_one, statement
from store.sql import load

Q = load("operations.sql")
PRUNE_BATCH = 1000


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    queue: str
    routing_key: str
    reason: str
    detail: str | None
    body: bytes
    headers: Mapping[str, Any]
    message_id: str | None
    received_at: datetime


@dataclass(frozen=True, slots=True)
class Heartbeat:
    owner: str
    at: datetime
    age_s: float
    duration_ms: int
    report: Mapping[str, Any]


class OperationsStore:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    def record_heartbeat(self, owner: str, duration: timedelta, report: Mapping[str, Any]) -> None:
        params = {
            "owner": owner,
            "duration_ms": max(int(duration.total_seconds() * 1000), 0),
            "report": Jsonb(dict(report)),
        }
        with statement(self._pool) as conn:
            conn.execute(Q["record_heartbeat"].encode(), params)

    def latest_heartbeat(self) -> Heartbeat | None:
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["latest_heartbeat"], {})
        if row is None:
            return None
        return Heartbeat(row["owner"], row["at"], row["age_s"], row["duration_ms"], row["report"])

    def keep_dead_letter(
        self,
        *,
        queue: str,
        routing_key: str,
        reason: str,
        body: bytes,
        detail: str | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> int:
        params = {
            "queue": queue,
            "routing_key": routing_key,
            "reason": reason,
            "detail": detail,
            "body": body,
            "headers": Jsonb({k: _plain(v) for k, v in (headers or {}).items()}),
            "message_id": message_id,
        }
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["keep_dead_letter"], params)
        assert row is not None  # RETURNING id
        return int(row["id"])

    def dead_letters(self, *, after: int | None = None, limit: int = 100) -> list[DeadLetter]:
        with statement(self._pool) as conn:
            rows = fetch_all(conn, Q["dead_letters"], {"after": after, "limit": limit})
        return [DeadLetter(**{**row, "body": bytes(row["body"])}) for row in rows]

    def dead_letter_count(self) -> int:
        return self._count("dead_letter_count")

    def prune_outbox(self, *, retention: timedelta, batch: int = PRUNE_BATCH) -> int:
        """Delete sent rows older than ``retention``, ``batch`` at a time; the number deleted."""
        total = 0
        params = {"retention_s": retention.total_seconds(), "batch": batch}
        while True:
            with statement(self._pool) as conn:
                deleted = conn.execute(Q["prune_outbox"].encode(), params).rowcount
            total += deleted
            if deleted < batch:
                return total

    def live_jobs(self) -> list[tuple[str, str, int]]:
        rows = self._rows("live_jobs")
        return [(row["state"], row["kind"], int(row["n"])) for row in rows]

    def outbox_lag(self) -> tuple[int, float]:
        (row,) = self._rows("outbox_lag")
        return int(row["unsent"]), float(row["oldest_s"])

    def open_gate_ages(self) -> list[tuple[str, int, float]]:
        return [
            (r["kind"], int(r["n"]), float(r["oldest_s"])) for r in self._rows("open_gate_ages")
        ]

    def circuits(self) -> list[tuple[str, str, str]]:
        rows = self._rows("circuits")
        return [(r["engine_id"], r["circuit_state"], r["capacity_state"]) for r in rows]

    def oldest_ready(self) -> Mapping[str, Any] | None:
        rows = self._rows("oldest_ready")
        return rows[0] if rows else None

    def _rows(self, name: str) -> list[Any]:
        with statement(self._pool) as conn:
            return fetch_all(conn, Q[name], {})

    def _count(self, name: str) -> int:
        (row,) = self._rows(name)
        return int(row["n"])


def _plain(value: Any) -> Any:
    """An AMQP header value as JSON (bytes as text, nested tables and lists followed)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
