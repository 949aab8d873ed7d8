"""The postgres backend's worker process: the drive loop, no broker.

:class:`PostgresRuntime` is what ``vibey worker`` runs in each process on
``backend = "postgres"``: ``threads`` drive threads, each claiming one job at a time with
:func:`store.drive.claim_next` (``FOR UPDATE SKIP LOCKED``, across the projects it serves)
and running it through the same :class:`actors.steps.StepRunner` as a Dramatiq actor does
(heartbeat, handler, one settle with the workflow's event). Idle threads sleep on a
condition that a listener thread wakes on ``NOTIFY vibey_job_ready`` (or after
``poll_interval``, the backstop); a reaper thread returns expired leases every
``reconcile_interval``. SIGTERM (``stop``) lets every running step settle, then returns.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta

from actors import metrics
from actors.graph import StepTally
from actors.steps import StepResult
from actors.worker import WorkerConfig, config_runner, event_service, open_graph
from store.drive import Work, build_kinds, claim_next
from store.errors import StoreError
from store.jobs import PostgresJobRepository
from store.notify import PostgresJobReadyNotifier
from store.operations import OperationsStore
from store.retention import WorkflowRetention
from workflows.queue import ReapResult
from workflows.steps import Handlers

log = logging.getLogger(__name__)

ERROR_PAUSE_S = 1.0  # after a store error, before claiming again


class PostgresRuntime:
    """One postgres-backend worker process's parts, started and stopped together."""

    def __init__(
        self, config: WorkerConfig, *, handlers: Handlers | None = None, owner: str | None = None
    ) -> None:
        self.config = config
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        graph = open_graph(
            config, owner=self.owner, pool_size=config.worker.threads + 3, relay=False
        )
        self.pool, self.jobs, self.workflows = graph.pool, graph.jobs, graph.workflows
        self.tracer = graph.tracer
        self.operations = OperationsStore(self.pool)
        self.retention = WorkflowRetention(
            self.pool, retention=timedelta(seconds=config.workflow.archive_after_seconds)
        )
        self.tally = StepTally(config.tally_dir)
        self.results = self.tally.results
        self.runner = config_runner(config, graph, handlers=handlers, tally=self.tally)
        self.work = Work.for_lanes(
            config.worker.lanes,
            config.projects or None,
            build_kinds=build_kinds(graph.registry.kinds),
        )
        self._stop = threading.Event()
        self._wake = threading.Condition()
        self._notifier = PostgresJobReadyNotifier(url=config.pg_url)
        self._threads: list[threading.Thread] = []
        self.events = event_service(config, self.pool, self.workflows)  # gate deadlines

    def start(self) -> None:
        self._notifier.listen()  # before the first claim: no notification is missed
        loops = [(f"drive-{n}", self._drive) for n in range(self.config.worker.threads)]
        loops += [("listen", self._listen), ("reap", self._reap)]
        for name, target in loops:
            thread = threading.Thread(target=target, name=f"vibey-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self.events.start()

    def stop(self, *, timeout: float | None = None) -> int:
        """Stop claiming, let running steps settle for up to ``timeout`` seconds (default:
        ``config.drain_grace``, one deadline for every thread), then close everything.
        Returns the number of steps cut at the grace (their leases expire and are reaped)."""
        grace = self.config.drain_grace.total_seconds() if timeout is None else timeout
        deadline = time.monotonic() + max(grace, 0.0)
        self.events.stop()
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        cut = sum(1 for thread in self._threads if thread.is_alive())
        if cut:
            log.warning("drain: %d step(s) still running after the %g s grace", cut, grace)
        self.runner.close()
        self._notifier.close()
        self.pool.close()
        return cut

    def run_one(self) -> StepResult | None:
        """Claim and run one job; None when nothing was claimable."""
        started = time.time_ns()
        jobs = claim_next(self.pool, self.work, owner=self.owner)
        if not jobs:
            return None
        if self.tracer is not None:
            self.tracer.claimed(jobs[0], started)
        return self.runner.run_claimed(jobs[0])

    def _drive(self) -> None:
        idle = self.config.queue.poll_interval_seconds
        while not self._stop.is_set():
            try:
                if self.run_one() is not None:
                    continue
            except StoreError as exc:
                log.warning("drive loop: %s; claiming again in %g s", exc, ERROR_PAUSE_S)
                self._stop.wait(ERROR_PAUSE_S)
                continue
            with self._wake:
                if not self._stop.is_set():
                    self._wake.wait(timeout=idle)

    def _listen(self) -> None:
        projects = self.config.projects or None
        idle = self.config.queue.poll_interval_seconds
        while not self._stop.is_set():
            if self._notifier.wait_for(projects, timeout=min(idle, 1.0)):
                with self._wake:
                    self._wake.notify_all()

    def _reap(self) -> None:
        interval = self.config.queue.rabbitmq.reconcile_interval_seconds
        while not self._stop.wait(interval):
            try:
                reaped = reap_once(self.jobs, self.operations, self.owner, self.retention)
            except StoreError as exc:
                metrics.RECONCILE_FAILURES.inc()
                log.warning("reap: %s; again in %g s", exc, interval)
                continue
            if reaped.requeued or reaped.parked:
                log.info("reap: %s", reaped)


def reap_once(
    jobs: PostgresJobRepository,
    operations: OperationsStore,
    owner: str,
    retention: WorkflowRetention | None = None,
) -> ReapResult:
    """The postgres backend's reconcile: reap expired leases, archive finished workflows past
    their retention; its metrics and heartbeat."""
    started = time.monotonic()
    reaped = jobs.reap()
    archived = 0 if retention is None else retention.archive().workflows
    elapsed = time.monotonic() - started
    findings = {"requeued": reaped.requeued, "parked": reaped.parked, "archived": archived}
    metrics.observe_reconcile(findings, elapsed)
    operations.record_heartbeat(owner, timedelta(seconds=elapsed), findings)
    return reaped
