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
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.common import iter_queue, join_all, q_name
from dramatiq.errors import ConnectionClosed
from dramatiq.worker import ConsumerThread

from actors import metrics, tracing
from actors.broker import VibeyBroker, step_actor_name
from actors.capabilities import detect
from actors.config import Settings
from actors.event_publisher import EventPublisher, EventService
from actors.graph import Bus, Graph, StepTally, assemble, step_runner
from actors.in_place import InPlace
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
from workflows.dispatch import Lane
from workflows.events import exchange_for
from workflows.steps import Handlers

log = logging.getLogger(__name__)

# Dramatiq runs the buffered message of the lowest actor priority first.
LANE_PRIORITY: Mapping[str, int] = {Lane.INTERACTIVE.value: 0, Lane.BUILD.value: 10}


class WorkerConfig(Settings):
    """A worker's configuration: the settings as loaded (it reads them itself: ``queue``,
    ``worker``, ``engine``, ...) and what its start adds. Built by ``vibey.wiring.worker_config``,
    which checks first that the URLs it needs are set."""

    projects: tuple[str, ...] = ()  # serve only these projects' dedicated queues
    crash_points: str | None = None  # chaos tests only: "module:attribute" of a CrashPoints
    tally_dir: str | None = None  # chaos tests only: each process appends its step results here
    # SIGTERM: running steps get this long to settle (vibey.wiring.drain_grace: the longest
    # lease, the number the manifests' terminationGracePeriodSeconds is built on).
    drain_grace: timedelta = timedelta(hours=2)

    @property
    def pg_url(self) -> str:
        return self.require_database_url()

    @property
    def amqp_url(self) -> str:
        """The broker's URL; "" on the postgres backend, which has none."""
        return "" if self.queue.backend == "postgres" else self.require_amqp_url()

    @property
    def names(self) -> QueueNames:
        return QueueNames(self.bus.prefix)

    def queues(self) -> list[str]:
        return [queue for _, queue in self.lane_queues()]

    def prefetch_by_queue(self) -> dict[str, int]:
        """Each consumed queue's prefetch: ``prefetch`` (default: the threads), but at most
        ``threads - 1`` on a BUILD queue when the process serves the interactive lane too."""
        threads, lanes = self.worker.threads, self.worker.lanes
        prefetch = self.queue.rabbitmq.prefetch or threads
        both = Lane.INTERACTIVE.value in lanes and len(lanes) > 1
        keep = both and threads > 1
        return {
            queue: min(prefetch, threads - 1) if keep and lane == Lane.BUILD.value else prefetch
            for lane, queue in self.lane_queues()
        }

    def lane_queues(self) -> list[tuple[str, str]]:
        """(lane, queue) for every queue this process consumes."""
        lanes = self.worker.lanes
        if self.projects:
            return [(lane, self.names.work_queue(lane, p)) for p in self.projects for lane in lanes]
        return [(lane, self.names.work_queue(lane)) for lane in lanes]

    def topology(self) -> Topology:
        rabbitmq = self.queue.rabbitmq
        tiers = rabbitmq.wait_tiers
        return Topology(
            self.names,
            dict(zip(tiers.names, tiers.tiers, strict=True)),
            self.worker.lanes,
            dedicated_projects=tuple(dict.fromkeys((*rabbitmq.dedicated_projects, *self.projects))),
            delivery_limit=rabbitmq.delivery_limit,
            consumer_timeout=timedelta(seconds=rabbitmq.consumer_timeout_seconds),
        )


def load_crash_points(config: WorkerConfig) -> Any:
    """The chaos tests' crash points (``config.crash_points``): a ``CrashPoints``, or a
    factory called with the worker's config (what a process forked from a long-lived server
    learns of its test: not the environment, which the server fixed when it started)."""
    if not config.crash_points:
        return None
    loaded = load_object(config.crash_points)
    return loaded if hasattr(loaded, "reached") else loaded(config)


def handler_context(config: WorkerConfig, graph: Graph) -> Any:
    """What a handlers factory is called with (the engines' workspace, command and caps, and
    the graph's pool and job repository)."""
    from actors.handlers import HandlerContext  # the handlers pull in the engines

    engine, runs = config.engine, None
    if config.amqp_url and any(spec.as_service for spec in config.engines):
        from actors.agents.run_client import RunClient
        from actors.runs_topology import RunsTopology

        engines = tuple(spec.id for spec in config.engines if spec.as_service)
        runs = RunClient(config.amqp_url, RunsTopology(config.bus.prefix, engines))
    return HandlerContext(
        pool=graph.pool,
        jobs=graph.jobs,
        workspace=Path(engine.workspace),
        command=engine.command,
        command_timeout=timedelta(seconds=engine.timeout_seconds),
        roster=config.engines,
        agent_env=config.agent_env,
        max_dollars=engine.max_dollars,
        max_turns=engine.max_turns,
        runs=runs,
        push_remote=config.project.push,
        push_branch=config.project.push_branch,
    )


