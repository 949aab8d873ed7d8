"""Reconcile: what keeps the broker and the record in agreement whatever crashed.

In order: reap expired leases (with a redispatch at a new generation, or a park when the
attempts are spent), sweep lost dispatches (claimable rows whose pointer never arrived), drain
the outbox (rows nobody holds, or a dead relay held), park the jobs whose pointers the
dead-letter queue holds (they exceeded the delivery limit: they killed their consumer every
time), prune sent outbox rows and archive finished workflows past their retention. Every
step is idempotent and safe to run in several processes at once (constraints, SKIP LOCKED,
generation checks). APScheduler runs it every ``interval`` in each worker.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from actors import amqp, metrics
from actors.relay import Relay
from actors.topology import DETAIL_HEADER, REASON_HEADER, QueueNames
from store.dispatch import DeadLetterOutcome, DispatchRecords
from store.jobs import PostgresJobRepository
from store.operations import OperationsStore
from store.retention import WorkflowRetention
from workflows.dispatch import EnvelopeError, decode

log = logging.getLogger(__name__)

DEAD_LETTER_REASON = "delivery limit exceeded: its pointer killed its consumer every time"


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    requeued: int
    parked: int
    swept: int
    drained: int
    dead_letters_parked: int
    dead_letters_kept: int = 0  # malformed or rejected: stored in dead_letter, never dropped
    pruned: int = 0  # sent outbox rows past their retention
    archived: int = 0  # finished workflows past theirs (jobs and gates deleted, history kept)


class Reconciler:
    def __init__(
        self,
        *,
        jobs: PostgresJobRepository,
        records: DispatchRecords,
        relay: Relay,
        url: str,
        names: QueueNames,
        redispatch_after: timedelta = timedelta(minutes=2),
        reclaim_after: timedelta = timedelta(seconds=30),
        operations: OperationsStore | None = None,
        outbox_retention: timedelta = timedelta(days=1),
        retention: WorkflowRetention | None = None,
        owner: str = "reconciler",
    ) -> None:
        """With ``operations``: dead letters that name no job are kept there, sent outbox
        rows past ``outbox_retention`` are pruned, and each pass records its heartbeat. With
        ``retention``: finished workflows past it are archived (``store.retention``)."""
        self._jobs = jobs
        self._records = records
        self._relay = relay
        self._url = url
        self._names = names
        self._redispatch_after = redispatch_after
        self._reclaim_after = reclaim_after
        self._ops = operations
        self._retention = outbox_retention
        self._workflow_retention = retention
        self._owner = owner
        self._kept = 0
        self._scheduler: BackgroundScheduler | None = None
        self._connection: amqp.BlockingConnection | None = None
        self._dead_channel: Any = None
        self._lock = threading.Lock()

    def run_once(self) -> ReconcileReport:
        started = time.monotonic()
        reaped = self._jobs.reap()
        swept = self._records.sweep_lost(redispatch_after=self._redispatch_after)
        drained = self._relay.drain(reclaim_after=self._reclaim_after)
        self._kept = 0
        parked = self.drain_dead_letters()
        pruned = 0 if self._ops is None else self._ops.prune_outbox(retention=self._retention)
        retention = self._workflow_retention
        archived = 0 if retention is None else retention.archive().workflows
        report = ReconcileReport(
            reaped.requeued,
            reaped.parked,
            len(swept),
            drained,
            parked,
            self._kept,
            pruned,
            archived,
        )
        elapsed = time.monotonic() - started
        metrics.observe_reconcile(asdict(report), elapsed)
        if self._ops is not None:
            self._ops.record_heartbeat(self._owner, timedelta(seconds=elapsed), asdict(report))
        return report

    def drain_dead_letters(self, *, limit: int = 500) -> int:
        """Park the job of every pointer in the dead-letter queue; count the parks. A message
        that names no job (rejected as malformed, with its reason) is kept in dead_letter."""
        parked = 0
        with self._lock:
            try:
                channel = self._channel()
                for _ in range(limit):
                    method, properties, body = channel.basic_get(self._names.dead_queue)
                    if method is None:
                        break
                    parked += self._park(properties, body, method.routing_key)
                    channel.basic_ack(method.delivery_tag)
            except amqp.AMQPError:
                self._close()
                raise
        return parked

    def _channel(self) -> Any:
        """One connection kept open across runs (reopened after an error)."""
        if self._connection is None or not self._connection.is_open:
            self._connection = amqp.connect(self._url)
            self._dead_channel = None
        if self._dead_channel is None or not self._dead_channel.is_open:
            self._dead_channel = self._connection.channel()
        return self._dead_channel

    def _close(self) -> None:
        connection, self._connection, self._dead_channel = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(amqp.AMQPError):
                connection.close()

    def _park(self, properties: Any, body: bytes, routing_key: str) -> int:
        headers: Mapping[str, Any] = properties.headers or {}
        if REASON_HEADER in headers:
            self._keep(properties, body, routing_key, headers[REASON_HEADER])
            return 0
        try:
            envelope = decode(body)
        except EnvelopeError as exc:
            self._keep(properties, body, routing_key, str(exc.reason), str(exc))
            return 0
        outcome = self._records.park_dead_letter(
            job_id=envelope.job_id,
            project_id=envelope.project_id,
            seq=envelope.dispatch_seq,
            reason=DEAD_LETTER_REASON,
        )
        return int(outcome is DeadLetterOutcome.PARKED)

    def _keep(
        self, properties: Any, body: bytes, routing_key: str, reason: Any, detail: str | None = None
    ) -> None:
        """Store a dead letter that names no job (before its ack: kept, never only logged)."""
        headers: Mapping[str, Any] = properties.headers or {}
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", errors="replace")
        if detail is None and DETAIL_HEADER in headers:
            detail = str(headers[DETAIL_HEADER])
        if self._ops is None:
            log.warning("dead letter dropped (%s): %r", reason, body[:200])
            return
        self._ops.keep_dead_letter(
            queue=self._names.dead_queue,
            routing_key=routing_key,
            reason=str(reason),
            detail=detail,
            body=body,
            headers=headers,
            message_id=properties.message_id,
        )
        self._kept += 1

    # -- on a schedule ---------------------------------------------------------------------

    def start(self, *, interval: timedelta) -> None:
        scheduler = BackgroundScheduler(daemon=True)
        scheduler.add_job(
            self._scheduled,
            "interval",
            seconds=interval.total_seconds(),
            max_instances=1,
            coalesce=True,
            id="vibey-reconcile",
        )
        scheduler.start()
        self._scheduler = scheduler

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        with self._lock:
            self._close()

    def _scheduled(self) -> None:
        try:
            report = self.run_once()
        except amqp.AMQPError as exc:
            metrics.RECONCILE_FAILURES.inc()
            log.warning("reconcile: RabbitMQ unavailable (%s); retrying next interval", exc)
            return
        except Exception:
            metrics.RECONCILE_FAILURES.inc()
            log.exception("reconcile failed; it runs again at the next interval")
            return
        if any(asdict(report).values()):
            log.info("reconcile: %s", report)
