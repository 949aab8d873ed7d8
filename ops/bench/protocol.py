"""Benchmark: the workflow engine's latencies and the demo protocol's durable steps/s.

Prints, from one in-process Runtime (``--threads`` Dramatiq threads, the real step actor,
relay, PostgreSQL and RabbitMQ; handlers are the protocol's, on the scripted engine):

1. workflow start → first step started: ``WorkflowStore.start`` commits (workflow row,
   history, first job, outbox row) and hands the pointer to the relay; the figure runs until
   the first handler starts. ``--samples`` workflows, one at a time.
2. gate answer → next step started: each of those workflows waits at its first question
   gate; ``WorkflowStore.answer`` commits (gate, history, decide, next job, outbox) and the
   figure runs until the next step's handler starts. One at a time.
3. the demo protocol with ``--workflows`` workflows at once (default 20): the demo script,
   every gate answered as soon as it opens (an in-process answerer polling the inbox every
   20 ms, the answer in the same transaction as the next dispatch); durable steps/s over the
   run (first start → last workflow completed) and the number of gates answered.

VIBEY_TEST_PG_URL is an admin URL (a scratch database is created and dropped); VIBEY_TEST_AMQP_URL
the broker (every queue and exchange under a unique prefix, deleted afterwards).

    .venv/bin/python ops/bench/protocol.py [--threads 8] [--samples 40] [--workflows 20]
        [--no-ledger]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from steps import declared_topology, scratch_database  # noqa: E402

from actors.config import (  # noqa: E402
    BusSettings,
    DatabaseSettings,
    EngineSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.handlers import HandlerContext, build_handlers  # noqa: E402
from actors.worker import Runtime, WorkerConfig  # noqa: E402
from store.migrate import migrate  # noqa: E402
from workflows.queue import Job  # noqa: E402
from workflows.steps import Handlers, Outcome  # noqa: E402

DEFINITION = "vibey-protocol"
COMMITS: list[float] = []  # gate answer: the transaction alone (commit included)


class StepClock:
    """Handler start times by workflow id, in order."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.starts: dict[str, list[tuple[str, float]]] = {}

    def wrap(self, handlers: Handlers) -> Handlers:
        def timed(handler: Any) -> Any:
            def run(job: Job) -> Outcome:
                now = time.perf_counter()
                with self._lock:
                    key = str(job.workflow_id)
                    self.starts.setdefault(key, []).append((job.step or "", now))
                    self._lock.notify_all()
                return handler(job)

            return run

        return {kind: timed(h) for kind, h in handlers.items()}

    def wait_for(self, workflow_id: str, count: int, timeout: float = 30) -> float:
        """The start time of the workflow's ``count``-th step."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.starts.get(workflow_id, [])) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"workflow {workflow_id}: step {count} did not start")
                self._lock.wait(left)
            return self.starts[workflow_id][count - 1][1]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: Sequence[float]) -> str:
    return (
        f"p50 {statistics.median(values) * 1000:.1f} ms, p90 {percentile(values, 0.9) * 1000:.1f}"
        f" ms, max {max(values) * 1000:.1f} ms (n={len(values)})"
    )


def engine(script: Mapping[str, Any]) -> dict[str, Any]:
    return {"engine": {"name": "scripted", "script": dict(script)}}


def latencies(runtime: Runtime, clock: StepClock, samples: int) -> tuple[list[float], list[float]]:
    store = runtime.workflows
    script = {"design": {"questions": [{"id": "who", "question": "Who is it for?"}]}}
    started: list[float] = []
    ids: list[tuple[str, str]] = []
    for n in range(samples):
        project = f"lat{n:03d}"
        t0 = time.perf_counter()
        workflow = store.start(project, definition=DEFINITION, input=engine(script)).workflow
        started.append(clock.wait_for(str(workflow.id), 1) - t0)
        ids.append((project, str(workflow.id)))
    answered: list[float] = []
    for project, workflow_id in ids:
        gate = wait_for_gate(runtime, project)
        before = len(clock.starts.get(workflow_id, []))
        t0 = time.perf_counter()
        store.answer(gate, "product teams", by="bench")
        COMMITS.append(time.perf_counter() - t0)
        answered.append(clock.wait_for(workflow_id, before + 1) - t0)
    return started, answered


def wait_for_gate(runtime: Runtime, project: str, timeout: float = 30) -> uuid.UUID:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gates = runtime.workflows.inbox(project)
        if gates:
            return gates[0][0].id
        time.sleep(0.005)
    raise TimeoutError(f"{project}: no gate opened")


def answer_for(gate: Any) -> str:
    if gate.name in ("visual.opt_in", "deployment.opt_in"):
        return "no"
    for preferred in ("accept", "retry", "yes"):
        if preferred in gate.answers:
            return preferred
    return gate.answers[0] if gate.answers else "an answer"


def demo_run(runtime: Runtime, workflows: int) -> tuple[float, int, int]:
    store = runtime.workflows
    script = tomllib.loads((REPO / "ops" / "demo" / "demo.toml").read_text())
    projects = [f"demo{n:02d}" for n in range(workflows)]
    t0 = time.perf_counter()
    ids = [
        store.start(p, definition=DEFINITION, input=engine(script)).workflow.id for p in projects
    ]
    answers = 0
    while True:
        for gate, _waited in store.inbox():
            if gate.project_id in projects:
                store.answer(gate.id, answer_for(gate), by="bench")
                answers += 1
        states = [store.get(i).status.value for i in ids]
        if all(s in ("completed", "failed", "cancelled") for s in states):
            break
        if time.perf_counter() - t0 > 600:
            raise TimeoutError(f"demo run did not finish: {states}")
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    with runtime.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM job WHERE state = 'succeeded' AND project_id LIKE 'demo%%'"
        ).fetchone()
    return wall, int(row[0]) if row else 0, answers


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--workflows", type=int, default=20)
    parser.add_argument(
        "--no-ledger", action="store_true", help="run without ledger writes (to price them)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    admin, amqp = os.environ.get("VIBEY_TEST_PG_URL"), os.environ.get("VIBEY_TEST_AMQP_URL")
    if not admin or not amqp:
        print("set VIBEY_TEST_PG_URL and VIBEY_TEST_AMQP_URL (see README)", file=sys.stderr)
        return 2
    tag = uuid.uuid4().hex[:8]
    with (
        scratch_database(admin, f"vibey_bench_wf_{tag}") as pg_url,
        tempfile.TemporaryDirectory() as work,
    ):
        migrate(pg_url)
        config = WorkerConfig(
            database=DatabaseSettings(url=pg_url),
            bus=BusSettings(amqp_url=amqp, prefix=f"bwf{tag}"),
            queue=QueueSettings(rabbitmq=RabbitMqSettings(reconcile_interval_seconds=1)),
            worker=WorkerSettings(threads=args.threads),
            engine=EngineSettings(workspace=work),
        )
        clock = StepClock()
        with declared_topology(config):
            context = HandlerContext(pool=None, workspace=Path(work))
            runtime = Runtime(config, handlers=clock.wrap(build_handlers(context)), owner="bench")
            if args.no_ledger:
                runtime.workflows._ledger = None  # the bench prices the ledger
            runtime.start()
            try:
                started, answered = latencies(runtime, clock, args.samples)
                wall, steps, answers = demo_run(runtime, args.workflows)
            finally:
                runtime.stop(timeout=30)
    print(f"workflow start → first step started: {ms(started)}")
    print(f"gate answer → next step started: {ms(answered)}")
    print(f"  of which the answer's transaction (gate, history, decide, job): {ms(COMMITS)}")
    print(
        f"demo protocol, {args.workflows} workflows at once ({args.threads} threads, one "
        f"process): {steps} durable steps in {wall:.1f} s = {steps / wall:.0f} steps/s, "
        f"{answers} gates answered in-process as they opened"
        + (" (no ledger writes)" if args.no_ledger else " (with ledger writes)")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
