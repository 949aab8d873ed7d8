"""Reconcile: what keeps the broker and the record in agreement whatever crashed.

In order: reap expired leases (with a redispatch at a new generation, or a park when the
attempts are spent), sweep lost dispatches (claimable rows whose pointer never arrived), drain
the outbox (rows nobody holds, or a dead relay held), and park the jobs whose pointers the
dead-letter queue holds (they exceeded the delivery limit: they killed their consumer every
time). Every step is idempotent and safe to run in several processes at once (constraints,
SKIP LOCKED, generation checks). APScheduler runs it every ``interval`` in each worker.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pika
import pika.exceptions
from apscheduler.schedulers.background import BackgroundScheduler

from actors.deliveries import REASON_HEADER
from actors.relay import Relay
from actors.topology import QueueNames
from store.dispatch import DeadLetterOutcome, DispatchRecords
from store.jobs import PostgresJobRepository
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


class Reconciler:
    def __init__(
        self,
        *,
        store: PostgresJobRepository,
        records: DispatchRecords,
        relay: Relay,
        url: str,
        names: QueueNames,
        redispatch_after: timedelta = timedelta(minutes=2),
        reclaim_after: timedelta = timedelta(seconds=30),
    ) -> None:
        self._store = store
        self._records = records
        self._relay = relay
        self._url = url
        self._names = names
        self._redispatch_after = redispatch_after
        self._reclaim_after = reclaim_after
        self._scheduler: BackgroundScheduler | None = None
        self._connection: pika.BlockingConnection | None = None
        self._dead_channel: Any = None
        self._lock = threading.Lock()

    def run_once(self) -> ReconcileReport:
        reaped = self._store.reap()
        swept = self._records.sweep_lost(redispatch_after=self._redispatch_after)
        drained = self._relay.drain(reclaim_after=self._reclaim_after)
        parked = self.drain_dead_letters()
        return ReconcileReport(reaped.requeued, reaped.parked, len(swept), drained, parked)

    def drain_dead_letters(self, *, limit: int = 500) -> int:
        """Park the job of every pointer in the dead-letter queue; count the parks. Pointers
        rejected as malformed carry their reason and were logged when rejected."""
        parked = 0
        with self._lock:
            try:
                channel = self._channel()
                for _ in range(limit):
                    method, properties, body = channel.basic_get(self._names.dead_queue)
                    if method is None:
                        break
                    parked += self._park(properties, body)
                    channel.basic_ack(method.delivery_tag)
            except pika.exceptions.AMQPError:
                self._close()
                raise
        return parked

    def _channel(self) -> Any:
        """One connection kept open across runs (reopened after an error)."""
        if self._connection is None or not self._connection.is_open:
            self._connection = pika.BlockingConnection(pika.URLParameters(self._url))
            self._dead_channel = None
        if self._dead_channel is None or not self._dead_channel.is_open:
            self._dead_channel = self._connection.channel()
        return self._dead_channel

    def _close(self) -> None:
        connection, self._connection, self._dead_channel = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()

    def _park(self, properties: Any, body: bytes) -> int:
        headers: Mapping[str, Any] = properties.headers or {}
        if REASON_HEADER in headers:
            return 0
        try:
            envelope = decode(body)
        except EnvelopeError:
            return 0
        outcome = self._records.park_dead_letter(
            job_id=envelope.job_id,
            project_id=envelope.project_id,
            seq=envelope.dispatch_seq,
            reason=DEAD_LETTER_REASON,
        )
        return int(outcome is DeadLetterOutcome.PARKED)

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
        except pika.exceptions.AMQPError as exc:
            log.warning("reconcile: RabbitMQ unavailable (%s); retrying next interval", exc)
            return
        except Exception:
            log.exception("reconcile failed; it runs again at the next interval")
            return
        if report.requeued or report.parked or report.swept or report.dead_letters_parked:
            log.info("reconcile: %s", report)
