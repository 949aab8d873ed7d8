"""Prometheus metrics of the runtime, and the HTTP endpoint that serves them.

Two kinds of metrics:

* **Events**, recorded where they happen, in every worker process (counters and histograms,
  module-level as prometheus-client has them): step results, step duration by kind and
  outcome, dispatch latency (from the moment a job was due to its handler's start), reconcile
  passes' duration and findings. Under ``vibey worker`` the supervisor points
  ``PROMETHEUS_MULTIPROC_DIR`` at a folder of its own before its processes start
  (:func:`use_multiprocess_dir`), so their values are summed at each scrape.
* **State**, read at each scrape by :class:`StoreCollector`, in the serving process. From
  PostgreSQL (``vibey_store_up`` says whether it answered): live jobs by state and kind, the
  outbox's unsent rows and the age of the oldest, open gates and the oldest wait by kind, kept
  dead letters, every engine's circuit, the reconcile heartbeat. From RabbitMQ
  (``vibey_broker_up``, rabbitmq backend): the dead-letter queue's depth, read over one
  long-lived connection (:class:`QueueDepth`). The two sources are read apart: a broker outage
  leaves every PostgreSQL gauge in the scrape, and a database outage the broker's.

:class:`MetricsServer` serves ``/metrics`` and ``/healthz`` (200 while the process serves;
the pods' liveness probe) on ``[metrics] port`` (``VIBEY_METRICS_PORT``).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector

from store.operations import OperationsStore
from workflows.dispatch import Lane
from workflows.kinds import StepKinds
from workflows.queue import Job
from workflows.steps import Handler, Handlers, Outcome, Short

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

STEP_RESULTS = Counter("vibey_step_results", "Step executions by how they ended", ["result"])
STEP_DURATION = Histogram(
    "vibey_step_duration_seconds",
    "A step handler's run time",
    ["kind", "outcome"],
    buckets=_DURATION_BUCKETS,
)
DISPATCH_LATENCY = Histogram(
    "vibey_dispatch_latency_seconds",
    "From the moment a job was due (its commit, or its delay's end) to its handler's start",
    ["lane"],
    buckets=_LATENCY_BUCKETS,
)
RECONCILE_DURATION = Histogram(
    "vibey_reconcile_duration_seconds", "A reconcile pass's run time", buckets=_LATENCY_BUCKETS
)
RECONCILE_FINDINGS = Counter(
    "vibey_reconcile_findings", "What reconcile passes found and fixed", ["finding"]
)
RECONCILE_FAILURES = Counter("vibey_reconcile_failures", "Reconcile passes that failed")


def use_multiprocess_dir() -> str:
    """Point this process and the children it starts at a metrics folder (created once)."""
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        path = tempfile.mkdtemp(prefix="vibey-metrics-")
        os.environ[MULTIPROC_ENV] = path
    return path


def instrument(handlers: Handlers, kinds: StepKinds) -> Handlers:
    """``handlers`` with each call timed (duration by kind and outcome, dispatch latency by
    the lane ``kinds`` gives the kind); a :class:`Short` handler stays short."""
    timed: dict[str, Handler] = {}
    for kind, handler in handlers.items():
        lane = kinds[kind].lane.value if kind in kinds else Lane.INTERACTIVE.value
        if isinstance(handler, Short):
            timed[kind] = Short(_timed(kind, lane, handler.handler))
        else:
            timed[kind] = _timed(kind, lane, handler)
    return timed


def _timed(kind: str, lane: str, handler: Handler) -> Handler:
    def run(job: Job) -> Outcome:
        started = time.time()
        DISPATCH_LATENCY.labels(lane).observe(max(started - job.run_after.timestamp(), 0.0))
        outcome_name = "raised"
        try:
            outcome = handler(job)
            outcome_name = type(outcome).__name__.lower()
            return outcome
        finally:
            STEP_DURATION.labels(kind, outcome_name).observe(time.time() - started)

    return run


def observe_reconcile(findings: dict[str, int], seconds: float) -> None:
    RECONCILE_DURATION.observe(seconds)
    for finding, count in findings.items():
        if count:
            RECONCILE_FINDINGS.labels(finding).inc(count)


class QueueDepth:
    """A queue's depth over one long-lived AMQP connection: opened at the first read, kept
    between scrapes (each read also drives its heartbeats), opened again after a failure.

    A read on a connection kept from an earlier scrape that fails is tried once more on a
    fresh one (the broker may have dropped an idle connection); only a fresh connection's
    failure is raised, so a scrape reports the broker down only when it is."""

    def __init__(self, url: str, queue: str, *, timeout: float = 3.0) -> None:
        self._url = url
        self._queue = queue
        self._timeout = timeout
        self._lock = threading.Lock()  # scrapes are served on threads
        self._connection: Any = None
        self._channel: Any = None
        self.opened = 0  # connections opened so far

    def __call__(self) -> int:
        with self._lock:
            kept = self._channel is not None
            try:
                return self._read()
            except Exception:
                self._close()
                if not kept:
                    raise
            return self._read()

    def _read(self) -> int:
        if self._channel is None:
            from actors import amqp  # pika: only where a broker is asked

            self._connection = amqp.connect(self._url, timeout=self._timeout)
            self.opened += 1
            self._channel = self._connection.channel()
        self._connection.process_data_events(0)
        declared = self._channel.queue_declare(self._queue, passive=True)
        return int(declared.method.message_count)

    def _close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except Exception:
                log.debug("closing the metrics connection failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            self._close()


class StoreCollector(Collector):
    """State read at each scrape from PostgreSQL and, given ``dead_queue_depth``, from
    RabbitMQ: each source's gauges and its ``*_up`` apart, so one's outage never hides the
    other's gauges or reads as the other's."""

    def __init__(
        self, operations: OperationsStore, *, dead_queue_depth: Callable[[], int] | None = None
    ) -> None:
        self._ops = operations
        self._dead_queue_depth = dead_queue_depth

    def collect(self) -> Iterator[Any]:
        yield from self._store()
        if self._dead_queue_depth is not None:
            yield from self._broker(self._dead_queue_depth)

    def _store(self) -> Iterator[Any]:
        up = GaugeMetricFamily("vibey_store_up", "1 when PostgreSQL answered this scrape")
        try:
            families = list(self._families())
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail with the database
            log.warning("metrics: PostgreSQL did not answer (%s)", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _broker(self, depth: Callable[[], int]) -> Iterator[Any]:
        up = GaugeMetricFamily("vibey_broker_up", "1 when RabbitMQ answered this scrape")
        try:
            dead = depth()
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail with the broker
            log.warning("metrics: RabbitMQ did not answer (%s)", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield GaugeMetricFamily(
            "vibey_dead_letter_queue_depth",
            "Messages waiting in the dead-letter queue",
            value=dead,
        )

    def _families(self) -> Iterable[Any]:
        jobs = GaugeMetricFamily("vibey_jobs", "Jobs not yet terminal", labels=["state", "kind"])
        for state, kind, n in self._ops.live_jobs():
            jobs.add_metric([state, kind], n)
        yield jobs
        unsent, oldest = self._ops.outbox_lag()
        yield GaugeMetricFamily("vibey_outbox_unsent", "Outbox rows not yet sent", value=unsent)
        yield GaugeMetricFamily(
            "vibey_outbox_oldest_unsent_seconds", "Age of the oldest unsent row", value=oldest
        )
        yield from self._gates()
        yield GaugeMetricFamily(
            "vibey_dead_letters_kept",
            "Dead-lettered messages kept in dead_letter (see vibey queue dead)",
            value=self._ops.dead_letter_count(),
        )
        yield from self._circuits()
        beat = self._ops.latest_heartbeat()
        yield GaugeMetricFamily(
            "vibey_reconcile_heartbeat_age_seconds",
            "Seconds since the newest reconcile pass of any process (-1: none yet)",
            value=-1 if beat is None else beat.age_s,
        )

    def _gates(self) -> Iterable[Any]:
        count = GaugeMetricFamily("vibey_gates_open", "Open gates", labels=["kind"])
        age = GaugeMetricFamily(
            "vibey_gate_oldest_wait_seconds",
            "How long the oldest open gate waited",
            labels=["kind"],
        )
        for kind, n, oldest in self._ops.open_gate_ages():
            count.add_metric([kind], n)
            age.add_metric([kind], oldest)
        yield count
        yield age

    def _circuits(self) -> Iterable[Any]:
        circuit = GaugeMetricFamily(
            "vibey_engine_circuit", "1 for each engine's circuit state", labels=["engine", "state"]
        )
        capacity = GaugeMetricFamily(
            "vibey_engine_capacity", "1 for each engine's capacity", labels=["engine", "state"]
        )
        for engine, circuit_state, capacity_state in self._ops.circuits():
            circuit.add_metric([engine, circuit_state], 1)
            capacity.add_metric([engine, capacity_state], 1)
        yield circuit
        yield capacity


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` (0: any free port; see
    :attr:`port`); ``/healthz`` answers 503 while ``healthy`` (when given) says no, and
    ``/readyz`` while ``ready`` (when given; else ``healthy``) says no."""

    def __init__(
        self,
        *,
        port: int,
        collectors: Iterable[Collector] = (),
        host: str = "",
        healthy: Callable[[], bool] | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.registry = _registry()
        for collector in collectors:
            self.registry.register(collector)
        metrics = make_wsgi_app(self.registry)

        checks = {"/healthz": (healthy, b"stale\n"), "/readyz": (ready or healthy, b"not ready\n")}

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            path = environ.get("PATH_INFO")
            if path in checks:
                check, why = checks[path]
                if check is not None and not check():
                    start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                    return [why]
                start_response("200 OK", [("Content-Type", "text/plain")])
                return [b"ok\n"]
            return metrics(environ, start_response)

        self._httpd = make_server(host, port, app, _Server, handler_class=_Quiet)
        self.port = int(self._httpd.server_port)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="vibey-metrics", daemon=True
        )

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _registry() -> CollectorRegistry:
    """The multiprocess folder's sum under a supervisor, else this process's own metrics."""
    registry = CollectorRegistry()
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Own())
    return registry


class _Own(Collector):
    """This process's metrics (the default registry), served beside the store's."""

    def collect(self) -> Iterator[Any]:
        yield from REGISTRY.collect()
