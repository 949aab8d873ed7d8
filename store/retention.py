"""Retention for finished workflows (``store/sql/retention.sql``).

A workflow finished longer ago than the retention, whose jobs are all terminal, is archived a
batch at a time: its history becomes one ``workflow_archive`` row (``vibey workflow history``
still reads it, through the ``workflow_history_all`` view), and its jobs, their dependencies
and outbox rows, and its gates are deleted. The workflow row stays; the ledger is never
pruned. Published domain events older than the retention are deleted too (the outbox of
``vibey.events``: its consumers have had them as long as a finished workflow's history).
Each batch is one transaction holding its workflows with SKIP LOCKED, so reconcilers in
several processes share the work and a crash leaves a batch whole or untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from store.db import Pool, fetch_all, fetch_one, statement, transaction
from store.sql import load

Q = load("retention.sql")
ARCHIVE_BATCH = 100  # workflows per transaction
MAX_BATCHES = 10  # per call: a reconcile pass stays bounded however large the backlog
EVENT_BATCH = 5000  # domain events a statement deletes (one a step or so: 50,000 a pass)


@dataclass(frozen=True, slots=True)
class Archived:
    workflows: int
    jobs: int
    events: int = 0  # published domain events pruned


class WorkflowRetention:
    def __init__(self, pool: Pool, *, retention: timedelta) -> None:
        self._pool = pool
        self._retention_s = retention.total_seconds()

    def archive(self, *, batch: int = ARCHIVE_BATCH, max_batches: int = MAX_BATCHES) -> Archived:
        """Archive up to ``batch * max_batches`` finished workflows past the retention."""
        workflows = jobs = 0
        for _ in range(max_batches):
            picked, deleted = self._archive_batch(batch)
            workflows += picked
            jobs += deleted
            if picked < batch:
                break
        return Archived(workflows, jobs, self.prune_events())

    def prune_events(
        self, *, batch: int = ARCHIVE_BATCH * 10, max_batches: int = MAX_BATCHES
    ) -> int:
        """Delete published domain events past the retention, ``batch`` rows at a time."""
        total = 0
        params = {"retention_s": self._retention_s, "batch": batch}
        for _ in range(max_batches):
            with statement(self._pool) as conn:
                deleted = conn.execute(Q["prune_events"].encode(), params).rowcount
            total += deleted
            if deleted < batch:
                break
        return total

    def _archive_batch(self, batch: int) -> tuple[int, int]:
        with transaction(self._pool) as conn:
            rows = fetch_all(
                conn, Q["pick_finished"], {"retention_s": self._retention_s, "batch": batch}
            )
            if not rows:
                return 0, 0
            ids = {"ids": [row["id"] for row in rows]}
            for name in ("archive_history", "delete_history", "delete_workflow_gates"):
                conn.execute(Q[name].encode(), ids)
            conn.execute(Q["delete_job_gates"].encode(), ids)
            conn.execute(Q["delete_dependencies"].encode(), ids)
            deleted = conn.execute(Q["delete_jobs"].encode(), ids).rowcount
            conn.execute(Q["mark_archived"].encode(), ids)
        return len(rows), deleted

    def archived_count(self) -> int:
        with statement(self._pool) as conn:
            row = fetch_one(conn, Q["archived_count"], {})
        assert row is not None  # count(*)
        return int(row["n"])
