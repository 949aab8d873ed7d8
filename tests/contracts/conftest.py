"""The backends the job-queue contract runs against, each on the path its workers run.

* ``rabbitmq``: the fleet's dispatching path. Enqueues commit their pointers to the outbox, the
  relay publishes them, and the fleet's Dramatiq objects deliver them (``VibeyBroker`` and its
  ``PointerConsumer``, a ``LaneWorker`` on the shared lane queues, one step actor per queue);
  each delivered pointer goes through ``StepRunner.run`` (the fenced pointer claim, a miss
  dropped or re-delayed through a wait tier, the handler, the one settle). ``reap`` is the
  reconciler's pass.
* ``postgres``: the drive loop's path (``actors.drive``): ``store.drive.claim_next``, then
  ``StepRunner.run_claimed``; the wakeup is ``PostgresJobReadyNotifier``; ``reap`` is the drive
  loop's ``reap_once``.
* ``memory``: the in-memory fakes beside the store's seams (``store.memory``), under the same
  runner, held to the same contract.

Every backend builds its parts through the composition root (:mod:`actors.graph`), the real
ones as their processes do: ``assemble`` for the pool's job repository, dispatch records and
(on RabbitMQ) the relay and its router, ``assemble_memory`` for the fakes, ``step_runner`` for
each worker's runner. A drive loop process has one graph, so each worker the contract names
gets its own; the fleet's workers share the one relay of the backend's graph (one worker
process running several owners' steps), as the contract's worker names are cheap and a relay
is a connection; the fakes' workers share the one fake that holds the record.

How the contract's ``claim`` and settles map onto a runner is ``tests/contracts/fleet.py``.
The contract file itself never names a backend.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterator
from contextlib import ExitStack
from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol

import dramatiq
import pytest
from psycopg_pool import ConnectionPool

from actors.broker import VibeyBroker, step_actor_name
from actors.capabilities import detect
from actors.drive import reap_once
from actors.graph import Bus, Graph, MemoryGraph, assemble, assemble_memory, step_runner
from actors.reconcile import Reconciler
from actors.steps import StepResult, StepRunner
from actors.stub_broker import Publisher
from actors.topology import QueueNames, Topology
from actors.worker import LANE_PRIORITY, LaneWorker
from store.drive import Work, claim_next
from store.jobs import PostgresJobRepository
from store.notify import PostgresJobReadyNotifier
from store.operations import OperationsStore
from tests.amqp_fixtures import Amqp
from tests.contracts.fleet import (
    HANDLERS,
    Deliveries,
    FleetRepository,
    PointerWakeup,
    TakenClaims,
    Workers,
)
from workflows.dispatch import Lane, WaitTiers
from workflows.engine import Registry
from workflows.job import LeasePolicy
from workflows.protocol.definition import DEFINITIONS
from workflows.queue import (
    EnqueueRequest,
    Job,
    JobReadyNotifier,
    JobRepository,
    JsonObject,
    ReapResult,
)

BACKENDS = ["rabbitmq", "postgres", "memory"]
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5), timedelta(seconds=30)))
# Dramatiq threads (and prefetch) of the RabbitMQ fleet: each step the contract holds keeps
# one thread, and it holds up to 40 at once.
FLEET_THREADS = 64
DRAIN_GRACE_S = 5.0
DISPATCH_WAIT_S = 5.0  # a committed pointer is delivered within this (the relay, the broker)
RELAY_CONNECT_S = 10.0  # a producer's relay waits this long for the broker
REGISTRY = Registry(DEFINITIONS)  # the protocol's definitions: the kinds the contract enqueues


class Backend(Protocol):
    name: str

    def repo(self, *, leases: LeasePolicy | None = None) -> JobRepository:
        """The queue as the contract speaks it; ``leases``: the policy its enqueues use."""
        ...

    def notifier(self) -> JobReadyNotifier: ...

    def stall(self, owner: str) -> None:
        """The worker ``owner`` froze: its heartbeat stops, its leases run out."""
        ...

    def dispatched(self, project_id: str, n: int) -> bool:
        """Whether ``n`` of the project's ready jobs are in reach of one claim within a few
        seconds: on the fleet, their pointers delivered (a claim takes what its broker
        delivered, so before then it could order only what had arrived); elsewhere the
        claim reads the record itself, at once."""
        ...

    # The record, read (and a clock moved) directly:
    def make_due(self, job_id: uuid.UUID) -> None: ...

    def ledger(self, job_id: uuid.UUID) -> list[tuple[str, JsonObject]]:
        """The job's ledger events, (kind, payload) in order."""
        ...

    def gate_events(self, gate_id: uuid.UUID) -> list[str]:
        """The domain events about the gate, their types in order."""
        ...

    def job_count(self, project_id: str) -> int: ...


