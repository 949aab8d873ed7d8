"""A worker process: Dramatiq workers on vibey's lane queues; its configuration.

:class:`WorkerConfig` is what every process started for the fleet is given (a worker, the
drive loop, the reconciler alone); :func:`open_graph` reads it into the process's object graph
(:mod:`actors.graph`). :class:`Runtime` is one rabbitmq-backend worker process: that graph
with the outbox relay, the adapted Dramatiq broker, one step actor per consumed queue, the
reconciler on APScheduler, and an embedded ``dramatiq.Worker`` (threads). ``actors.fleet``
runs several such processes under a supervisor.

A process serves the shared lane queues (the default fleet, every project) or, given
``projects``, only those projects' dedicated queues. Which projects the relay routes to their
dedicated queues is read from ``project_route`` (``store.routes.RouteCache``), never from this
process's settings: every publisher gives the same answer.

Lanes: a process that serves both lanes keeps one of its threads for the interactive lane:
the BUILD queues' prefetch is at most ``threads - 1``, so at most that many BUILD steps hold a
delivery (and a thread) at once, and an interactive step never waits for a BUILD step to
finish, however long BUILD steps run and however deep their backlog. The interactive actor
also has the higher Dramatiq priority, so a buffered interactive step takes the next free
thread ahead of buffered BUILD steps.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.common import join_all

from actors import metrics, tracing
from actors.agents.roster import AgentSpec
from actors.broker import VibeyBroker, step_actor_name
from actors.capabilities import detect
from actors.event_publisher import EventPublisher, EventService
from actors.graph import Bus, Graph, StepTally, assemble, step_runner
from actors.in_place import DEFAULT_STEPS, InPlace
from actors.loaders import load_handlers, load_object, load_registry
from actors.reconcile import Reconciler
from actors.steps import StepRunner
from actors.stub_broker import Publisher
from actors.topology import QueueNames, Topology
from store.events import EventLog
from store.gate_deadlines import GateDeadlines
from store.operations import OperationsStore
from store.pool import open_pool
from store.retention import WorkflowRetention
from store.workflows import WorkflowStore
from workflows.dispatch import DEFAULT_WAIT_TIERS, Lane, WaitTiers
from workflows.events import exchange_for
from workflows.job import LeasePolicy
from workflows.steps import Handlers

log = logging.getLogger(__name__)

# Dramatiq runs the buffered message of the lowest actor priority first.
LANE_PRIORITY: Mapping[str, int] = {Lane.INTERACTIVE.value: 0, Lane.BUILD.value: 10}


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    pg_url: str
    amqp_url: str
    prefix: str = "vibey"
    lanes: tuple[str, ...] = tuple(lane.value for lane in Lane)
    projects: tuple[str, ...] = ()  # serve only these projects' dedicated queues
    dedicated_projects: tuple[str, ...] = ()  # routed to dedicated queues at start (routes)
    tiers: WaitTiers = DEFAULT_WAIT_TIERS
    leases: LeasePolicy = field(default_factory=LeasePolicy)
    threads: int = 8
    prefetch: int | None = None  # default: threads (low, so a crash redelivers little)
    delivery_limit: int = 20
    consumer_timeout: timedelta = timedelta(hours=6)  # work queues' x-consumer-timeout (3.12+)
    reconcile_interval: timedelta = timedelta(seconds=30)
    redispatch_after: timedelta = timedelta(minutes=2)
    reclaim_after: timedelta = timedelta(seconds=30)
    in_place_steps: int = DEFAULT_STEPS  # steps a worker chains in place after a settle (0: none)
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
    workflow_retention: timedelta = timedelta(days=30)  # finished workflows archived after this
    otlp_endpoint: str | None = None  # export step traces over OTLP/HTTP (None: no tracing)
    tracing_service: str = "vibey"
    crash_points: str | None = None  # chaos tests only: "module:attribute" of a CrashPoints
    tally_dir: str | None = None  # chaos tests only: each process appends its step results here
    # SIGTERM: running steps get this long to settle (vibey.wiring.drain_grace: the longest
    # lease, the number the manifests' terminationGracePeriodSeconds is built on).
    drain_grace: timedelta = timedelta(hours=2)

    @property
    def names(self) -> QueueNames:
        return QueueNames(self.prefix)

    def queues(self) -> list[str]:
        return [queue for _, queue in self.lane_queues()]

    def prefetch_by_queue(self) -> dict[str, int]:
        """Each consumed queue's prefetch: ``prefetch`` (default: the threads), but at most
        ``threads - 1`` on a BUILD queue when the process serves the interactive lane too."""
        prefetch = self.prefetch or self.threads
        both = Lane.INTERACTIVE.value in self.lanes and len(self.lanes) > 1
        keep = both and self.threads > 1
        return {
            queue: min(prefetch, self.threads - 1)
            if keep and lane == Lane.BUILD.value
            else prefetch
            for lane, queue in self.lane_queues()
        }

    def lane_queues(self) -> list[tuple[str, str]]:
        """(lane, queue) for every queue this process consumes."""
        if self.projects:
            return [
                (lane, self.names.work_queue(lane, p)) for p in self.projects for lane in self.lanes
            ]
        return [(lane, self.names.work_queue(lane)) for lane in self.lanes]

    def topology(self) -> Topology:
        return Topology(
            self.names,
            dict(zip(self.tiers.names, self.tiers.tiers, strict=True)),
            self.lanes,
            dedicated_projects=tuple(dict.fromkeys((*self.dedicated_projects, *self.projects))),
            delivery_limit=self.delivery_limit,
            consumer_timeout=self.consumer_timeout,
        )


def load_crash_points(config: WorkerConfig) -> Any:
    """The chaos tests' crash points (``config.crash_points``): a ``CrashPoints``, or a
    factory called with the worker's config (what a process forked from a long-lived server
    learns of its test: not the environment, which the server fixed when it started)."""
    if not config.crash_points:
        return None
    loaded = load_object(config.crash_points)
    return loaded if hasattr(loaded, "reached") else loaded(config)


def handler_context(config: WorkerConfig, pool: Any) -> Any:
    """What a handlers factory is called with (the engines' workspace, command and caps)."""
    from actors.handlers import HandlerContext  # the handlers pull in the engines

    runs = None
    if config.amqp_url and any(spec.as_service for spec in config.engines):
        from actors.agents.run_client import RunClient
        from actors.runs_topology import RunsTopology

        engines = tuple(spec.id for spec in config.engines if spec.as_service)
        runs = RunClient(config.amqp_url, RunsTopology(config.prefix, engines))
    return HandlerContext(
        pool=pool,
        workspace=Path(config.workspace),
        command=config.engine_command,
        command_timeout=config.engine_timeout,
        roster=config.engines,
        agent_env=config.agent_env,
        max_dollars=config.max_dollars,
        max_turns=config.max_turns,
        runs=runs,
        push_remote=config.push_remote,
        push_branch=config.push_branch,
    )


def open_graph(
    config: WorkerConfig, *, owner: str, pool_size: int, relay: bool, name: str = "vibey"
) -> Graph:
    """The graph of a process ``config`` starts (a worker, the drive loop, the reconciler
    alone) on a pool of ``pool_size`` connections named ``name``; ``relay``: with the
    outbox relay and its route cache (the rabbitmq backend), which the process starts."""
    bus = None
    if relay:
        bus = Bus(url=config.amqp_url, names=config.names, tiers=config.tiers, listen=config.pg_url)
    return assemble(
        open_pool(config.pg_url, min_size=1, max_size=pool_size, name=name),
        registry=load_registry(config.definitions),
        leases=config.leases,
        owner=owner,
        tracer=tracing.step_tracer(config.otlp_endpoint, service_name=config.tracing_service),
        dispatch=relay,
        bus=bus,
    )


def config_runner(
    config: WorkerConfig,
    graph: Graph,
    *,
    handlers: Handlers | None,
    tally: StepTally,
    broker: Publisher | None = None,
    in_place: InPlace | None = None,
) -> StepRunner:
    """The step runner of a process ``config`` starts; ``handlers`` default to
    ``config.handlers`` (a factory gets the handler context)."""
    if handlers is None:
        handlers = load_handlers(config.handlers, handler_context(config, graph.pool))
    return step_runner(
        graph,
        handlers=handlers,
        names=config.names,
        tiers=config.tiers,
        on_result=tally.count,
        crash=load_crash_points(config),
        broker=broker,
        in_place=in_place,
    )


def config_reconciler(config: WorkerConfig, graph: Graph) -> Reconciler:
    """The rabbitmq backend's reconciler on ``graph`` (which has a relay)."""
    if graph.relay is None:
        raise ValueError("the reconciler drains the outbox through a relay: open_graph(relay=True)")
    return Reconciler(
        jobs=graph.jobs,
        records=graph.records,
        relay=graph.relay,
        url=config.amqp_url,
        names=config.names,
        redispatch_after=config.redispatch_after,
        reclaim_after=config.reclaim_after,
        operations=OperationsStore(graph.pool),
        outbox_retention=config.outbox_retention,
        retention=WorkflowRetention(graph.pool, retention=config.workflow_retention),
        owner=graph.owner,
    )


class Runtime:
    """One worker process's parts, started and stopped together."""

    def __init__(
        self, config: WorkerConfig, *, handlers: Handlers | None = None, owner: str | None = None
    ) -> None:
        """``handlers`` defaults to ``config.handlers`` (a factory gets the handler context)."""
        self.config = config
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        graph = open_graph(config, owner=self.owner, pool_size=config.threads + 4, relay=True)
        assert graph.relay is not None and graph.router is not None and graph.routes is not None
        self.pool, self.records, self.tracer = graph.pool, graph.records, graph.tracer
        self.jobs, self.workflows = graph.jobs, graph.workflows
        self.relay, self.routes = graph.relay, graph.routes
        self.broker = VibeyBroker(
            url=config.amqp_url,
            dead_exchange=config.names.dead_exchange,
            declare=self._declarer(config.topology()),
        )
        self.tally = StepTally(config.tally_dir)
        self.results = self.tally.results
        n = config.in_place_steps
        self.runner = config_runner(
            config,
            graph,
            handlers=handlers,
            tally=self.tally,
            broker=self.broker,
            in_place=InPlace(router=graph.router, queues=frozenset(config.queues()), max_steps=n)
            if n
            else None,
        )
        self.reconciler = config_reconciler(config, graph)
        self.events = event_service(config, self.pool, self.workflows)
        for lane, queue in config.lane_queues():
            dramatiq.Actor(
                self._step,
                broker=self.broker,
                actor_name=step_actor_name(queue),
                queue_name=queue,
                priority=LANE_PRIORITY.get(lane, 0),
                options={"max_retries": 0},
            )
        self._worker: LaneWorker | None = None

    def _declarer(self, topology: Topology) -> Any:
        def declare(channel: Any) -> None:
            caps = detect(channel.connection)
            topology.declare(channel, caps)
            # This process's projects, and every routed one: a routed project's pointers
            # then wait in its queues until its worker comes.
            routed = sorted(self.routes.projects - set(topology.dedicated_projects))
            for project in dict.fromkeys((*self.config.projects, *routed)):
                for lane in self.config.lanes:
                    topology.declare_dedicated(channel, caps, lane, project)

        return declare

    def _step(self, *, trace: Mapping[str, str] | None = None, **pointer: Any) -> None:
        """``trace``: the W3C headers a traced relay sent with the pointer (actors.broker)."""
        if self.tracer is not None:
            self.tracer.delivered(trace)
        self.runner.run(**pointer)

    def start(self) -> None:
        self.routes.start()
        self.relay.start()
        self.broker.channel  # noqa: B018 - opens this thread's channel, declaring the topology
        self.broker._ensure_queue(self.config.queues()[0])
        self._worker = LaneWorker(
            self.broker,
            prefetch=self.config.prefetch_by_queue(),
            worker_threads=self.config.threads,
        )
        self._worker.start()
        self.reconciler.start(interval=self.config.reconcile_interval)
        self.events.start()

    def stop(self, *, timeout: float | None = None) -> int:
        """Stop taking work, let running steps settle for up to ``timeout`` seconds (default:
        ``config.drain_grace``), then close everything. Returns the number of steps cut at
        the grace: their leases stop beating when this process exits, and the reconciler
        reaps them once they expire (their deliveries go back to the queue unacknowledged)."""
        grace = self.config.drain_grace.total_seconds() if timeout is None else timeout
        self.reconciler.stop()
        self.events.stop()
        cut = 0 if self._worker is None else self._worker.drain(grace)
        self.runner.close()
        self.relay.stop()
        self.routes.stop()
        self.broker.close()
        self.pool.close()
        return cut


def event_service(config: WorkerConfig, pool: Any, workflows: WorkflowStore) -> EventService:
    """Publish the domain events (rabbitmq backend) and sweep gate deadlines, every second."""
    publisher = None
    if config.backend != "postgres":
        events = EventLog(pool=pool)
        publisher = EventPublisher(
            url=config.amqp_url, events=events, exchange=exchange_for(config.prefix)
        )
    deadlines = GateDeadlines(pool=pool, workflows=workflows)
    return EventService(publisher=publisher, sweep=deadlines.sweep)


class LaneWorker(dramatiq.Worker):
    """A Dramatiq worker with a prefetch per queue (``_add_consumer`` is Dramatiq's private
    hook; dramatiq is pinned to 2.2.*) and a drain bounded by the grace it is given."""

    def __init__(self, broker: Any, *, prefetch: Mapping[str, int], worker_threads: int) -> None:
        super().__init__(broker, queues=set(prefetch), worker_threads=worker_threads)
        self._prefetch = dict(prefetch)

    def _add_consumer(self, queue_name: str, *, delay: bool = False) -> None:
        self.queue_prefetch = self._prefetch.get(queue_name, self.queue_prefetch)
        super()._add_consumer(queue_name, delay=delay)

    def drain(self, grace: float) -> int:
        """Stop taking work, wait up to ``grace`` seconds for the running steps, then close
        the consumers; returns how many steps were still running (cut).

        Dramatiq's ``Worker.stop`` joins the worker threads for its timeout (600 s by
        default) and its threads are daemons, so whatever runs past it dies with the
        process. Here every worker thread is told to stop first (it finishes the step it
        runs and takes no other), every consumer cancels its subscription (the broker sends
        it nothing more, so a pointer is not held here for hours while another pod could
        run it), and the joins share one deadline, the grace. The channels stay open
        meanwhile: a finishing step acknowledges its delivery on its own channel. Pointers
        buffered but not started go back to their queue when the consumers close.
        """
        deadline = time.monotonic() + max(grace, 0.0)
        for thread in self.workers:
            thread.stop()
        for consumer_thread in self.consumers.values():
            _stop_deliveries(consumer_thread)
        for thread in self.workers:
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        cut = sum(1 for thread in self.workers if thread.is_alive())
        if cut:
            log.warning(
                "drain: %d step(s) still running after the %g s grace; their leases expire "
                "and the reconciler reaps them",
                cut,
                grace,
            )
        # Not Dramatiq's stop: it would join a cut thread for its timeout once more. The
        # consumers close their channels, and RabbitMQ requeues every delivery they held
        # unacknowledged (the unstarted ones, and a cut step's, whose claim then meets its
        # lease until the reconciler reaps it).
        self.broker.emit_before("worker_shutdown", self)
        for consumer in self.consumers.values():
            consumer.stop()
        join_all(self.consumers.values(), CONSUMER_STOP_MS)  # type: ignore[no-untyped-call]
        for consumer in self.consumers.values():
            consumer.close()
        self.broker.emit_after("worker_shutdown", self)
        return cut


CONSUMER_STOP_MS = 10_000  # a consumer thread notices its stop within a second


def _stop_deliveries(consumer_thread: Any) -> None:
    """Ask ``consumer_thread``'s channel to cancel its subscription (Basic.Cancel), in the
    thread that owns the connection. The channel stays open and its consumer thread keeps
    driving it (acknowledgements, heartbeats); only new deliveries stop."""
    consumer = getattr(consumer_thread, "consumer", None)
    if consumer is None:
        return

    def cancel() -> None:
        try:
            for tag in consumer.channel.consumer_tags:
                consumer.channel.basic_cancel(tag)
        except Exception:  # noqa: BLE001 - the drain goes on; closing requeues the rest
            log.warning("drain: cancelling the consumer of %s failed", consumer.queue_name)

    try:
        consumer.connection.add_callback_threadsafe(cancel)
    except Exception:  # noqa: BLE001 - a closed connection delivers nothing more anyway
        log.debug("drain: the consumer of %s is already closed", consumer.queue_name)


def dead_queue_depth(config: WorkerConfig) -> metrics.QueueDepth | None:
    """The dead-letter queue's depth, read over one long-lived connection (None on the
    postgres backend)."""
    if config.backend == "postgres":
        return None
    return metrics.QueueDepth(config.amqp_url, config.names.dead_queue)
