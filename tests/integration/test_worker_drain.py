"""SIGTERM drains a real worker process: it stops taking deliveries at once, hands back what
it buffered, finishes the steps it runs, then exits.

A fleet of one process (2 threads, both lanes; prefetch 4 on the interactive queue, 1 on the
BUILD queue) runs under the :class:`Supervisor`, which respawns it when it exits. Busy: both
threads run a long interactive step, and one interactive and one BUILD pointer wait in the
process's buffer for a thread. On SIGTERM, within ``CANCEL_S``, both buffered pointers are
ready in their queues again (for another process, not held here until the drain ends), and
the BUILD queue, of which the process holds nothing more, counts no consumer. RabbitMQ lists
no consumer of it (``rabbitmqctl list_consumers``, when the broker is local), and a pointer
published during the drain stays ready although the interactive consumer had credit to spare.
Idle: every queue counts no consumer within ``CANCEL_S``.

The interactive queue, whose deliveries the draining process still runs, keeps counting its
cancelled consumer in the passive ``queue_declare``'s ``consumer_count`` until they are
acknowledged: a quorum queue (RabbitMQ's ``rabbit_fifo``) keeps a cancelled consumer, with no
credit, until its checked-out messages settle. That count is not asserted there; that the
broker sends the process nothing more is.

The next process runs the pointers the draining one did not. The steps in flight finish and
settle once: each job succeeded at its first attempt, each handler ran once, and no delivery
came back (every process's step results are tallied: a redelivered pointer would add a
``dropped`` result).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pika
import pika.exceptions
import pytest

from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    EngineSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.fleet import Supervisor
from actors.graph import Graph
from actors.worker import WorkerConfig, open_graph
from tests.amqp_fixtures import Amqp
from tests.integration.drain_handlers import BUILD, INTERACTIVE
from workflows.dispatch import WaitTiers
from workflows.queue import EnqueueRequest

PROJECT = "drain"
THREADS = 2
PREFETCH = 4  # the interactive queue's; the BUILD queue's is THREADS - 1
LONG_S = 15.0  # a long step: the drain's checks all happen while it runs
CANCEL_S = 2.0  # SIGTERM to no consumer on any queue the process consumed
HELD_S = 1.5  # how long a pointer published during the drain is watched not being taken
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))


@dataclass
class Fleet:
    config: WorkerConfig
    supervisor: Supervisor
    graph: Graph  # the test's own relay publishes what it enqueues, at once
    amqp: Amqp
    workspace: Path
    tally: Path

    @property
    def queues(self) -> list[str]:
        return self.config.queues()

    def counts(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of ``queue``, from a passive declare."""
        connection = pika.BlockingConnection(pika.URLParameters(self.amqp.url))
        try:
            method = connection.channel().queue_declare(queue, passive=True).method
            return int(method.message_count), int(method.consumer_count)
        finally:
            connection.close()

    def consumers(self) -> dict[str, int]:
        return {queue: self.counts(queue)[1] for queue in self.queues}

    def listed(self) -> set[str] | None:
        """The queues RabbitMQ lists a consumer on (None: no rabbitmqctl for this broker)."""
        if self.amqp.ctl is None:
            return None
        out = self.amqp.ctl("list_consumers", "-p", self.amqp.vhost, "queue_name")
        return {line.strip() for line in out.splitlines()} & set(self.queues)

    def enqueue(self, subject: str, seconds: float, kind: str = INTERACTIVE) -> None:
        self.graph.jobs.enqueue(
            EnqueueRequest(
                project_id=PROJECT, kind=kind, subject=subject, payload={"seconds": seconds}
            )
        )

    def steps(self) -> list[tuple[str, str, int]]:
        """(start|end, subject, pid), in order."""
        path = self.workspace / "steps"
        if not path.exists():
            return []
        rows = [line.split() for line in path.read_text(encoding="utf-8").splitlines()]
        return [(what, subject, int(pid)) for what, subject, pid in rows]

    def pid(self) -> int:
        (pid,) = self.supervisor.pids
        return pid

    def jobs(self) -> dict[str, tuple[str, int]]:
        """subject -> (state, attempts)."""
        with self.graph.pool.connection() as conn:
            rows = conn.execute(b"SELECT subject, state::text, attempts FROM job").fetchall()
        return {str(s): (str(state), int(attempts)) for s, state, attempts in rows}

    def results(self) -> Counter[str]:
        tally: Counter[str] = Counter()
        for path in self.tally.glob("*.log"):
            tally.update(path.read_text(encoding="utf-8").split())
        return tally


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> float:
    """Polls ``predicate`` until it holds; returns how long that took."""
    began = time.monotonic()
    while not predicate():
        assert time.monotonic() - began < timeout, f"timed out ({timeout:g} s): {what}"
        time.sleep(0.05)
    return time.monotonic() - began