def open_graph(
    config: WorkerConfig, *, owner: str, pool_size: int, relay: bool, name: str = "vibey"
) -> Graph:
    """The graph of a process ``config`` starts (a worker, the drive loop, the reconciler
    alone) on a pool of ``pool_size`` connections named ``name``; ``relay``: with the
    outbox relay and its route cache (the rabbitmq backend), which the process starts."""
    bus = None
    if relay:
        bus = Bus(
            url=config.amqp_url,
            names=config.names,
            tiers=config.queue.rabbitmq.wait_tiers,
            listen=config.pg_url,
        )
    return assemble(
        open_pool(config.pg_url, min_size=1, max_size=pool_size, name=name),
        registry=load_registry(config.workflow.definitions),
        leases=config.queue.lease,
        owner=owner,
        tracer=tracing.step_tracer(
            config.tracing.otlp_endpoint, service_name=config.tracing.service_name
        ),
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
    ``config.worker.handlers`` (a factory gets the handler context)."""
    if handlers is None:
        handlers = load_handlers(config.worker.handlers, handler_context(config, graph))
    return step_runner(
        graph,
        handlers=handlers,
        names=config.names,
        tiers=config.queue.rabbitmq.wait_tiers,
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
        redispatch_after=timedelta(seconds=config.queue.rabbitmq.redispatch_after_seconds),
        reclaim_after=timedelta(seconds=config.queue.rabbitmq.reclaim_after_seconds),
        operations=OperationsStore(graph.pool),
        outbox_retention=timedelta(seconds=config.queue.rabbitmq.outbox_retention_seconds),
        retention=WorkflowRetention(
            graph.pool, retention=timedelta(seconds=config.workflow.archive_after_seconds)
        ),
        owner=graph.owner,
    )


class Runtime:
    """One worker process's parts, started and stopped together."""

    def __init__(
        self, config: WorkerConfig, *, handlers: Handlers | None = None, owner: str | None = None
    ) -> None:
        """``handlers`` defaults to ``config.worker.handlers`` (a factory gets the handler
        context)."""
        self.config = config
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        graph = open_graph(
            config, owner=self.owner, pool_size=config.worker.threads + 4, relay=True
        )
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
        rabbitmq = config.queue.rabbitmq
        self.runner = config_runner(
            config,
            graph,
            handlers=handlers,
            tally=self.tally,
            broker=self.broker,
            in_place=InPlace(
                router=graph.router,
                queues=frozenset(config.queues()),
                max_steps=rabbitmq.in_place_steps,
                budget=rabbitmq.in_place_ms / 1000,
            )
            if rabbitmq.in_place_steps
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
                for lane in self.config.worker.lanes:
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
            worker_threads=self.config.worker.threads,
        )
        self._worker.start()
        self.reconciler.start(
            interval=timedelta(seconds=self.config.queue.rabbitmq.reconcile_interval_seconds)
        )
        self.events.start()

    def stop(self, *, timeout: float | None = None) -> int:
        """Stop taking work, let running steps settle for up to ``timeout`` seconds (default:
        ``config.drain_grace``), then close everything. Returns the number of steps cut at
        the grace: their leases stop beating when this process exits, and the reconciler
        reaps them once they expire (their deliveries go back to the queue unacknowledged)."""
        grace = self.config.drain_grace.total_seconds() if timeout is None else timeout
        if self._worker is not None:
            self._worker.stop_taking()  # first: the reconciler may be mid-pass
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
    if config.queue.backend != "postgres":
        events = EventLog(pool=pool)
        publisher = EventPublisher(
            url=config.amqp_url, events=events, exchange=exchange_for(config.bus.prefix)
        )
    deadlines = GateDeadlines(pool=pool, workflows=workflows)
    return EventService(publisher=publisher, sweep=deadlines.sweep)


class LaneWorker(dramatiq.Worker):
    """A Dramatiq worker with a prefetch per queue, consumer threads a drain can turn off
    (``_add_consumer`` is Dramatiq's private hook; dramatiq is pinned to 2.2.*) and a drain
    bounded by the grace it is given."""

    def __init__(self, broker: Any, *, prefetch: Mapping[str, int], worker_threads: int) -> None:
        super().__init__(
            broker, queues=set(prefetch), worker_threads=worker_threads, worker_timeout=WAKE_MS
        )
        self._prefetch = dict(prefetch)
        self._taking = True

    def _add_consumer(self, queue_name: str, *, delay: bool = False) -> None:
        """Dramatiq's, with this queue's prefetch and a :class:`DrainingConsumer`."""
        if queue_name in self.consumers or (
            self.consumer_whitelist and q_name(queue_name) not in self.consumer_whitelist
        ):
            return
        consumer = self.consumers[queue_name] = DrainingConsumer(
            broker=self.broker,
            queue_name=queue_name,
            prefetch=self.delay_prefetch
            if delay
            else self._prefetch.get(queue_name, self.queue_prefetch),
            work_queue=self.work_queue,
            worker_timeout=self.worker_timeout,
        )
        consumer.start()

    def stop_taking(self) -> None:
        """Take no more work, at once (the drain's first part; once only): every worker
        thread finishes the step it runs and takes no other; every consumer cancels its
        subscription (the broker sends it nothing more, so a pointer is not held here for
        hours while another pod could run it); then the pointers buffered here and not
        started go back to their queues. The channels stay open: a finishing step
        acknowledges its delivery on its own channel."""
        if not self._taking:
            return
        self._taking = False
        for thread in self.workers:
            thread.stop()
        cancelled = [
            consumer.drain()
            for consumer in self.consumers.values()
            if isinstance(consumer, DrainingConsumer)
        ]
        # Once a consumer thread has cancelled, whatever it had received is in the work
        # queue, and it hands back what comes after. One that did not answer in time (its
        # connection lost) leaves what it buffered to its channel's close.
        deadline = time.monotonic() + CANCEL_WAIT_S
        for done in cancelled:
            done.wait(max(deadline - time.monotonic(), 0.0))
        buffered: dict[str, list[Any]] = {}
        for item in iter_queue(self.work_queue):  # type: ignore[no-untyped-call]
            buffered.setdefault(item.message.queue_name, []).append(item.message)
            self.work_queue.task_done()
        for queue_name, messages in buffered.items():
            try:
                self.consumers[queue_name].requeue_messages(messages)
            except ConnectionClosed:
                log.debug("drain: the consumer of %s is closed; its channel requeued", queue_name)
        if buffered:
            log.info(
                "drain: %d buffered pointer(s) handed back to their queues",
                sum(map(len, buffered.values())),
            )

    def drain(self, grace: float) -> int:
        """:meth:`stop_taking`, wait up to ``grace`` seconds for the running steps, then close
        the consumers; returns how many steps were still running (cut).

        Dramatiq's ``Worker.stop`` joins the worker threads for its timeout (600 s by
        default) and its threads are daemons, so whatever runs past it dies with the
        process. Here the joins share one deadline, the grace.
        """
        deadline = time.monotonic() + max(grace, 0.0)
        self.stop_taking()
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
        # unacknowledged (a cut step's, whose claim then meets its lease until the
        # reconciler reaps it).
        self.broker.emit_before("worker_shutdown", self)
        for consumer in self.consumers.values():
            consumer.stop()
        join_all(self.consumers.values(), CONSUMER_STOP_MS)  # type: ignore[no-untyped-call]
        for consumer in self.consumers.values():
            consumer.close()
        self.broker.emit_after("worker_shutdown", self)
        return cut


# How often an idle worker thread and an idle consumer wake (Dramatiq's worker_timeout, 1 s by
# default): a drain waits that long for each, so an idle process stops within 2 x WAKE_MS.
WAKE_MS = 100
CONSUMER_STOP_MS = 10_000  # a consumer thread notices its stop within WAKE_MS
CANCEL_WAIT_S = 5.0  # a consumer thread runs its cancel within WAKE_MS


class DrainingConsumer(ConsumerThread):
    """Dramatiq's consumer thread, which a drain turns off (:meth:`drain`).

    Off, it cancels its subscription (Basic.Cancel) and hands every delivery it still gets
    back to its queue instead of buffering it for a worker thread: one the broker sent before
    it saw the cancel, or one sent to a consumer Dramatiq restarted after a lost connection
    (which then cancels too, so the pointer is not bounced between the broker and here)."""

    draining = False

    def drain(self) -> threading.Event:
        """Turn this consumer off. The cancel is sent by this thread, which owns the
        connection (pika's ``add_callback_threadsafe``: it runs when the consumer next
        processes the connection's events, within ``WAKE_MS``); the event is set once it
        ran, or at once if the connection is closed (it delivers nothing more)."""
        self.draining = True
        done = threading.Event()
        consumer = self.consumer
        if consumer is None:
            done.set()
            return done

        def cancel() -> None:
            try:
                _cancel(consumer)
            finally:
                done.set()

        try:
            consumer.connection.add_callback_threadsafe(cancel)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a closed connection delivers nothing more anyway
            log.debug("drain: the consumer of %s is already closed", self.queue_name)
            done.set()
        return done

    def handle_message(self, message: Any) -> None:
        if not self.draining:
            super().handle_message(message)
            return
        if self.consumer is not None:
            _cancel(self.consumer)
        try:
            self.requeue_messages([message])
        except ConnectionClosed:
            log.debug("drain: the consumer of %s is closed; its channel requeued", self.queue_name)


def _cancel(consumer: Any) -> None:
    """Cancel ``consumer``'s subscription (Basic.Cancel), in the thread that owns its
    connection. Its channel stays open (the running steps' acknowledgements, heartbeats)."""
    try:
        for tag in consumer.channel.consumer_tags:
            consumer.channel.basic_cancel(tag)
    except Exception:  # noqa: BLE001 - the drain goes on; closing requeues the rest
        log.warning("drain: cancelling the consumer of %s failed", consumer.queue_name)


def dead_queue_depth(config: WorkerConfig) -> metrics.QueueDepth | None:
    """The dead-letter queue's depth, read over one long-lived connection (None on the
    postgres backend)."""
    if config.queue.backend == "postgres":
        return None
    return metrics.QueueDepth(config.amqp_url, config.names.dead_queue)