class PostgresRecord:
    """Reads of the record store, which PostgreSQL is on both real backends."""

    def __init__(self, url: str, stack: ExitStack) -> None:
        self.url = url
        self._stack = stack
        self.pool = stack.enter_context(
            ConnectionPool(url, min_size=1, max_size=24, open=True, kwargs={"autocommit": True})
        )
        self.pool.wait(timeout=30)

    def sql(self, query: str, *params: object) -> list[tuple[Any, ...]]:
        with self.pool.connection() as conn:
            cur = conn.execute(query.encode(), params)
            return cur.fetchall() if cur.description else []

    def make_due(self, job_id: uuid.UUID) -> None:
        self.sql("UPDATE job SET run_after = now() WHERE id = %s", job_id)

    def ledger(self, job_id: uuid.UUID) -> list[tuple[str, JsonObject]]:
        query = "SELECT kind, payload FROM ledger_event WHERE job_id = %s ORDER BY seq"
        return [(str(kind), payload) for kind, payload in self.sql(query, job_id)]

    def gate_events(self, gate_id: uuid.UUID) -> list[str]:
        query = "SELECT event_type FROM domain_event WHERE payload->>'gate_id' = %s ORDER BY seq"
        return [str(row[0]) for row in self.sql(query, str(gate_id))]

    def job_count(self, project_id: str) -> int:
        ((count,),) = self.sql("SELECT count(*) FROM job WHERE project_id = %s", project_id)
        return int(count)


class PostgresBackend(PostgresRecord):
    """The drive loop: ``claim_next`` across the claimed project, ``run_claimed``."""

    name = "postgres"

    def __init__(self, url: str, stack: ExitStack) -> None:
        super().__init__(url, stack)
        self.jobs = self._graph("contract").jobs
        names = QueueNames("contract")

        def runner(owner: str) -> StepRunner:
            return contract_runner(self._graph(owner), names)

        self.workers = Workers(self.jobs, runner)
        stack.callback(self.workers.close)
        operations = OperationsStore(self.pool)
        self.claims = TakenClaims(
            self.workers,
            take=self._take,
            reap=lambda: reap_once(self.jobs, operations, "contract-reaper"),
        )

    def _graph(self, owner: str, leases: LeasePolicy | None = None) -> Graph:
        """A drive loop's graph (actors.worker.open_graph, relay=False): no outbox, no relay."""
        return assemble(self.pool, registry=REGISTRY, leases=leases or LeasePolicy(), owner=owner)

    def _take(
        self, project_id: str, owner: str, limit: int, kinds: Collection[str] | None
    ) -> list[Job]:
        return claim_next(
            self.pool, Work.of(kinds=kinds, projects=[project_id]), owner=owner, limit=limit
        )

    def repo(self, *, leases: LeasePolicy | None = None) -> JobRepository:
        producer = self._graph("contract-producer", leases).jobs
        return FleetRepository(workers=self.workers, claims=self.claims, producer=producer)

    def notifier(self) -> JobReadyNotifier:
        notifier = PostgresJobReadyNotifier(url=self.url)
        self._stack.callback(notifier.close)
        return notifier

    def stall(self, owner: str) -> None:
        self.workers.stall(owner)

    def dispatched(self, project_id: str, n: int) -> bool:
        return True


