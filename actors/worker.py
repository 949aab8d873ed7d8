"""The worker fleet: Dramatiq workers on vibey's lane queues, under a supervisor.

:class:`Runtime` wires one process: a PostgreSQL pool, the dispatching job repository, the outbox
relay, the adapted Dramatiq broker, one step actor per consumed queue, the reconciler on
APScheduler, and an embedded ``dramatiq.Worker`` (threads). :func:`supervise` runs several
such processes and respawns one that dies (Dramatiq's own master exits when a child dies).

A process serves the shared lane queues (the default fleet, every project) or, given
``projects``, only those projects' dedicated queues.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dramatiq

from actors import metrics
from actors.agents.roster import AgentSpec
from actors.broker import VibeyBroker, step_actor_name
from actors.capabilities import detect
from actors.reconcile import Reconciler
from actors.relay import Relay, Router
from actors.steps import StepResult, StepRunner
from actors.topology import QueueNames, Topology
from store.db import Pool
from store.dispatch import DispatchRecords
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.operations import OperationsStore
from store.pool import open_pool
from store.workflows import WorkflowStore
from workflows.dispatch import DEFAULT_WAIT_TIERS, Lane, WaitTiers
from workflows.engine import Registry
from workflows.job import LeasePolicy
from workflows.steps import Handlers

if TYPE_CHECKING:
    from actors.drive import PostgresRuntime

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    pg_url: str
    amqp_url: str
    prefix: str = "vibey"
    lanes: tuple[str, ...] = tuple(lane.value for lane in Lane)
    projects: tuple[str, ...] = ()  # serve only these projects' dedicated queues
    dedicated_projects: tuple[str, ...] = ()  # every project routed to dedicated queues
    tiers: WaitTiers = DEFAULT_WAIT_TIERS
    leases: LeasePolicy = field(default_factory=LeasePolicy)
    threads: int = 8
    prefetch: int | None = None  # default: threads (low, so a crash redelivers little)
    delivery_limit: int = 20
    reconcile_interval: timedelta = timedelta(seconds=30)
    redispatch_after: timedelta = timedelta(minutes=2)
    reclaim_after: timedelta = timedelta(seconds=30)
    handlers: str = "actors.handlers:build_handlers"  # a Handlers mapping, or a factory
    definitions: str = "workflows.protocol:DEFINITIONS"  # the workflow definitions it runs
    workspace: str = ".vibey/work"  # engines' git repositories and worktrees
    engine_command: tuple[str, ...] = ()  # the `command` engine's argv
    engine_timeout: timedelta = timedelta(hours=2)
    engines: tuple[AgentSpec, ...] = ()  # the roster ([engines.<id>] tables)
    agent_env: Mapping[str, str] = field(default_factory=dict)  # the base engines get
    max_dollars: float | None = None  # spend caps of a bounded BUILD job (None: no cap)
    max_turns: int | None = None
    push_remote: str | None = None  # [project] push: where build.integrate pushes (None: nowhere)
    push_branch: str = "vibey/{project}"  # the remote branch ({project}: the project id)
    backend: str = "rabbitmq"  # or "postgres": the drive loop (actors/drive.py), no broker
    poll_interval: timedelta = timedelta(seconds=5)  # postgres: the idle wakeup backstop
    metrics_port: int | None = None  # serve Prometheus metrics (and /healthz) on this port
    outbox_retention: timedelta = timedelta(days=1)  # sent outbox rows are pruned after this
    crash_points: str | None = None  # chaos tests only: "module:attribute" of a CrashPoints
    tally_dir: str | None = None  # chaos tests only: each process appends its step results here

    @property
    def names(self) -> QueueNames:
        return QueueNames(self.prefix)

    def queues(self) -> list[str]:
        if self.projects:
            return [self.names.work_queue(lane, p) for p in self.projects for lane in self.lanes]
        return [self.names.work_queue(lane) for lane in self.lanes]

    def topology(self) -> Topology:
        return Topology(
            self.names,
            dict(zip(self.tiers.names, self.tiers.tiers, strict=True)),
            self.lanes,
            dedicated_projects=tuple(dict.fromkeys((*self.dedicated_projects, *self.projects))),
            delivery_limit=self.delivery_limit,
        )


def load_object(path: str) -> Any:
    """``module:attribute`` → the object it names."""
    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def load_handlers(path: str, context: Any = None) -> Handlers:
    """A ``Handlers`` mapping, or a factory called with the handlers' context."""
    loaded = load_object(path)
    if isinstance(loaded, Mapping):
        return loaded
    handlers: Handlers = loaded(context)
    return handlers


def load_registry(path: str) -> Registry:
    return Registry(load_object(path))


def handler_context(config: WorkerConfig, pool: Any) -> Any:
    """What a handlers factory is called with (the engines' workspace, command and caps)."""
    from actors.handlers import HandlerContext  # the handlers pull in the engines

    return HandlerContext(
        pool=pool,
        workspace=Path(config.workspace),
        command=config.engine_command,
        command_timeout=config.engine_timeout,
        roster=config.engines,
        agent_env=config.agent_env,
        max_dollars=config.max_dollars,
        max_turns=config.max_turns,
        push_remote=config.push_remote,
        push_branch=config.push_branch,
    )


