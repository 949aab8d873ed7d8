"""The composition root: settings in, the parts' configurations out. It wires; it decides nothing.

Every value comes from :class:`vibey.settings.Settings` (the command line's choices arrive as
arguments, or already folded into the settings with ``dataclasses.replace``). Whatever cannot
run is a :class:`vibey.settings.SettingsError` here, in the process that was started, before a
worker process is spawned: a child that fails at start would only be respawned.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from actors.rabbitmq_queue import RabbitMqQueueOptions
from actors.worker import WorkerConfig, load_object
from store.db import Pool
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.pool import open_pool
from store.workflows import WorkflowStore
from vibey.settings import Settings, SettingsError, check_project_ids
from workflows.engine import Registry

DEFINITIONS_FIX = "fix VIBEY_WORKFLOW_DEFINITIONS (or definitions under [workflow])"
# A command publishes what it committed with a relay of its own, for at most these long; what
# is not confirmed by then is left to the workers' reconcilers (within reconcile_interval).
CLI_RELAY_CONNECT_SECONDS = 2.0
CLI_RELAY_FLUSH_SECONDS = 5.0
CLI_RELAY_STOP_SECONDS = 1.0


def worker_config(settings: Settings, *, projects: Sequence[str] = ()) -> WorkerConfig:
    """The fleet's configuration; ``projects``: serve only their dedicated queues (on the
    postgres backend: claim only their jobs).

    Checked in this order: on the rabbitmq backend an AMQP URL is set (else
    :class:`~vibey.settings.QueueBackendNotConfigured`, naming both fixes), a database URL is
    set, the project ids, then the queue names, the handlers and the workflow definitions.
    """
    postgres = settings.queue.backend == "postgres"
    amqp_url = "" if postgres else settings.require_amqp_url()
    pg_url = settings.require_database_url()
    rabbitmq, worker = settings.queue.rabbitmq, settings.worker
    config = WorkerConfig(
        pg_url=pg_url,
        amqp_url=amqp_url,
        prefix=settings.bus.prefix,
        lanes=worker.lanes,
        projects=check_project_ids(projects, "fix --project"),
        dedicated_projects=rabbitmq.dedicated_projects,
        tiers=rabbitmq.wait_tiers,
        leases=settings.queue.lease,
        threads=worker.threads,
        prefetch=rabbitmq.prefetch,
        delivery_limit=rabbitmq.delivery_limit,
        reconcile_interval=timedelta(seconds=rabbitmq.reconcile_interval_seconds),
        redispatch_after=timedelta(seconds=rabbitmq.redispatch_after_seconds),
        reclaim_after=timedelta(seconds=rabbitmq.reclaim_after_seconds),
        handlers=worker.handlers,
        definitions=settings.workflow.definitions,
        workspace=settings.engine.workspace,
        engine_command=settings.engine.command,
        engine_timeout=timedelta(seconds=settings.engine.timeout_seconds),
        max_dollars=settings.engine.max_dollars,
        max_turns=settings.engine.max_turns,
        backend=settings.queue.backend,
        poll_interval=timedelta(seconds=settings.queue.poll_interval_seconds),
        metrics_port=settings.metrics.port,
        outbox_retention=timedelta(seconds=rabbitmq.outbox_retention_seconds),
    )
    _check_names(config)
    _check_handlers(config.handlers)
    load_registry(settings)
    return config


def rabbitmq_queue_options(settings: Settings) -> RabbitMqQueueOptions:
    """The options of the RabbitMQ job repository (the dedicated-project claim path)."""
    rabbitmq = settings.queue.rabbitmq
    given = {} if rabbitmq.prefetch is None else {"prefetch": rabbitmq.prefetch}
    return RabbitMqQueueOptions(
        first_claim_wait=timedelta(seconds=rabbitmq.first_claim_wait_seconds),
        redispatch_after=timedelta(seconds=rabbitmq.redispatch_after_seconds),
        reclaim_after=timedelta(seconds=rabbitmq.reclaim_after_seconds),
        **given,
    )


def _check_names(config: WorkerConfig) -> None:
    """Every exchange and queue name the fleet would declare is one the broker takes."""
    try:
        config.topology()
        config.queues()
    except ValueError as exc:
        raise SettingsError(
            f"{exc}: fix prefix under [bus] (VIBEY_BUS_PREFIX), --project or "
            "dedicated_projects under [queue.rabbitmq]"
        ) from exc


def _check_handlers(path: str) -> None:
    try:
        load_object(path)
    except (ImportError, AttributeError) as exc:
        raise SettingsError(
            f"the handlers {path!r} cannot be loaded ({type(exc).__name__}: {exc}): "
            "fix --handlers, VIBEY_WORKER_HANDLERS (or handlers under [worker])"
        ) from exc


def load_registry(settings: Settings) -> Registry:
    """The workflow definitions ``[workflow] definitions`` names (an iterable of them)."""
    path = settings.workflow.definitions
    try:
        return Registry(load_object(path))
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise SettingsError(
            f"the workflow definitions {path!r} cannot be loaded ({type(exc).__name__}: {exc}): "
            + DEFINITIONS_FIX
        ) from exc


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What a command's commits left for RabbitMQ: ``rows`` outbox rows (dispatch pointers),
    ``published`` of them confirmed by the broker before the command returned (``tried``:
    whether it tried; not without an AMQP URL). The others are sent by the workers'
    reconcilers within ``reconcile_interval``."""

    rows: int
    published: int
    tried: bool


