"""The worker fleet: worker processes under a supervisor.

``vibey worker`` runs :func:`supervise`: :class:`Supervisor` starts ``processes`` processes
(forked from a forkserver that imported this module once) and respawns one that dies
(Dramatiq's own master exits when a child dies). Each runs :func:`run_process`: the
backend's runtime, :class:`actors.worker.Runtime` (Dramatiq on the lane queues) or
:class:`actors.drive.PostgresRuntime` (the drive loop), until SIGTERM, then drains.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from typing import Any

from actors import metrics
from actors.drive import PostgresRuntime
from actors.worker import Runtime, WorkerConfig, dead_queue_depth
from store.db import Pool
from store.operations import OperationsStore
from store.pool import open_pool

log = logging.getLogger(__name__)


def run_process(config: WorkerConfig, *, ready: Any = None) -> None:
    """A worker process: run until SIGTERM or SIGINT, then drain."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(processName)s %(name)s %(message)s"
    )
    logging.getLogger("pika").setLevel(logging.WARNING)  # its INFO narrates every close
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    runtime: Runtime | PostgresRuntime
    runtime = PostgresRuntime(config) if config.queue.backend == "postgres" else Runtime(config)
    runtime.start()
    if ready is not None:
        ready.set()
    stop.wait()
    cut = runtime.stop()
    log.info("drained%s", f"; {cut} step(s) cut at the grace" if cut else ": every step settled")


QUICK_EXIT_S = 10.0  # an error exit this soon after the start backs the respawn off
RESPAWN_BASE_S = 0.5
RESPAWN_MAX_S = 30.0

# What the forkserver imports once, so that a worker process (and every respawn) is a fork
# that imports nothing more: this module (Dramatiq, psycopg, pika, the store), then what a
# runtime's start imports lazily: the handlers and the engines behind them, the protocol's
# definition, the reconciler's trigger, the pool's threads and the codec a host name's
# connection takes. A user's own handlers and definitions are imported by each process, as
# before: their imports may do what a fork must not inherit.
PRELOAD = (
    "actors.fleet",
    "actors.handlers",
    "workflows.protocol",
    "apscheduler.triggers.interval",
    "concurrent.futures.thread",
    "encodings.idna",
    "encodings.ascii",
)


class Supervisor:
    """Runs ``processes`` worker processes and respawns any that dies (by pid), until
    :meth:`stop`; then stops them all gracefully (SIGTERM: each drains).

    A process killed by a signal (SIGKILL, the OOM killer) is respawned at once. One that
    exits with an error soon after it started (PostgreSQL down, a bad setting) is respawned
    after a doubling delay (0.5 s, 1 s, 2 s, … at most 30 s), so a fleet that cannot start
    does not spin; a process that ran for a while resets its delay."""

    def __init__(self, config: WorkerConfig, *, processes: int) -> None:
        self._config = config
        # forkserver: the server imports vibey once, so a respawn is a fork, not a new
        # interpreter importing Dramatiq, psycopg and pika again.
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(PRELOAD))
        self._children: list[Any] = [None] * processes
        self._started = [0.0] * processes
        self._failures = [0] * processes  # quick error exits in a row, per slot
        self._due: list[float | None] = [None] * processes  # when a dead slot respawns
        self._stopping = threading.Event()
        self.respawns = 0
        self.metrics: metrics.MetricsServer | None = None
        if config.metrics.port is not None:  # before the forkserver starts: it inherits it
            metrics.use_multiprocess_dir()

    def run(self) -> int:
        pool = self._serve_metrics()
        try:
            for slot in range(len(self._children)):
                self._spawn(slot)
            while not self._stopping.wait(0.25):
                self._respawn_dead()
            self._terminate()
        finally:
            if self.metrics is not None:
                self.metrics.stop()
            if pool is not None:
                pool.close()
        return self.respawns

    def _serve_metrics(self) -> Pool | None:
        """The fleet's metrics endpoint (every process's events, the store's state)."""
        if self._config.metrics.port is None:
            return None
        pool = open_pool(self._config.pg_url, min_size=1, max_size=2, name="vibey-metrics")
        collector = metrics.StoreCollector(
            OperationsStore(pool), dead_queue_depth=dead_queue_depth(self._config)
        )
        self.metrics = metrics.MetricsServer(
            port=self._config.metrics.port, collectors=[collector]
        ).start()
        return pool

    def stop(self) -> None:
        self._stopping.set()

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self._children if child is not None]

    def _spawn(self, slot: int) -> None:
        child = self._ctx.Process(
            target=run_process, args=(self._config,), name=f"vibey-worker-{slot}"
        )
        child.start()
        self._children[slot] = child
        self._started[slot] = time.monotonic()
        self._due[slot] = None

    def _respawn_dead(self) -> None:
        now = time.monotonic()
        for slot, child in enumerate(self._children):
            if child is None or child.is_alive() or self._stopping.is_set():
                continue
            if self._due[slot] is None:
                delay = self._respawn_delay(slot, child.exitcode, now)
                log.warning(
                    "worker %s (pid %s) exited %s; respawning%s",
                    slot,
                    child.pid,
                    child.exitcode,
                    f" in {delay:g} s" if delay else "",
                )
                self._due[slot] = now + delay
            if now >= (self._due[slot] or now):
                self.respawns += 1
                self._spawn(slot)

    def _respawn_delay(self, slot: int, exitcode: int | None, now: float) -> float:
        quick_error = (
            exitcode is not None and exitcode > 0 and now - self._started[slot] < QUICK_EXIT_S
        )
        self._failures[slot] = self._failures[slot] + 1 if quick_error else 0
        if not quick_error:
            return 0.0
        return float(min(RESPAWN_BASE_S * 2 ** (self._failures[slot] - 1), RESPAWN_MAX_S))

    def _terminate(self) -> None:
        live = [c for c in self._children if c is not None and c.is_alive()]
        for child in live:
            os.kill(child.pid, signal.SIGTERM)
        for child in self._children:
            if child is not None:
                child.join()


def supervise(config: WorkerConfig, *, processes: int) -> int:
    """Run a supervised fleet until SIGTERM or SIGINT; returns the number of respawns."""
    supervisor = Supervisor(config, processes=processes)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: supervisor.stop())
    return supervisor.run()
