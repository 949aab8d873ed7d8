"""A process's object graph, assembled here and nowhere else.

pool → dispatch records → (the relay that sends what the stores commit, on the rabbitmq
backend: its router and project routes) → job repository → workflow store → step runner.
These constructors are called in this module only; each process kind passes its values,
once, at its start:

- a worker (:class:`actors.worker.Runtime`): relay, broker, step runner, reconciler;
- the drive loop (:class:`actors.drive.PostgresRuntime`): step runner, no relay;
- the reconciler alone (:class:`actors.reconcile_service.ReconcileService`): relay and
  reconciler, or only the reaper on the postgres backend;
- the client (:class:`vibey.client.Client`; the CLI's commands and ``vibey console`` each
  hold one): relay and stores, assembled at its start when it has a relay, else at the
  first call that needs them (a read command's client reads on its pool alone);
- the loop service (:func:`actors.agents.service.build_service`) builds none of it: it
  hosts engine runs and reaches no database;
- the memory backend (:func:`assemble_memory`): the same parts as in-memory fakes
  (:mod:`store.memory`), under the same step runner, for the unit tests and the contract
  suite, which hold the fakes to the real backends' contract.

The three that start from a :class:`actors.worker.WorkerConfig` read it in
:func:`actors.worker.open_graph`; the client reads its settings. The handlers get the
graph's pool and job repository (``actors.handlers.HandlerContext``: the handoff flow
records each attempt's engine on the job through it), not the graph. Nothing is started
here, except a client's relay (``connect``): the process starts and stops what it runs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors import metrics, tracing
from actors.in_place import InPlace
from actors.relay import Relay, Router
from actors.steps import CrashPoints, StepResult, StepRunner
from actors.stub_broker import Publisher
from actors.topology import QueueNames
from store.db import Pool
from store.dispatch import DispatchRecords
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.routes import RouteCache, read_routes
from store.unit_of_work import OutboxRow, Publish
from store.workflows import WorkflowStore
from workflows.dispatch import WaitTiers
from workflows.engine import Registry
from workflows.job import LeasePolicy
from workflows.steps import Handlers

if TYPE_CHECKING:
    from store.memory import Clock, MemoryJobRepository
    from store.memory_records import MemoryDispatchRecords, MemoryWorkflowStore

STOP_S = 5.0  # how long a relay whose broker did not answer gets to stop


@dataclass(frozen=True, slots=True)
class Bus:
    """Where this process's relay sends dispatch pointers (the rabbitmq backend).
    ``listen``: the database URL on which a :class:`~store.routes.RouteCache` follows the
    project routes (a long-lived process); None: the routes are read once (one command)."""

    url: str
    names: QueueNames
    tiers: WaitTiers
    listen: str | None = None


@dataclass(frozen=True, slots=True)
class Graph:
    """The parts every process that reads or writes workflows shares."""

    pool: Pool
    owner: str  # holds the claims and the outbox rows of this process
    registry: Registry
    tracer: tracing.StepTracer | None
    records: DispatchRecords
    jobs: PostgresJobRepository
    workflows: WorkflowStore
    relay: Relay | None = None  # None: no relay here (the reconcilers send the pointers)
    router: Router | None = None
    routes: RouteCache | None = None  # the route cache the relay reads (the process's to start)


def assemble(
    pool: Pool,
    *,
    registry: Registry,
    leases: LeasePolicy,
    owner: str,
    tracer: tracing.StepTracer | None = None,
    dispatch: bool = False,
    bus: Bus | None = None,
    connect: float | None = None,
    on_commit: Publish | None = None,
) -> Graph:
    """The graph on ``pool``.

    ``dispatch``: every commit writes its dispatch pointers to the outbox (the rabbitmq
    backend). ``bus``: a relay here sends them; the process starts it and its route cache,
    unless ``connect`` is given: then both start here, waiting that long for the broker,
    and if it does not answer they are dropped and the rows are written held by no relay,
    for the reconcilers (a client). ``on_commit``: told of each commit's outbox rows
    before the relay is.
    """
    records = DispatchRecords(pool=pool, relay_id=owner)
    relay, router, routes = _relay(pool, bus, registry, records, tracer, connect)
    jobs = PostgresJobRepository(
        pool=pool,
        leases=leases.resolved(registry.kinds.canonical),
        dispatch=dispatch,
        relay_id=None if relay is None else owner,
        after_commit=_after_commit(on_commit, relay),
    )
    workflows = WorkflowStore(
        pool=pool,
        jobs=jobs,
        registry=registry,
        ledger=Ledger(pool),
        events=tracing.event_spans(tracer),  # a start's, an answer's, a step's spans
    )
    return Graph(pool, owner, registry, tracer, records, jobs, workflows, relay, router, routes)


@dataclass(frozen=True, slots=True)
class MemoryGraph:
    """A :class:`Graph`'s step parts as the in-memory fakes: no pool, no relay."""

    owner: str
    registry: Registry
    tracer: tracing.StepTracer | None
    records: MemoryDispatchRecords
    jobs: MemoryJobRepository
    workflows: MemoryWorkflowStore