class WorkflowClient:
    """The workflow store as one CLI command uses it: a small pool, the job repository with
    the backend's dispatch, and :meth:`publish` for the outbox rows its commits wrote.

    On the rabbitmq backend with an AMQP URL, the rows a commit writes are claimed for this
    process and :meth:`publish` sends them at once through a short-lived relay (bounded
    waits); whatever it could not send is released to the reconcilers. Without an AMQP URL
    the rows are left unclaimed for the reconcilers. The postgres backend writes none.
    """

    def __init__(self, settings: Settings, pool: Pool, registry: Registry) -> None:
        self.settings = settings
        self._pool = pool
        dispatching = settings.queue.backend == "rabbitmq"
        publishing = dispatching and settings.bus.amqp_url is not None
        self._relay_id = f"vibey-cli:{socket.gethostname()}:{os.getpid()}" if publishing else None
        self._outbox: list[int] = []
        self.jobs = PostgresJobRepository(
            pool=pool,
            leases=settings.queue.lease,
            dispatch=dispatching,
            relay_id=self._relay_id,
            after_commit=self._outbox.extend,
        )
        self.store = WorkflowStore(
            pool=pool, jobs=self.jobs, registry=registry, ledger=Ledger(pool)
        )

    def publish(self) -> Dispatch:
        """Send the outbox rows the commits so far wrote; never raises for the broker."""
        ids = tuple(dict.fromkeys(self._outbox))
        self._outbox.clear()
        if not ids or self._relay_id is None or self.settings.bus.amqp_url is None:
            return Dispatch(len(ids), 0, tried=False)
        from actors.relay import Relay, Router  # pika: only a command that publishes
        from actors.topology import QueueNames
        from store.dispatch import DispatchRecords

        rabbitmq = self.settings.queue.rabbitmq
        records = DispatchRecords(pool=self._pool, relay_id=self._relay_id)
        relay = Relay(
            url=self.settings.bus.amqp_url,
            records=records,
            router=Router(
                names=QueueNames(self.settings.bus.prefix),
                tiers=rabbitmq.wait_tiers,
                dedicated=rabbitmq.dedicated_projects,
            ),
        )
        try:
            relay.start(timeout=CLI_RELAY_CONNECT_SECONDS)
            relay.submit(ids)
            relay.flush(timeout=CLI_RELAY_FLUSH_SECONDS)
        except TimeoutError:  # RabbitMQ did not answer: the reconcilers send them
            pass
        finally:
            relay.stop(timeout=CLI_RELAY_STOP_SECONDS)
            records.release(ids)  # only rows still unsent: back to the reconcilers at once
        return Dispatch(len(ids), relay.published, tried=True)


@contextmanager
def workflow_client(settings: Settings) -> Iterator[WorkflowClient]:
    """A :class:`WorkflowClient` on a pool of its own, closed on the way out. Checks the
    database URL, then the definitions, then connects (DatabaseUnavailable if it cannot)."""
    url = settings.require_database_url()
    registry = load_registry(settings)
    pool = open_pool(url, min_size=1, max_size=2, name="vibey-cli")
    try:
        yield WorkflowClient(settings, pool, registry)
    finally:
        pool.close()
