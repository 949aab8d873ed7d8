"""The client's object graph and its relay: what :class:`vibey.client.Client` builds beside
its pool (:class:`~vibey.client_reads.ClientReads`) for the writes, and stops when closed.

The graph (job repository, workflow store, relay: one :func:`actors.graph.assemble`) is built
at the client's start when it connects a relay, else at the first call that needs it. Every
commit's dispatch pointers are handed to the relay right after the commit; :meth:`flush`
waits until the broker confirmed them and gives back to the reconcilers what it did not.
Nothing of :mod:`actors` is imported until the graph is built, so a read command's client
loads neither pika nor Dramatiq.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Self

from store.pool import open_pool
from store.routes import read_routes
from vibey.client_reads import ClientReads
from vibey.settings import Settings, load_settings
from workflows.engine import Registry

if TYPE_CHECKING:
    from actors.graph import Bus, Graph
    from actors.relay import Router
    from store.db import Pool
    from store.dispatch import DispatchRecords
    from store.jobs import PostgresJobRepository
    from store.unit_of_work import OutboxRow
    from store.workflows import WorkflowStore

RELAY_CONNECT_SECONDS = 2.0
FLUSH_SECONDS = 5.0
STOP_SECONDS = 5.0
PENDING_LIMIT = 100_000  # ids kept to give back unsent rows at flush (older ones: reclaimed)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What the commits since the last flush left for RabbitMQ: ``rows`` outbox rows,
    ``published`` of them confirmed by the broker (``tried``: whether a relay was running)."""

    rows: int
    published: int
    tried: bool


class ClientGraph(ClientReads):
    """The pool, the graph assembled on it and the relay's life; :class:`vibey.client.Client`
    adds what a user does with them."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        registry: Registry | None = None,
        pool: Pool | None = None,
        pool_size: int = 4,
        connect_relay: bool = True,
        listen_routes: bool = True,
        name: str = "vibey-client",
    ) -> None:
        """``settings`` default to :func:`vibey.settings.load_settings`; ``registry`` to the
        definitions they name (loaded on first use). ``pool``: share one the caller owns (it
        is not closed). ``name`` prefixes the relay's id (who holds an outbox row it was
        handed). ``listen_routes=False`` reads the project routes once instead of following
        their changes (one CLI command)."""
        self.settings = settings if settings is not None else load_settings()
        url = self.settings.require_database_url()
        self._owns_pool = pool is None
        pool = pool or open_pool(url, min_size=1, max_size=pool_size, name="vibey-client")
        super().__init__(pool, registry)
        self._lock = threading.Lock()
        self._pending: deque[int] = deque(maxlen=PENDING_LIMIT)
        self._name, self._listen = name, url if listen_routes else None
        self._connect = connect_relay
        self._tried = connect_relay and self._bus_settings() is not None  # a relay was tried
        self._graph: Graph | None = None
        self._graph_lock = threading.Lock()
        self._published_before = 0
        if connect_relay:
            self._built()

    def _bus_settings(self) -> tuple[str, str] | None:
        """The AMQP URL and prefix this client's relay sends to: none without an AMQP URL, or
        on the postgres backend (the workers claim the jobs from PostgreSQL)."""
        settings = self.settings
        if settings.queue.backend != "rabbitmq" or settings.bus.amqp_url is None:
            return None
        return settings.bus.amqp_url, settings.bus.prefix

    def _built(self) -> Graph:
        """The graph, assembled on first use (:mod:`actors.graph`, the composition root)."""
        with self._graph_lock:
            if self._graph is None:
                self._graph = self._assemble()
            return self._graph

    def _assemble(self) -> Graph:
        from actors.graph import assemble
        from actors.tracing import step_tracer

        tracing = self.settings.tracing
        return assemble(
            self._pool,
            registry=self.registry,
            leases=self.settings.queue.lease,
            owner=f"{self._name}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
            tracer=step_tracer(tracing.otlp_endpoint, service_name=tracing.service_name),
            dispatch=self.settings.queue.backend == "rabbitmq",
            bus=self._bus() if self._connect else None,
            connect=RELAY_CONNECT_SECONDS,
            on_commit=self._committed,
        )

    def _bus(self) -> Bus | None:
        from actors.graph import Bus
        from actors.topology import QueueNames

        found = self._bus_settings()
        if found is None:
            return None
        url, prefix = found
        return Bus(
            url=url,
            names=QueueNames(prefix),
            tiers=self.settings.queue.rabbitmq.wait_tiers,
            listen=self._listen,
        )

    @property
    def store(self) -> WorkflowStore:
        """The workflow store of this client's graph."""
        return self._built().workflows

    @property
    def jobs(self) -> PostgresJobRepository:
        """The job repository of this client's graph."""
        return self._built().jobs

    def _committed(self, rows: Sequence[OutboxRow]) -> None:
        with self._lock:
            self._pending.extend(row.id for row in rows)

    def router(self) -> Router:
        """How pointers are routed now (the rabbitmq backend): each kind to its lane, each
        project to its dedicated queues when the project routes say so."""
        from actors.relay import Router
        from actors.topology import QueueNames

        routes = self._graph.routes if self._graph is not None else None
        return Router(
            names=QueueNames(self.settings.bus.prefix),
            tiers=self.settings.queue.rabbitmq.wait_tiers,
            dedicated=routes if routes is not None else read_routes(self._pool),
            kinds=self.registry.kinds,
        )

    # -- dispatch and life -------------------------------------------------------------------

    def flush(self, timeout: float = FLUSH_SECONDS) -> Dispatch:
        """Wait (at most ``timeout``) until the broker confirmed every pointer committed so far;
        what it did not confirm is left to the reconcilers. Never raises for the broker."""
        with self._lock:
            ids = tuple(self._pending)
            self._pending.clear()
        relay = None if self._graph is None else self._graph.relay
        if relay is None:
            return Dispatch(len(ids), 0, tried=self._tried)
        if not relay.flush(timeout=timeout) or relay.returned:
            self._records().release(ids)  # only rows still unsent: back to the reconcilers
        published = relay.published - self._published_before
        self._published_before = relay.published
        return Dispatch(len(ids), published, tried=True)

    def _records(self) -> DispatchRecords:
        return self._built().records

    publish = flush  # the CLI's name for it

    def close(self) -> None:
        graph = self._graph
        if graph is not None and graph.relay is not None:
            self.flush(timeout=STOP_SECONDS)
            graph.relay.stop(timeout=STOP_SECONDS)
        if graph is not None and graph.routes is not None:
            graph.routes.stop()
        if graph is not None:  # stopped: a second close stops nothing
            self._graph = replace(graph, relay=None, router=None, routes=None)
        if self._owns_pool:
            self._pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