class RabbitMqBackend(PostgresRecord):
    """The fleet: outbox and relay, RabbitMQ, the Dramatiq consumer and actors, the runner."""

    name = "rabbitmq"

    def __init__(self, url: str, amqp: Amqp, stack: ExitStack) -> None:
        super().__init__(url, stack)
        self.amqp = amqp
        names = amqp.names
        tiers = dict(zip(TIERS.names, TIERS.tiers, strict=True))
        lanes = [lane.value for lane in Lane]
        topology = Topology(names, tiers, lanes)
        connection = amqp.connect()
        caps = detect(connection)
        topology.declare(amqp.channel(connection), caps)  # recorded: the teardown deletes it
        self.graph = self._graph()
        assert self.graph.relay is not None  # a bus was given: the graph has its relay
        self.relay = self.graph.relay
        self.jobs = self.graph.jobs
        self.broker = VibeyBroker(
            url=amqp.url,
            dead_exchange=names.dead_exchange,
            declare=lambda channel: topology.declare(channel, caps),
        )

        def runner(owner: str) -> StepRunner:
            return contract_runner(replace(self.graph, owner=owner), names, self.broker)

        self.workers = Workers(self.jobs, runner)
        reconciler = Reconciler(
            jobs=self.jobs,
            records=self.graph.records,
            relay=self.relay,
            url=amqp.url,
            names=names,
            owner=self.graph.owner,
        )
        self.deliveries = Deliveries(self.workers, reap=lambda: _reconciled(reconciler))
        queues = {}
        for lane in lanes:
            queue = names.work_queue(lane)
            queues[queue] = FLEET_THREADS
            dramatiq.Actor(
                self.deliveries.actor,
                broker=self.broker,
                actor_name=step_actor_name(queue),
                queue_name=queue,
                priority=LANE_PRIORITY[lane],
                options={"max_retries": 0},
            )
        worker = LaneWorker(self.broker, prefetch=queues, worker_threads=FLEET_THREADS)
        # Torn down in reverse: the held steps settle and the waiting pointers return first.
        stack.callback(self.relay.stop)
        stack.callback(reconciler.stop)
        stack.callback(self.broker.close)
        stack.callback(worker.drain, DRAIN_GRACE_S)
        stack.callback(self.workers.close)
        stack.callback(self.deliveries.close)
        self.relay.start()
        worker.start()

    def _graph(self) -> Graph:
        """A worker's graph (actors.worker.open_graph, relay=True): every commit's pointers go
        to the outbox and its relay sends them. The project routes are read once (none is
        routed here)."""
        bus = Bus(url=self.amqp.url, names=self.amqp.names, tiers=TIERS)
        owner = f"relay-{uuid.uuid4().hex[:8]}"
        return assemble(
            self.pool,
            registry=REGISTRY,
            leases=LeasePolicy(),
            owner=owner,
            dispatch=True,
            bus=bus,
        )  # not started: the backend starts its relay once the fleet is wired

    def _producer(self, leases: LeasePolicy | None) -> PostgresJobRepository:
        """The job repository the contract enqueues through: the workers' graph's, or, for
        enqueues leased by ``leases``, that of a process of its own (a client: its graph and
        relay, started at once, :class:`vibey.client.Client`'s way)."""
        if leases is None:
            return self.jobs
        graph = assemble(
            self.pool,
            registry=REGISTRY,
            leases=leases,
            owner=f"producer-{uuid.uuid4().hex[:8]}",
            dispatch=True,
            bus=Bus(url=self.amqp.url, names=self.amqp.names, tiers=TIERS),
            connect=RELAY_CONNECT_S,
        )
        assert graph.relay is not None, "the producer's relay did not connect"
        self._stack.callback(graph.relay.stop)
        return graph.jobs

    def repo(self, *, leases: LeasePolicy | None = None) -> JobRepository:
        return FleetRepository(
            workers=self.workers, claims=self.deliveries, producer=self._producer(leases)
        )

    def notifier(self) -> JobReadyNotifier:
        return _Borrowed(self.deliveries)

    def stall(self, owner: str) -> None:
        self.workers.stall(owner)

    def dispatched(self, project_id: str, n: int) -> bool:
        return self.deliveries.waiting(project_id, n, timeout=DISPATCH_WAIT_S)


