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

from actors import amqp, metrics, tracing
from actors.capabilities import detect
from actors.drive import reap_once
from actors.event_publisher import EventService
from actors.reconcile import Reconciler
from actors.relay import Relay, Router
from actors.worker import WorkerConfig, dead_queue_depth, event_service, load_registry
from store.dispatch import DispatchRecords
from store.errors import StoreError
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.operations import OperationsStore
from store.pool import open_pool
from store.retention import WorkflowRetention
from store.routes import RouteCache
from store.workflows import WorkflowStore
from workflows.engine import Registry

log = logging.getLogger(__name__)


class ReconcileService:
    def __init__(self, config: WorkerConfig, *, owner: str | None = None) -> None:
        self.config = config
        self.owner = owner or f"reconcile:{socket.gethostname()}:{os.getpid()}"
        self.pool = open_pool(config.pg_url, min_size=1, max_size=3, name="vibey-reconcile")
        self.last_error: str | None = None
        self.relay: Relay | None = None
        self.routes: RouteCache | None = None
        self.reconciler: Reconciler | None = None
        self.operations = OperationsStore(self.pool)
        self.retention = WorkflowRetention(
            self.pool, retention=timedelta(seconds=config.workflow.archive_after_seconds)
        )
        registry = load_registry(config.workflow.definitions)
        kinds = registry.kinds
        leases = config.queue.lease.resolved(kinds.canonical)
        if config.queue.backend == "postgres":
            self.jobs = PostgresJobRepository(pool=self.pool, leases=leases)
            self.events = self._events(registry)
            return
        records = DispatchRecords(pool=self.pool, relay_id=self.owner)
        self.routes = RouteCache(url=config.pg_url, pool=self.pool)
        self.relay = Relay(
            url=config.amqp_url,
            records=records,
            router=Router(
                names=config.names,
                tiers=config.queue.rabbitmq.wait_tiers,
                dedicated=self.routes,
                kinds=kinds,
            ),
        )
        self.jobs = PostgresJobRepository(
            pool=self.pool,
            leases=leases,
            dispatch=True,
            relay_id=self.owner,
            after_commit=self.relay.submit,
        )
        self.events = self._events(registry)
        self.reconciler = Reconciler(
            jobs=self.jobs,
            records=records,
            relay=self.relay,
            url=config.amqp_url,
            names=config.names,
            redispatch_after=timedelta(seconds=config.queue.rabbitmq.redispatch_after_seconds),
            reclaim_after=timedelta(seconds=config.queue.rabbitmq.reclaim_after_seconds),
            operations=self.operations,
            outbox_retention=timedelta(seconds=config.queue.rabbitmq.outbox_retention_seconds),
            retention=self.retention,
            owner=self.owner,
        )

    def _events(self, registry: Registry) -> EventService:
        tracer = tracing.step_tracer(
            self.config.tracing.otlp_endpoint, service_name=self.config.tracing.service_name
        )
        workflows = WorkflowStore(
            pool=self.pool,
            jobs=self.jobs,
            registry=registry,
            ledger=Ledger(self.pool),
            events=tracing.event_spans(tracer),  # a gate deadline's span
        )
        return event_service(self.config, self.pool, workflows)

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