@pytest.fixture
def fleet(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Fleet]:
    workspace, tally = tmp_path / "work", tmp_path / "tally"
    workspace.mkdir()
    tally.mkdir()
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(
            rabbitmq=RabbitMqSettings(wait_tiers_seconds=TIERS.seconds, prefetch=PREFETCH)
        ),
        worker=WorkerSettings(
            threads=THREADS, handlers="tests.integration.drain_handlers:handlers"
        ),
        engine=EngineSettings(workspace=str(workspace)),
        tally_dir=str(tally),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # recorded: cleanup
    connection.close()
    graph = open_graph(config, owner="drain-test", pool_size=2, relay=True)
    assert graph.relay is not None and graph.routes is not None
    graph.routes.start()
    graph.relay.start()
    supervisor = Supervisor(config, processes=1)
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    running = Fleet(config, supervisor, graph, amqp, workspace, tally)
    try:
        wait_for(
            lambda: supervisor.pids and all(running.consumers().values()),
            60,
            "the worker consumes every queue",
        )
        yield running
    finally:
        supervisor.stop()
        thread.join(timeout=60)
        for pid in supervisor.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        thread.join(timeout=10)
        graph.relay.stop()
        graph.routes.stop()
        graph.pool.close()


def tallied(fleet: Fleet, results: Counter[str]) -> None:
    """Wait for the steps' tallied results to be exactly ``results``: a step's result is
    tallied after its commit, so the last one may trail the job's row a moment."""
    wait_for(lambda: fleet.results() == results, 10, f"the steps' results tallied: {results}")
    assert fleet.results() == results, fleet.results()


def sigterm(fleet: Fleet, ready: Callable[[], bool], what: str) -> int:
    """SIGTERM the fleet's process and wait ``CANCEL_S`` at most for ``ready``; returns its
    pid."""
    pid = fleet.pid()
    os.kill(pid, signal.SIGTERM)
    wait_for(ready, CANCEL_S, f"{what}: {[(q, fleet.counts(q)) for q in fleet.queues]}")
    return pid


def test_a_busy_worker_stops_taking_work_at_once_and_finishes_its_steps(fleet: Fleet) -> None:
    interactive, build = (fleet.config.names.work_queue(lane) for lane in ("interactive", "build"))
    for n in range(THREADS):
        fleet.enqueue(f"long-{n}", LONG_S)
    wait_for(lambda: len(fleet.steps()) == THREADS, 60, "every worker thread runs a long step")
    # Delivered, but no thread is free to run them: they wait in the process's buffer.
    fleet.enqueue("buffered-i", 0)
    fleet.enqueue("buffered-b", 0, kind=BUILD)
    wait_for(
        lambda: fleet.counts(interactive)[0] == fleet.counts(build)[0] == 0,
        30,
        "the buffered pointers are delivered",
    )
    draining = sigterm(
        fleet,
        lambda: fleet.counts(build) == (1, 0) and fleet.counts(interactive)[0] == 1,
        "the draining worker hands its buffered pointers back and cancels its consumers",
    )
    assert fleet.listed() in (None, set())  # RabbitMQ lists no consumer of it
    fleet.enqueue("after", 0)  # its interactive consumer has credit to spare: prefetch 4
    wait_for(lambda: fleet.counts(interactive)[0] == 2, 30, "the later pointer is published")
    time.sleep(HELD_S)
    # Still draining (its long steps run), and no pointer was taken by it.
    assert fleet.pid() == draining
    assert [what for what, _, _ in fleet.steps()] == ["start"] * THREADS
    assert fleet.counts(interactive)[0] == 2
    assert fleet.counts(build) == (1, 0)
    # The next process runs them once the draining one has exited.
    wait_for(lambda: fleet.pid() != draining, LONG_S + 60, "the drained worker exits")
    subjects = {f"long-{n}" for n in range(THREADS)} | {"buffered-i", "buffered-b", "after"}
    wait_for(
        lambda: fleet.jobs() == dict.fromkeys(subjects, ("succeeded", 1)),
        60,
        f"every job succeeds at its first attempt: {fleet.jobs()}",
    )
    steps = fleet.steps()
    assert len(steps) == 2 * len(subjects), steps  # each ran once
    for n in range(THREADS):  # the steps in flight finished in the draining process
        assert ("end", f"long-{n}", draining) in steps, steps
    for subject in subjects - {f"long-{n}" for n in range(THREADS)}:
        ((pid,),) = {(p,) for what, s, p in steps if what == "start" and s == subject}
        assert pid != draining, steps
    # Each delivery was settled once: none came back to be dropped as a duplicate.
    tallied(fleet, Counter({"succeeded": len(subjects)}))
    assert all(fleet.counts(queue)[0] == 0 for queue in fleet.queues)


def test_an_idle_worker_cancels_its_consumers_at_once(fleet: Fleet) -> None:
    draining = sigterm(
        fleet, lambda: not any(fleet.consumers().values()), "the idle worker's consumers go"
    )
    fleet.enqueue("after", 0)
    wait_for(lambda: fleet.jobs().get("after") == ("succeeded", 1), 60, "the next worker runs it")
    ((_, _, later), _) = fleet.steps()
    assert later != draining
    tallied(fleet, Counter({"succeeded": 1}))