class MemoryBackend:
    """The fakes' graph (``actors.graph.assemble_memory``: the job repository dispatching, its
    pointers waking the wakeup), the runner as on the drive loop."""

    name = "memory"

    def __init__(self, stack: ExitStack) -> None:
        self.wakeup = PointerWakeup()
        self.graph = assemble_memory(
            registry=REGISTRY, owner="contract", dispatch=True, on_commit=self.wakeup.submit
        )
        self.jobs = self.graph.jobs
        names = QueueNames("contract")

        def runner(owner: str) -> StepRunner:
            return contract_runner(replace(self.graph, owner=owner), names)

        self.workers = Workers(self.jobs, runner)
        stack.callback(self.workers.close)
        self.claims = TakenClaims(
            self.workers,
            take=lambda project, owner, limit, kinds: self.jobs.claim(
                project, owner=owner, limit=limit, kinds=kinds
            ),
            reap=self.jobs.reap,
        )

    def repo(self, *, leases: LeasePolicy | None = None) -> JobRepository:
        def with_lease(request: EnqueueRequest) -> EnqueueRequest:
            # One fake holds the record, so a policy travels as each request's lease.
            if leases is None:
                return request
            return replace(request, lease=leases.lease_for(request.kind, request.lease))

        return FleetRepository(
            workers=self.workers,
            claims=self.claims,
            producer=self.jobs,
            prepare=with_lease,
        )

    def notifier(self) -> JobReadyNotifier:
        return self.wakeup

    def stall(self, owner: str) -> None:
        self.workers.stall(owner)

    def dispatched(self, project_id: str, n: int) -> bool:
        return True

    def make_due(self, job_id: uuid.UUID) -> None:
        with self.jobs.lock:
            job = self.jobs.state.jobs[job_id]
            self.jobs.state.jobs[job_id] = replace(job, run_after=self.jobs.clock())

    def ledger(self, job_id: uuid.UUID) -> list[tuple[str, JsonObject]]:
        return [(e.kind, e.payload) for e in self.jobs.ledger if e.job_id == job_id]

    def gate_events(self, gate_id: uuid.UUID) -> list[str]:
        return [e.type for e in self.jobs.events if e.payload.get("gate_id") == str(gate_id)]

    def job_count(self, project_id: str) -> int:
        return sum(1 for job in self.jobs.state.jobs.values() if job.project_id == project_id)


class _Borrowed:
    """The deliveries as a notifier whose ``close`` leaves them to the backend."""

    def __init__(self, deliveries: Deliveries) -> None:
        self._deliveries = deliveries

    def wait(self, project_id: str, timeout: float) -> bool:
        return self._deliveries.wait(project_id, timeout)

    def close(self) -> None:
        """The backend closes the deliveries."""


def _reconciled(reconciler: Reconciler) -> ReapResult:
    report = reconciler.run_once()
    return ReapResult(requeued=report.requeued, parked=report.parked + report.dead_letters_parked)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with ExitStack() as stack:
        if request.param == "postgres":
            yield PostgresBackend(request.getfixturevalue("pg_url"), stack)
        elif request.param == "rabbitmq":
            pg_url = request.getfixturevalue("pg_url")
            yield RabbitMqBackend(pg_url, request.getfixturevalue("amqp"), stack)
        elif request.param == "memory":
            yield MemoryBackend(stack)
        else:  # pragma: no cover - a new backend must be added here
            pytest.fail(f"unknown backend {request.param}")


def claim_n(
    repo: JobRepository,
    project_id: str,
    *,
    owner: str,
    n: int = 1,
    timeout: float = 5.0,
    kinds: Collection[str] | None = None,
) -> list[Job]:
    """Claim until ``n`` jobs are held or ``timeout`` passes; returns what was claimed."""
    held: list[Job] = []
    deadline = time.monotonic() + timeout
    while len(held) < n:
        held += repo.claim(project_id, owner=owner, limit=n - len(held), kinds=kinds)
        if len(held) >= n or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return held


def claim_none(
    repo: JobRepository, project_id: str, *, owner: str, settle: float = 0.3
) -> list[Job]:
    """Claim for ``settle`` seconds and return anything claimed (a test expects nothing)."""
    return claim_n(repo, project_id, owner=owner, n=1, timeout=settle)


def contract_runner(
    graph: Graph | MemoryGraph, names: QueueNames, broker: Publisher | None = None
) -> StepRunner:
    """A worker's step runner on ``graph`` (``actors.graph.step_runner``, as the fleet and the
    drive loop build theirs): the contract's handlers and wait tiers."""
    return step_runner(
        graph, handlers=HANDLERS, names=names, tiers=TIERS, on_result=_ignored, broker=broker
    )


def _ignored(_result: StepResult) -> None:
    """The runner's results: the contract reads each step's own (``fleet.Step``)."""
