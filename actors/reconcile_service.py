"""``vibey reconcile``: the reconciler on its own, without consuming any queue.

Every worker reconciles, but an autoscaled fleet may have no worker running (KEDA scales it
to zero), and the dispatches a gate answer commits still have to be sent. This process does
only that, every ``reconcile_interval``: on the rabbitmq backend :class:`actors.reconcile.
Reconciler` (reap with a redispatch, sweep lost dispatches, drain the outbox, park dead
letters); on the postgres backend the reaper. Several at once are harmless.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from actors import amqp, metrics
from actors.capabilities import detect
from actors.drive import reap_once
from actors.worker import (
    WorkerConfig,
    config_reconciler,
    dead_queue_depth,
    event_service,
    open_graph,
)
from store.errors import StoreError
from store.operations import OperationsStore
from store.retention import WorkflowRetention

log = logging.getLogger(__name__)


class ReconcileService:
    def __init__(self, config: WorkerConfig, *, owner: str | None = None) -> None:
        self.config = config
        self.owner = owner or f"reconcile:{socket.gethostname()}:{os.getpid()}"
        rabbitmq = config.queue.backend != "postgres"
        graph = open_graph(
            config, owner=self.owner, pool_size=3, relay=rabbitmq, name="vibey-reconcile"
        )
        self.pool, self.jobs = graph.pool, graph.jobs
        self.relay, self.routes = graph.relay, graph.routes
        self.last_error: str | None = None
        self.operations = OperationsStore(self.pool)
        self.retention = WorkflowRetention(
            self.pool, retention=timedelta(seconds=config.workflow.archive_after_seconds)
        )
        self.reconciler = config_reconciler(config, graph) if rabbitmq else None
        self.events = event_service(config, self.pool, graph.workflows)  # gate deadlines

    def run_once(self) -> Any:
        """One pass; returns what it found (a ReconcileReport, or the reaper's ReapResult)."""
        if self.reconciler is None:
            return reap_once(self.jobs, self.operations, self.owner, self.retention)
        return self.reconciler.run_once()

    def declare(self) -> None:
        """Declare the topology, as a worker does (the dead-letter queue it drains among it)."""
        connection = amqp.connect(self.config.amqp_url)
        try:
            self.config.topology().declare(connection.channel(), detect(connection))
        finally:
            connection.close()

    def run(self, stop: threading.Event, *, report: Callable[[Any], None] | None = None) -> int:
        """Reconcile every interval until ``stop``; returns the passes that failed."""
        failures = 0
        server = None
        if self.config.metrics.port is not None:
            collector = metrics.StoreCollector(
                self.operations, dead_queue_depth=dead_queue_depth(self.config)
            )
            server = metrics.MetricsServer(port=self.config.metrics.port, collectors=[collector])
            server.start()
        try:
            if self.relay is not None:
                self.declare()
                if self.routes is not None:
                    self.routes.start()
                self.relay.start()
            self.events.start()
            while True:
                try:
                    found = self.run_once()
                except (StoreError, amqp.AMQPError) as exc:
                    metrics.RECONCILE_FAILURES.inc()
                    failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("reconcile: %s; again at the next interval", exc)
                else:
                    if report is not None:
                        report(found)
                if stop.wait(self.config.queue.rabbitmq.reconcile_interval_seconds):
                    return failures
        finally:
            if server is not None:
                server.stop()
            self.close()

    def close(self) -> None:
        self.events.stop()
        if self.reconciler is not None:
            self.reconciler.stop()
        if self.relay is not None:
            self.relay.stop()
        if self.routes is not None:
            self.routes.stop()
        self.pool.close()
