"""Benchmark: an interactive step's start latency with and without a saturated BUILD lane.

One in-process worker (``--threads`` threads serving both lanes, RabbitMQ dispatch) runs, in
turn:

1. idle: ``--samples`` interactive steps, one at a time, nothing else running;
2. saturated: the same while the BUILD lane holds a backlog of ``--backlog`` steps of
   ``--build-seconds`` each (topped up, so it never drains), each sample at a random point
   of the running BUILD steps (seeded: the same points every run);
3. saturated, as before this change: the same, with every thread open to BUILD steps (the
   BUILD queues' prefetch not capped at ``threads - 1``), to show what the kept thread buys.

The latency is handler start − the moment before the enqueue's commit (outbox → relay →
RabbitMQ → Dramatiq → fenced claim). It prints p50 and p90 of each, in milliseconds.

VIBEY_TEST_PG_URL is an admin URL (a scratch database is created and dropped);
VIBEY_TEST_AMQP_URL the broker (every queue and exchange under a unique prefix, deleted
afterwards).

    .venv/bin/python ops/bench/priority.py [--threads 4] [--samples 30] [--backlog 40]
        [--build-seconds 2]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from steps import declared_topology, percentile, scratch_database

from actors.config import (
    BusSettings,
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.worker import Runtime, WorkerConfig
from store.migrate import migrate
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Handlers, Success

PROJECT = "bench"
INTERACTIVE, BUILD = "design.interview", "build.implement"


class Probe:
    """The handlers: BUILD steps sleep; an interactive step signals its start."""

    def __init__(self, build_seconds: float) -> None:
        self.build_seconds = build_seconds
        self.running_builds = 0
        self.builds_done = 0
        self._started: dict[str, float] = {}
        self._cond = threading.Condition()

    def handlers(self) -> Handlers:
        def build(job: Job) -> Success:
            with self._cond:
                self.running_builds += 1
            time.sleep(self.build_seconds)
            with self._cond:
                self.running_builds -= 1
                self.builds_done += 1
            return Success()

        def interactive(job: Job) -> Success:
            with self._cond:
                self._started[job.subject] = time.monotonic()
                self._cond.notify_all()
            return Success()

        return {BUILD: build, INTERACTIVE: interactive}

    def wait_started(self, subject: str, timeout: float) -> float:
        with self._cond:
            if not self._cond.wait_for(lambda: subject in self._started, timeout):
                raise TimeoutError(f"interactive step {subject} did not start in {timeout}s")
            return self._started[subject]


@contextmanager
def running(config: WorkerConfig, probe: Probe) -> Iterator[Runtime]:
    runtime = Runtime(config, handlers=probe.handlers(), owner=f"bench-{uuid.uuid4().hex[:6]}")
    runtime.start()
    try:
        yield runtime
    finally:
        runtime.stop(timeout=60)


def measure(runtime: Runtime, probe: Probe, tag: str, samples: int, timeout: float) -> list[float]:
    latencies: list[float] = []
    for n in range(samples):
        subject = f"{tag}-{n}"
        before = time.monotonic()
        runtime.jobs.enqueue(EnqueueRequest(project_id=PROJECT, kind=INTERACTIVE, subject=subject))
        latencies.append(probe.wait_started(subject, timeout) - before)
        time.sleep(0.05)
    return latencies


def top_up(runtime: Runtime, probe: Probe, tag: str, backlog: int, enqueued: int) -> int:
    """Enqueue BUILD steps until ``backlog`` are waiting; the count enqueued so far."""
    missing = backlog - (enqueued - probe.builds_done - probe.running_builds)
    requests = [
        EnqueueRequest(project_id=PROJECT, kind=BUILD, subject=f"{tag}-b{enqueued + i}")
        for i in range(max(missing, 0))
    ]
    if requests:
        runtime.jobs.enqueue_batch(requests)
    return enqueued + len(requests)


def saturated(
    runtime: Runtime, probe: Probe, args: argparse.Namespace, tag: str, busy: int
) -> list[float]:
    enqueued = top_up(runtime, probe, tag, args.backlog, 0)
    deadline = time.monotonic() + 60
    while probe.running_builds < busy:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the BUILD lane never ran {busy} steps at once")
        time.sleep(0.05)
    latencies: list[float] = []
    jitter = random.Random(7)  # the same sample times in every run
    for n in range(args.samples):
        enqueued = top_up(runtime, probe, tag, args.backlog, enqueued)
        time.sleep(jitter.uniform(0, args.build_seconds))  # at any point of a BUILD step
        latencies += measure(runtime, probe, f"{tag}{n}", 1, timeout=args.build_seconds * 10)
    return latencies


def line(label: str, latencies: Sequence[float]) -> str:
    ms = [x * 1000 for x in latencies]
    return (
        f"  {label:<56} p50 {percentile(ms, 50):8.1f} ms   p90 {percentile(ms, 90):8.1f} ms"
        f"   ({len(ms)} samples)"
    )


def run(args: argparse.Namespace, admin: str, amqp: str) -> int:
    token = uuid.uuid4().hex[:8]
    with ExitStack() as stack:
        url = stack.enter_context(scratch_database(admin, f"vibey_bench_prio_{token}"))
        migrate(url)
        config = WorkerConfig(
            database=DatabaseSettings(url=url),
            bus=BusSettings(amqp_url=amqp, prefix=f"vibeyprio{token}"),
            queue=QueueSettings(rabbitmq=RabbitMqSettings(reconcile_interval_seconds=1)),
            worker=WorkerSettings(threads=args.threads),
        )
        stack.enter_context(declared_topology(config))
        probe = Probe(args.build_seconds)
        print(
            f"interactive step start latency, {args.threads} threads serving both lanes, "
            f"BUILD steps of {args.build_seconds:g} s, backlog {args.backlog}:"
        )
        with running(config, probe) as runtime:
            measure(runtime, probe, "warm", 3, timeout=30)
            idle = measure(runtime, probe, "idle", args.samples, timeout=30)
            print(line("idle (nothing else running)", idle), flush=True)
            kept = saturated(runtime, probe, args, "kept", args.threads - 1)
            print(line("BUILD lane saturated (one thread kept for interactive)", kept))
        every = {
            q: config.queue.rabbitmq.prefetch or config.worker.threads for q in config.queues()
        }
        uncapped = WorkerConfig.prefetch_by_queue
        WorkerConfig.prefetch_by_queue = lambda _self: every  # type: ignore[method-assign]
        try:
            with running(config, probe) as runtime:
                before = saturated(runtime, probe, args, "all", args.threads)
        finally:
            WorkerConfig.prefetch_by_queue = uncapped  # type: ignore[method-assign]
        print(line("BUILD lane saturated, every thread open to BUILD", before))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--backlog", type=int, default=40)
    parser.add_argument("--build-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.threads < 2:
        parser.error("--threads must be at least 2 (one is kept for the interactive lane)")
    admin, amqp = os.environ.get("VIBEY_TEST_PG_URL"), os.environ.get("VIBEY_TEST_AMQP_URL")
    if not admin or not amqp:
        print(
            "export VIBEY_TEST_PG_URL=postgresql://postgres@127.0.0.1:5432/postgres and "
            "VIBEY_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ (or run `just up`)",
            file=sys.stderr,
        )
        return 2

    def terminate(signum: int, _frame: Any) -> None:
        print(f"bench: stopping on signal {signum}, removing what it created", file=sys.stderr)
        raise SystemExit(128 + signum)  # unwinds the ExitStack: everything is cleaned up

    signal.signal(signal.SIGTERM, terminate)
    return run(args, admin, amqp)


if __name__ == "__main__":
    sys.exit(main())