class Runtime:
    """One worker process's parts, started and stopped together."""

    def __init__(
        self, config: WorkerConfig, *, handlers: Handlers | None = None, owner: str | None = None
    ) -> None:
        """``handlers`` defaults to ``config.handlers`` (a factory gets the handler context)."""
        self.config = config
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        names = config.names
        self.pool = open_pool(config.pg_url, min_size=1, max_size=config.threads + 4)
        self.records = DispatchRecords(pool=self.pool, relay_id=self.owner)
        dedicated = (*config.dedicated_projects, *config.projects)
        registry = load_registry(config.definitions)
        self.relay = Relay(
            url=config.amqp_url,
            records=self.records,
            router=Router(
                names=names, tiers=config.tiers, dedicated=dedicated, kinds=registry.kinds
            ),
        )
        self.jobs = PostgresJobRepository(
            pool=self.pool,
            leases=config.leases.resolved(registry.kinds.canonical),
            dispatch=True,
            relay_id=self.owner,
            after_commit=self.relay.submit,
        )
        self.workflows = WorkflowStore(
            pool=self.pool,
            jobs=self.jobs,
            registry=registry,
            ledger=Ledger(self.pool),
        )
        if handlers is None:
            handlers = load_handlers(config.handlers, self._handler_context())
        handlers = metrics.instrument(handlers, registry.kinds)
        topology = config.topology()
        self.broker = VibeyBroker(
            url=config.amqp_url, dead_exchange=names.dead_exchange, declare=self._declarer(topology)
        )
        self.runner = StepRunner(
            jobs=self.jobs,
            records=self.records,
            broker=self.broker,
            names=names,
            tiers=config.tiers,
            handlers=handlers,
            owner=self.owner,
            crash=load_object(config.crash_points) if config.crash_points else None,
            on_result=self._count,
            workflows=self.workflows,
        )
        self.reconciler = Reconciler(
            jobs=self.jobs,
            records=self.records,
            relay=self.relay,
            url=config.amqp_url,
            names=names,
            redispatch_after=config.redispatch_after,
            reclaim_after=config.reclaim_after,
            operations=OperationsStore(self.pool),
            outbox_retention=config.outbox_retention,
            owner=self.owner,
        )
        self.results: dict[StepResult, int] = dict.fromkeys(StepResult, 0)
        self._results_lock = threading.Lock()
        for queue in config.queues():
            dramatiq.Actor(
                self._step,
                broker=self.broker,
                actor_name=step_actor_name(queue),
                queue_name=queue,
                priority=0,
                options={"max_retries": 0},
            )
        self._worker: dramatiq.Worker | None = None

    def _handler_context(self) -> Any:
        return handler_context(self.config, self.pool)

    def _declarer(self, topology: Topology) -> Any:
        projects = self.config.projects

        def declare(channel: Any) -> None:
            caps = detect(channel.connection)
            topology.declare(channel, caps)
            for project in projects:
                for lane in self.config.lanes:
                    topology.declare_dedicated(channel, caps, lane, project)

        return declare

    def _step(self, **pointer: Any) -> None:
        self.runner.run(**pointer)

    def _count(self, result: StepResult) -> None:
        metrics.STEP_RESULTS.labels(result.value).inc()
        with self._results_lock:
            self.results[result] += 1
        if self.config.tally_dir:  # appended at once: a process killed later keeps its count
            path = os.path.join(self.config.tally_dir, f"{os.getpid()}.log")
            with open(path, "a", encoding="utf-8") as out:
                out.write(f"{result.value}\n")

    def start(self) -> None:
        self.relay.start()
        self.broker.channel  # noqa: B018 - opens this thread's channel, declaring the topology
        self.broker._ensure_queue(self.config.queues()[0])
        prefetch = self.config.prefetch or self.config.threads
        self._worker = dramatiq.Worker(
            self.broker, queues=set(self.config.queues()), worker_threads=self.config.threads
        )
        self._worker.queue_prefetch = prefetch
        self._worker.start()
        self.reconciler.start(interval=self.config.reconcile_interval)

    def stop(self, *, timeout: float = 600.0) -> None:
        """Stop consuming, let running steps settle, then close everything."""
        self.reconciler.stop()
        if self._worker is not None:
            self._worker.stop(timeout=int(timeout * 1000))
        self.runner.close()
        self.relay.stop()
        self.broker.close()
        self.pool.close()


