"""What ``vibey queue stats`` reports: each queue's depth and consumers, the jobs leased in
each lane (a leased job holds its delivery unacknowledged), the dead letters, the outbox's lag
and the claimable job that has waited longest.

On the rabbitmq backend the queues are read with passive declares (one connection); a queue
that does not exist is reported as missing, and one holding pointers that no consumer serves
as "waiting for a worker on <queue>: none is consuming". The dedicated queues listed are the
routed projects' (``project_route``, the table every publisher routes by), plus those a
``--project`` names. On the postgres backend a lane's "queue" is its claimable rows.
Everything else comes from PostgreSQL.

``problems`` names what is wrong with the fixing command, as ``vibey doctor`` does: a lane
queue nobody consumes (a stopped consumer), a missing queue, an outbox row unsent for longer
than :func:`stale_after` (nobody relays or reconciles).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from actors import amqp
from actors.loaders import load_registry
from actors.worker import WorkerConfig
from store.db import Pool
from store.drive import Work, build_kinds, claimable_count
from store.operations import OperationsStore
from store.routes import read_routes
from workflows.dispatch import Lane

PROBE_TIMEOUT_S = 5.0
STALE_FACTOR = 3  # a heartbeat or an unsent row older than this many intervals is stale
STALE_FLOOR = timedelta(seconds=60)


def stale_after(config: WorkerConfig) -> timedelta:
    """How old a reconcile heartbeat or an unsent outbox row may be before it is a problem."""
    return max(
        timedelta(seconds=config.queue.rabbitmq.reconcile_interval_seconds) * STALE_FACTOR,
        STALE_FLOOR,
    )


@dataclass(frozen=True, slots=True)
class Problem:
    what: str
    fix: str


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    lane: str | None  # None: the dead-letter queue
    project: str | None  # a dedicated project's queue
    exists: bool
    ready: int | None  # messages waiting (rabbitmq) or claimable rows (postgres)
    consumers: int | None  # None on the postgres backend

    @property
    def unserved(self) -> bool:
        """Pointers wait in it and nothing consumes it."""
        return self.lane is not None and bool(self.ready) and self.consumers == 0


def waiting_line(queue: str) -> str:
    return f"waiting for a worker on {queue}: none is consuming"


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
    routed: list[str] = field(default_factory=list)  # projects with dedicated queues
    waiting: list[str] = field(default_factory=list)  # queues holding pointers, no consumer
    problems: list[Problem] = field(default_factory=list)


def gather(config: WorkerConfig, pool: Pool) -> QueueStats:
    ops = OperationsStore(pool)
    building = build_kinds(load_registry(config.workflow.definitions).kinds)
    leased: dict[str, int] = {lane: 0 for lane in config.worker.lanes}
    for state, kind, n in ops.live_jobs():
        if state == "leased":
            lane = (Lane.BUILD if kind in building else Lane.INTERACTIVE).value
            leased[lane] = leased.get(lane, 0) + n
    routed = sorted(read_routes(pool).projects)
    if config.queue.backend == "postgres":
        queues = _claimable(config, pool, building)
        dead_queue = None
    else:
        queues, dead_queue = _broker_queues(config, routed)
    unsent, oldest = ops.outbox_lag()
    oldest_ready = ops.oldest_ready()
    problems = _queue_problems(queues)
    if (
        config.queue.backend == "rabbitmq"
        and unsent
        and oldest > stale_after(config).total_seconds()
    ):
        what = f"{unsent} dispatches unsent, the oldest for {oldest:.0f} s (a stale outbox)"
        problems.append(Problem(what, "vibey reconcile --once"))
    return QueueStats(
        backend=config.queue.backend,
        queues=queues,
        leased_by_lane=leased,
        dead_queue=dead_queue,
        dead_kept=ops.dead_letter_count(),
        outbox_unsent=unsent,
        outbox_oldest_s=oldest,
        oldest_ready=None
        if oldest_ready is None
        else {**oldest_ready, "id": str(oldest_ready["id"])},
        routed=routed,
        waiting=[row.name for row in queues if row.unserved],
        problems=problems,
    )


def _queue_problems(queues: Sequence[QueueRow]) -> list[Problem]:
    problems = []
    for row in queues:
        if row.lane is None:
            continue
        flags = f" --lanes {row.lane}" + (f" --project {row.project}" if row.project else "")
        if not row.exists:
            problems.append(Problem(f"{row.name} is missing", "vibey worker"))
        elif row.consumers == 0:
            what = f"no consumer on {row.name}: its jobs wait (a stopped consumer)"
            problems.append(Problem(what, f"vibey worker{flags}"))
    return problems


def _claimable(config: WorkerConfig, pool: Pool, building: frozenset[str]) -> list[QueueRow]:
    projects = config.projects or None
    return [
        QueueRow(f"{lane} (claimable rows)", lane, None, True, count, None)
        for lane in config.worker.lanes
        for count in [claimable_count(pool, Work.for_lanes([lane], projects, build_kinds=building))]
    ]


def expected_queues(
    config: WorkerConfig, routed: Collection[str] = ()
) -> list[tuple[str, str | None, str | None]]:
    """(queue, lane, project) for every work queue pointers are routed to (the shared lanes,
    the ``routed`` projects' dedicated queues and the ``--project`` ones), then the dead queue."""
    names = config.names
    projects: Sequence[str | None] = [None, *routed, *config.projects]
    out = [
        (names.work_queue(lane, project), lane, project)
        for project in dict.fromkeys(projects)
        for lane in config.worker.lanes
    ]
    return [*out, (names.dead_queue, None, None)]


def consumer_counts(amqp_url: str, queues: Iterable[str]) -> dict[str, int | None]:
    """Each queue's consumers (None: the queue does not exist); {} when RabbitMQ does not
    answer."""
    counts: dict[str, int | None] = {}
    try:
        connection = amqp.connect(amqp_url, timeout=PROBE_TIMEOUT_S)
    except amqp.AMQPError:
        return counts
    try:
        for name in queues:
            channel = connection.channel()
            try:
                counts[name] = channel.queue_declare(name, passive=True).method.consumer_count
            except amqp.ChannelClosedByBroker:
                counts[name] = None
                continue
            channel.close()
    finally:
        connection.close()
    return counts


def _broker_queues(
    config: WorkerConfig, routed: Collection[str]
) -> tuple[list[QueueRow], int | None]:
    connection = amqp.connect(config.amqp_url, timeout=PROBE_TIMEOUT_S)
    rows: list[QueueRow] = []
    try:
        for name, lane, project in expected_queues(config, routed):
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