def assemble_memory(
    *,
    registry: Registry,
    owner: str,
    clock: Clock | None = None,
    tracer: tracing.StepTracer | None = None,
    dispatch: bool = False,
    on_commit: Publish | None = None,
) -> MemoryGraph:
    """The graph on the in-memory fakes (:mod:`store.memory`, :mod:`store.memory_records`):
    one job repository holds the record, read by the pointer claims and settled through the
    workflow side as :func:`assemble`'s are. ``clock``: the fakes' time (default: the system's;
    a test moves a :class:`store.memory.ManualClock`). ``dispatch`` and ``on_commit`` as for
    :func:`assemble`: each unit's pointers go to ``on_commit`` (a stub broker, a wakeup)."""
    from store.memory import MemoryJobRepository, system_clock
    from store.memory_records import MemoryDispatchRecords, MemoryWorkflowStore

    jobs = MemoryJobRepository(
        clock=clock or system_clock, dispatch=dispatch, after_commit=on_commit
    )
    return MemoryGraph(
        owner, registry, tracer, MemoryDispatchRecords(jobs), jobs, MemoryWorkflowStore(jobs)
    )


def _relay(
    pool: Pool,
    bus: Bus | None,
    registry: Registry,
    records: DispatchRecords,
    tracer: tracing.StepTracer | None,
    connect: float | None,
) -> tuple[Relay | None, Router | None, RouteCache | None]:
    if bus is None:
        return None, None, None
    cache = None if bus.listen is None else RouteCache(url=bus.listen, pool=pool)
    router = Router(
        names=bus.names,
        tiers=bus.tiers,
        dedicated=read_routes(pool) if cache is None else cache,
        kinds=registry.kinds,
    )
    relay = Relay(
        url=bus.url,
        records=records,
        router=router,
        trace_headers=None if tracer is None else tracer.publish_headers,
    )
    if connect is None:
        return relay, router, cache
    if cache is not None:
        cache.start()
    try:
        relay.start(timeout=connect)
    except TimeoutError:  # the broker did not answer: the reconcilers send the pointers
        relay.stop(timeout=STOP_S)
        if cache is not None:
            cache.stop()
        return None, None, None
    return relay, router, cache


def _after_commit(on_commit: Publish | None, relay: Relay | None) -> Publish | None:
    if on_commit is None or relay is None:
        return on_commit if relay is None else relay.submit

    def committed(rows: Sequence[OutboxRow]) -> None:
        on_commit(rows)
        relay.submit(rows)

    return committed


def step_runner(
    graph: Graph | MemoryGraph,
    *,
    handlers: Handlers,
    names: QueueNames,
    tiers: WaitTiers,
    on_result: Callable[[StepResult], None],
    crash: CrashPoints | None = None,
    broker: Publisher | None = None,
    in_place: InPlace | None = None,
) -> StepRunner:
    """The step runner on ``graph``: its handlers instrumented (metrics) and, when the process
    traces, traced with its claims and results. ``broker``: None on the postgres backend."""
    handlers = metrics.instrument(handlers, graph.registry.kinds)
    claims, handlers, on_result = tracing.hooked(graph.tracer, graph.records, handlers, on_result)
    return StepRunner(
        jobs=graph.jobs,
        records=claims,
        broker=broker,
        names=names,
        tiers=tiers,
        handlers=handlers,
        owner=graph.owner,
        crash=crash,
        on_result=on_result,
        workflows=graph.workflows,
        in_place=in_place,
    )


class StepTally:
    """The step results of one process: the Prometheus counter, a count here, and with
    ``tally_dir`` (the chaos tests) one line a result in ``<tally_dir>/<pid>.log``, appended
    at once so that a process killed later keeps its count."""

    def __init__(self, tally_dir: str | None = None) -> None:
        self.results: dict[StepResult, int] = dict.fromkeys(StepResult, 0)
        self._tally_dir = tally_dir
        self._lock = threading.Lock()

    def count(self, result: StepResult) -> None:
        metrics.STEP_RESULTS.labels(result.value).inc()
        with self._lock:
            self.results[result] += 1
        if self._tally_dir:
            path = os.path.join(self._tally_dir, f"{os.getpid()}.log")
            with open(path, "a", encoding="utf-8") as out:
                out.write(f"{result.value}\n")
