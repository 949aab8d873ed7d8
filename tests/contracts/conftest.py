"""The backends the job-queue contract runs against.

A backend is a small harness: it builds a :class:`workflows.queue.JobRepository` (optionally with
a lease policy, so tests can expire leases in milliseconds), a wakeup notifier, and claims with
a bounded wait (a dispatching backend delivers asynchronously; the PostgreSQL one answers at
once). The contract file itself never names a backend.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterator
from contextlib import ExitStack
from datetime import timedelta
from typing import Protocol

import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.rabbitmq_queue import RabbitMqJobRepository, RabbitMqJobWakeup, RabbitMqQueueOptions
from actors.relay import Relay, Router
from actors.topology import Topology
from store.dispatch import DispatchRecords
from store.jobs import PostgresJobRepository
from store.notify import PostgresJobReadyNotifier
from tests.amqp_fixtures import Amqp
from workflows.dispatch import Lane, WaitTiers
from workflows.job import LeasePolicy
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import Job, JobReadyNotifier, JobRepository

# "postgres+outbox" is the PostgreSQL backend with dispatch generations and the outbox on (what
# the RabbitMQ backend's record store runs): the same promises must hold with them.
BACKENDS = ["postgres", "postgres+outbox", "rabbitmq"]
# The projects the contract file uses; the RabbitMQ backend gives each its dedicated queues.
PROJECTS = ("proj-a", "proj-b")
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5), timedelta(seconds=30)))


class Backend(Protocol):
    name: str

    def repo(self, *, leases: LeasePolicy | None = None) -> JobRepository: ...

    def notifier(self) -> JobReadyNotifier: ...

    def sql(self, query: str, *params: object) -> list[tuple[object, ...]]:
        """Read the record store directly (PostgreSQL is the record on every backend)."""
        ...


class PostgresBackend:
    name = "postgres"

    def __init__(self, url: str, stack: ExitStack, *, dispatch: bool = False) -> None:
        self.url = url
        self.dispatch = dispatch
        self._stack = stack
        self.pool = stack.enter_context(
            ConnectionPool(url, min_size=1, max_size=24, open=True, kwargs={"autocommit": True})
        )
        self.pool.wait(timeout=30)

    def repo(self, *, leases: LeasePolicy | None = None) -> JobRepository:
        return PostgresJobRepository(pool=self.pool, leases=leases, dispatch=self.dispatch)

    def notifier(self) -> JobReadyNotifier:
        notifier = PostgresJobReadyNotifier(url=self.url)
        self._stack.callback(notifier.close)
        return notifier

    def sql(self, query: str, *params: object) -> list[tuple[object, ...]]:
        with self.pool.connection() as conn:
            cur = conn.execute(query.encode(), params)
            return cur.fetchall() if cur.description else []


class RabbitMqBackend(PostgresBackend):
    """Dispatch on RabbitMQ: a relay publishes each commit's pointers; ``claim`` takes the
    project's buffered deliveries and makes the fenced pointer claim."""

    name = "rabbitmq"

    def __init__(self, url: str, amqp: Amqp, stack: ExitStack) -> None:
        super().__init__(url, stack, dispatch=True)
        connection = amqp.connect()
        tiers = dict(zip(TIERS.names, TIERS.tiers, strict=True))
        topology = Topology(
            amqp.names, tiers, [lane.value for lane in Lane], dedicated_projects=PROJECTS
        )
        caps = detect(connection)
        channel = amqp.channel(connection)
        topology.declare(channel, caps)
        for project in PROJECTS:
            for lane in Lane:
                topology.declare_dedicated(channel, caps, lane.value, project)
        self.amqp = amqp
        self.records = DispatchRecords(pool=self.pool, relay_id=f"relay-{uuid.uuid4().hex[:8]}")
        router = Router(names=amqp.names, tiers=TIERS, dedicated=PROJECTS, kinds=STEP_KINDS)
        self.relay = Relay(url=amqp.url, records=self.records, router=router)
        self.relay.start()
        stack.callback(self.relay.stop)
        self._latest: RabbitMqJobRepository | None = None

    def repo(self, *, leases: LeasePolicy | None = None) -> JobRepository:
        jobs = PostgresJobRepository(
            pool=self.pool,
            leases=leases,
            dispatch=True,
            relay_id=self.records.relay_id,
            after_commit=self.relay.submit,
        )
        repo = RabbitMqJobRepository(
            jobs=jobs,
            records=self.records,
            relay=self.relay,
            url=self.amqp.url,
            names=self.amqp.names,
            tiers=TIERS,
            projects=PROJECTS,
            # A claimer holds at most `prefetch` deliveries at once (held until settled); the
            # contract holds up to 40 claims unsettled, so the harness allows 64.
            options=RabbitMqQueueOptions(prefetch=64, first_claim_wait=timedelta(milliseconds=500)),
        )
        self._stack.callback(repo.close)
        self._latest = repo
        return repo

    def notifier(self) -> JobReadyNotifier:
        repo = self._latest or self.repo()
        assert isinstance(repo, RabbitMqJobRepository)
        return RabbitMqJobWakeup(repo)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, pg_url: str) -> Iterator[Backend]:
    with ExitStack() as stack:
        if request.param in ("postgres", "postgres+outbox"):
            yield PostgresBackend(pg_url, stack, dispatch=request.param == "postgres+outbox")
        elif request.param == "rabbitmq":
            yield RabbitMqBackend(pg_url, request.getfixturevalue("amqp"), stack)
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