def run_process(config: WorkerConfig, *, ready: Any = None) -> None:
    """A worker process: run until SIGTERM or SIGINT, then drain."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(processName)s %(name)s %(message)s"
    )
    logging.getLogger("pika").setLevel(logging.WARNING)  # its INFO narrates every close
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    runtime: Runtime | PostgresRuntime
    if config.backend == "postgres":
        from actors.drive import PostgresRuntime

        runtime = PostgresRuntime(config)
    else:
        runtime = Runtime(config)
    runtime.start()
    if ready is not None:
        ready.set()
    stop.wait()
    runtime.stop()


QUICK_EXIT_S = 10.0  # an error exit this soon after the start backs the respawn off
RESPAWN_BASE_S = 0.5
RESPAWN_MAX_S = 30.0


class Supervisor:
    """Runs ``processes`` worker processes and respawns any that dies (by pid), until
    :meth:`stop`; then stops them all gracefully (SIGTERM: each drains).

    A process killed by a signal (SIGKILL, the OOM killer) is respawned at once. One that
    exits with an error soon after it started (PostgreSQL down, a bad setting) is respawned
    after a doubling delay (0.5 s, 1 s, 2 s, … at most 30 s), so a fleet that cannot start
    does not spin; a process that ran for a while resets its delay."""

    def __init__(self, config: WorkerConfig, *, processes: int) -> None:
        self._config = config
        # forkserver: the server imports vibey once, so a respawn is a fork, not a new
        # interpreter importing Dramatiq, psycopg and pika again.
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(["actors.worker"])
        self._children: list[Any] = [None] * processes
        self._started = [0.0] * processes
        self._failures = [0] * processes  # quick error exits in a row, per slot
        self._due: list[float | None] = [None] * processes  # when a dead slot respawns
        self._stopping = threading.Event()
        self.respawns = 0
        self.metrics: metrics.MetricsServer | None = None
        if config.metrics_port is not None:  # before the forkserver starts: it inherits it
            metrics.use_multiprocess_dir()

    def run(self) -> int:
        pool = self._serve_metrics()
        try:
            for slot in range(len(self._children)):
                self._spawn(slot)
            while not self._stopping.wait(0.25):
                self._respawn_dead()
            self._terminate()
        finally:
            if self.metrics is not None:
                self.metrics.stop()
            if pool is not None:
                pool.close()
        return self.respawns

    def _serve_metrics(self) -> Pool | None:
        """The fleet's metrics endpoint (every process's events, the store's state)."""
        if self._config.metrics_port is None:
            return None
        pool = open_pool(self._config.pg_url, min_size=1, max_size=2, name="vibey-metrics")
        collector = metrics.StoreCollector(
            OperationsStore(pool), dead_queue_depth=dead_queue_depth(self._config)
        )
        self.metrics = metrics.MetricsServer(
            port=self._config.metrics_port, collectors=[collector]
        ).start()
        return pool

    def stop(self) -> None:
        self._stopping.set()

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self._children if child is not None]

    def _spawn(self, slot: int) -> None:
        child = self._ctx.Process(
            target=run_process, args=(self._config,), name=f"vibey-worker-{slot}"
        )
        child.start()
        self._children[slot] = child
        self._started[slot] = time.monotonic()
        self._due[slot] = None

    def _respawn_dead(self) -> None:
        now = time.monotonic()
        for slot, child in enumerate(self._children):
            if child is None or child.is_alive() or self._stopping.is_set():
                continue
            if self._due[slot] is None:
                delay = self._respawn_delay(slot, child.exitcode, now)
                log.warning(
                    "worker %s (pid %s) exited %s; respawning%s",
                    slot,
                    child.pid,
                    child.exitcode,
                    f" in {delay:g} s" if delay else "",
                )
                self._due[slot] = now + delay
            if now >= (self._due[slot] or now):
                self.respawns += 1
                self._spawn(slot)

    def _respawn_delay(self, slot: int, exitcode: int | None, now: float) -> float:
        quick_error = (
            exitcode is not None and exitcode > 0 and now - self._started[slot] < QUICK_EXIT_S
        )
        self._failures[slot] = self._failures[slot] + 1 if quick_error else 0
        if not quick_error:
            return 0.0
        return float(min(RESPAWN_BASE_S * 2 ** (self._failures[slot] - 1), RESPAWN_MAX_S))

    def _terminate(self) -> None:
        live = [c for c in self._children if c is not None and c.is_alive()]
        for child in live:
            os.kill(child.pid, signal.SIGTERM)
        for child in self._children:
            if child is not None:
                child.join()


def dead_queue_depth(config: WorkerConfig) -> Any:
    """A function reading the dead-letter queue's depth (None on the postgres backend)."""
    if config.backend == "postgres":
        return None
    from actors import amqp

    def depth() -> int:
        connection = amqp.connect(config.amqp_url, timeout=3)
        try:
            queue = connection.channel().queue_declare(config.names.dead_queue, passive=True)
            return int(queue.method.message_count)
        finally:
            connection.close()

    return depth


def supervise(config: WorkerConfig, *, processes: int) -> int:
    """Run a supervised fleet until SIGTERM or SIGINT; returns the number of respawns."""
    supervisor = Supervisor(config, processes=processes)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: supervisor.stop())
    return supervisor.run()
