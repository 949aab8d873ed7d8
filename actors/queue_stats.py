"""What ``vibey queue stats`` reports: each queue's depth and consumers, the jobs leased in
each lane (a leased job holds its delivery unacknowledged), the dead letters, the outbox's lag
and the claimable job that has waited longest.

On the rabbitmq backend the queues are read with passive declares (one connection); a queue
that does not exist is reported as missing. On the postgres backend a lane's "queue" is its
claimable rows. Everything else comes from PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from actors import amqp
from actors.worker import WorkerConfig, load_registry
from store.db import Pool
from store.drive import Work, build_kinds, claimable_count
from store.operations import OperationsStore
from workflows.dispatch import Lane

PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    lane: str | None  # None: the dead-letter queue
    project: str | None  # a dedicated project's queue
    exists: bool
    ready: int | None  # messages waiting (rabbitmq) or claimable rows (postgres)
    consumers: int | None  # None on the postgres backend


@dataclass(frozen=True, slots=True)
class QueueStats:
    backend: str
    queues: list[QueueRow]
    leased_by_lane: dict[str, int]
    dead_queue: int | None  # messages in the dead-letter queue (rabbitmq)
    dead_kept: int  # dead letters kept in dead_letter (vibey queue dead)
    outbox_unsent: int
    outbox_oldest_s: float
    oldest_ready: dict[str, Any] | None = field(default=None)


def gather(config: WorkerConfig, pool: Pool) -> QueueStats:
    ops = OperationsStore(pool)
    building = build_kinds(load_registry(config.definitions).kinds)
    leased: dict[str, int] = {lane: 0 for lane in config.lanes}
    for state, kind, n in ops.live_jobs():
        if state == "leased":
            lane = (Lane.BUILD if kind in building else Lane.INTERACTIVE).value
            leased[lane] = leased.get(lane, 0) + n
    if config.backend == "postgres":
        queues = _claimable(config, pool, building)
        dead_queue = None
    else:
        queues, dead_queue = _broker_queues(config)
    unsent, oldest = ops.outbox_lag()
    oldest_ready = ops.oldest_ready()
    return QueueStats(
        backend=config.backend,
        queues=queues,
        leased_by_lane=leased,
        dead_queue=dead_queue,
        dead_kept=ops.dead_letter_count(),
        outbox_unsent=unsent,
        outbox_oldest_s=oldest,
        oldest_ready=None
        if oldest_ready is None
        else {**oldest_ready, "id": str(oldest_ready["id"])},
    )


def _claimable(config: WorkerConfig, pool: Pool, building: frozenset[str]) -> list[QueueRow]:
    projects = config.projects or None
    return [
        QueueRow(f"{lane} (claimable rows)", lane, None, True, count, None)
        for lane in config.lanes
        for count in [claimable_count(pool, Work.for_lanes([lane], projects, build_kinds=building))]
    ]


def expected_queues(config: WorkerConfig) -> list[tuple[str, str | None, str | None]]:
    """(queue, lane, project) for every work queue the settings route to, then the dead queue."""
    names = config.names
    projects: Sequence[str | None] = [None, *config.dedicated_projects, *config.projects]
    out = [
        (names.work_queue(lane, project), lane, project)
        for project in dict.fromkeys(projects)
        for lane in config.lanes
    ]
    return [*out, (names.dead_queue, None, None)]


def _broker_queues(config: WorkerConfig) -> tuple[list[QueueRow], int | None]:
    connection = amqp.connect(config.amqp_url, timeout=PROBE_TIMEOUT_S)
    rows: list[QueueRow] = []
    try:
        for name, lane, project in expected_queues(config):
            channel = connection.channel()
            try:
                method = channel.queue_declare(name, passive=True).method
            except amqp.ChannelClosedByBroker:
                rows.append(QueueRow(name, lane, project, False, None, None))
                continue
            rows.append(
                QueueRow(name, lane, project, True, method.message_count, method.consumer_count)
            )
            channel.close()
    finally:
        connection.close()
    dead = rows[-1]
    return rows[:-1], dead.ready
