"""Benchmark: three-step workflows through the client, on a supervised fleet.

Prints, from one run (``--processes`` × ``--threads``, default 2 × 8; the workflow is
``ops/bench/bench_workflow.py``: three no-op short steps, each its own kind):

1. one workflow at a time, nothing else running: ``--samples`` workflows, each started
   through ``vibey.Client.start`` and waited for (the client polls every millisecond); the
   latency start → completed, p50/p90, as the client saw it and as the database stamped it
   (``finished_at − created_at``: the start's transaction to the last step's).
2. ``--workflows`` workflows (default 2,000) started one by one through the same client,
   as fast as it can; completed workflows/s over first start → last completed, and the
   PostgreSQL WAL flushes and commits per workflow step.

3. with ``--dbos-python PY`` (a Python with ``dbos`` installed, a bench-only dependency; or
   ``VIBEY_BENCH_DBOS_PYTHON``): the same workload through DBOS Transact
   (``dbos_three_steps.py``) on a scratch database of its own, right after, and the same-run
   ratios.

VIBEY_TEST_PG_URL is an admin URL (a scratch database is created and dropped);
VIBEY_TEST_AMQP_URL the broker (every queue and exchange under a unique prefix, deleted
afterwards).

    .venv/bin/python ops/bench/three_steps.py [--processes 2] [--threads 8] [--workflows 2000]
        [--samples 50] [--dbos-python PY] [--rounds 1]
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_workflow  # noqa: E402
import psycopg  # noqa: E402
from statements import Tally, counting  # noqa: E402
from steps import (  # noqa: E402
    cpu_sample,
    cpu_spent,
    declared_topology,
    per_unit,
    pg_counters,
    print_top,
    profile_new_threads,
    running_fleet,
    scratch_database,
    wait_for_consumers,
)

from actors.config import (  # noqa: E402
    BusSettings,
    DatabaseSettings,
    EngineSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
    WorkflowSettings,
)
from actors.in_place import DEFAULT_STEPS  # noqa: E402
from actors.worker import Runtime, WorkerConfig  # noqa: E402
from store.migrate import migrate  # noqa: E402
from vibey.client import Client  # noqa: E402
from vibey.settings import load_settings  # noqa: E402
from workflows.engine import Registry, Status  # noqa: E402

STEPS = len(bench_workflow.STEPS)
TOP_STATEMENTS = 16


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: Sequence[float]) -> str:
    return (
        f"p50 {statistics.median(values) * 1000:.1f} ms, p90 {percentile(values, 0.9) * 1000:.1f}"
        f" ms, max {max(values) * 1000:.1f} ms (n={len(values)})"
    )


def wait_completed(client: Client, workflow: uuid.UUID, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        current = client.status(workflow)
        if current.status is Status.COMPLETED:
            return
        if current.status.finished or time.monotonic() > deadline:
            raise RuntimeError(f"workflow {workflow}: {current.status.value} ({current.reason})")
        time.sleep(0.001)


def step_gaps(pg_url: str, prefix: str) -> list[float]:
    """Step → next step of each workflow whose project starts with ``prefix``: the seconds
    between two consecutive steps' settling transactions (``settled_at`` is ``now()``, its
    transaction's start: the claim, handler and settle of a short step are one transaction)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM settled_at - lag(settled_at) OVER ("
            "  PARTITION BY workflow_id ORDER BY settled_at)) "
            "FROM job WHERE project_id LIKE %s AND state = 'succeeded'",
            (f"{prefix}%",),
        ).fetchall()
    return [float(r[0]) for r in rows if r[0] is not None]


# One workflow's time, start call → seen completed, cut where the database stamps it: the
# client's start call; its transaction → the first step's (the commit, the client's relay,
# the broker, the consumer); each step's transaction → the next one's; the last step's → the
# client's poll seeing it (the step, its commit, the poll).
SEGMENTS = ("the client's start call", "start → step 1")


def one_at_a_time(
    client: Client, samples: int
) -> tuple[list[float], list[float], list[tuple[uuid.UUID, float, float, float]]]:
    """(client latencies, database-stamped latencies, (workflow, call, returned, seen) in
    ``time.time()``, the clock PostgreSQL's ``now()`` shares on this machine)."""
    seen, stamped, calls = [], [], []
    for n in range(samples):
        began, wall = time.perf_counter(), time.time()
        workflow = client.start(f"one{n:04d}", bench_workflow.NAME)
        returned = time.time()
        wait_completed(client, workflow.id)
        seen.append(time.perf_counter() - began)
        calls.append((workflow.id, wall, returned, time.time()))
        done = client.status(workflow.id)
        assert done.finished_at is not None
        stamped.append((done.finished_at - done.created_at).total_seconds())
    return seen, stamped, calls


def segments(
    pg_url: str, calls: Sequence[tuple[uuid.UUID, float, float, float]]
) -> dict[str, list[float]]:
    """Where each of :func:`one_at_a_time`'s workflows spent its time (seconds by segment)."""
    cut: dict[str, list[float]] = {}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for workflow_id, call, returned, seen in calls:
            row = conn.execute(
                "SELECT extract(epoch FROM w.created_at), array_agg(extract(epoch FROM "
                "j.settled_at) ORDER BY j.settled_at) FROM workflow w JOIN job j "
                "ON j.workflow_id = w.id WHERE w.id = %s GROUP BY w.created_at",
                (workflow_id,),
            ).fetchone()
            assert row is not None
            marks = [float(row[0]), *(float(s) for s in row[1])]
            cut.setdefault(SEGMENTS[0], []).append(returned - call)
            for n, (a, b) in enumerate(itertools.pairwise(marks)):
                name = SEGMENTS[1] if n == 0 else f"step {n} → step {n + 1}"
                cut.setdefault(name, []).append(b - a)
            cut.setdefault(f"step {len(marks) - 1} → seen", []).append(seen - marks[-1])
    return cut


def many(
    client: Client, pg_url: str, count: int, batch: int = 0, prefix: str = ""
) -> tuple[float, float]:
    """(seconds to start them all, seconds first start → last completed): one by one, or
    with ``batch``, through ``Client.start_many`` that many at a time (one commit each)."""
    prefix = prefix or (f"batch{batch}-" if batch else "many")
    began = time.perf_counter()
    if batch:
        for first in range(0, count, batch):
            names = [f"{prefix}{n:05d}" for n in range(first, min(first + batch, count))]
            client.start_many(names, bench_workflow.NAME)
    else:
        for n in range(count):
            client.start(f"{prefix}{n:05d}", bench_workflow.NAME)
    started = time.perf_counter() - began
    deadline = time.monotonic() + 120 + count / 10
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'), count(*), "
                "extract(epoch FROM max(finished_at) - min(created_at)) "
                "FROM workflow WHERE project_id LIKE %s",
                (f"{prefix}%",),
            ).fetchone()
            assert row is not None
            if row[0] == count:
                return started, float(row[2])
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {row[0]} of {count} workflows completed")
            time.sleep(0.05)


def profiled(
    args: argparse.Namespace, config: WorkerConfig, settings: Any, registry: Registry, url: str
) -> tuple[pstats.Stats, Tally]:
    """``--profile`` workflows through one in-process Runtime whose every thread runs under a
    CPU-time profiler (the client's starts are not in it), and the statements and round trips
    its threads sent (``statements.counting``)."""
    profilers: list[cProfile.Profile] = []
    threading.setprofile(profile_new_threads(profilers))
    try:
        with counting() as tally:
            runtime = Runtime(config, owner="bench-profile")
            try:
                runtime.start()
                with Client(settings, registry=registry, name="bench-profile") as client:
                    batch = min(args.batch, args.profile)
                    many(client, url, args.profile, batch=batch, prefix="prof")
            finally:
                runtime.stop(timeout=30)
    finally:
        threading.setprofile(None)
    return pstats.Stats(*profilers), tally


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument(
        "--in-place-steps",
        type=int,
        default=DEFAULT_STEPS,
        help="steps a worker chains in place after a settle (0: every step via the broker)",
    )
    parser.add_argument(
        "--batch", type=int, default=500, help="Client.start_many's batch in the last figure"
    )
    parser.add_argument("--dbos-python", default=os.environ.get("VIBEY_BENCH_DBOS_PYTHON"))
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="vibey and DBOS take turns this many times; the ratios' medians are printed",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="then N workflows (start_many) in one in-process worker under cProfile (0: none)",
    )
    return parser.parse_args(argv)


def dbos_run(args: argparse.Namespace, admin: str) -> dict[str, Any] | None:
    """DBOS's figures for the same workload, or None (said why) when it cannot run."""
    if not args.dbos_python:
        print("dbos: not run (pass --dbos-python PY, a Python with dbos installed)")
        return None
    with scratch_database(admin, f"vibey_bench_dbos_{uuid.uuid4().hex[:8]}") as url:
        command = [args.dbos_python, str(HERE / "dbos_three_steps.py"), url]
        command += ["--workflows", str(args.workflows), "--samples", str(args.samples)]
        command += ["--concurrency", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        print(f"dbos: failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
        return None
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def bench_parts(
    pg_url: str, amqp: str, prefix: str, threads: int, in_place_steps: int, work: str
) -> tuple[WorkerConfig, Any, Registry]:
    """A fleet's config for ``bench_workflow`` (its handlers and definition, ``ops/bench`` on
    the workers' PYTHONPATH), the client's settings for the same services, its registry."""
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp, prefix=prefix),
        queue=QueueSettings(
            rabbitmq=RabbitMqSettings(reconcile_interval_seconds=1, in_place_steps=in_place_steps)
        ),
        worker=WorkerSettings(threads=threads, handlers="bench_workflow:HANDLERS"),
        workflow=WorkflowSettings(definitions="bench_workflow:DEFINITIONS"),
        engine=EngineSettings(workspace=work),
    )
    paths = [str(HERE), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env = {"VIBEY_PG_URL": pg_url, "VIBEY_AMQP_URL": amqp, "VIBEY_BUS_PREFIX": prefix}
    settings = load_settings(env, Path(work))
    return config, settings, Registry(bench_workflow.DEFINITIONS)


def run(args: argparse.Namespace, admin: str, amqp: str) -> dict[str, Any]:
    token = uuid.uuid4().hex[:8]
    database = f"vibey_bench_wf3_{token}"
    with scratch_database(admin, database) as pg_url, tempfile.TemporaryDirectory() as work:
        migrate(pg_url)
        config, settings, registry = bench_parts(
            pg_url, amqp, f"bwf3{token}", args.threads, args.in_place_steps, work
        )
        with declared_topology(config):
            with running_fleet(config, args.processes, Path(work) / "f.log") as fleet:
                wait_for_consumers(amqp, config.queues(), args.processes, timeout=60)
                with Client(settings, registry=registry, name="bench") as client:
                    seen, stamped, calls = one_at_a_time(client, args.samples)
                    gaps, cut = step_gaps(pg_url, "one"), segments(pg_url, calls)
                    before = pg_counters(admin)
                    cpu_before = cpu_sample(fleet.pids)
                    started, window = many(client, pg_url, args.workflows)
                    cpu = cpu_spent(cpu_before, cpu_sample(fleet.pids))
                    time.sleep(0.5)
                    pg = pg_counters(admin).since(before, database)
                    batched = many(client, pg_url, args.workflows, batch=args.batch)
            profile = profiled(args, config, settings, registry, pg_url) if args.profile else None
    return {
        "profile": profile,
        "seen": seen,
        "stamped": stamped,
        "gaps": gaps,
        "segments": cut,
        "cpu": cpu,
        "started": started,
        "window": window,
        "pg": pg,
        "batched": batched,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    admin, amqp = os.environ.get("VIBEY_TEST_PG_URL"), os.environ.get("VIBEY_TEST_AMQP_URL")
    if not admin or not amqp:
        print("set VIBEY_TEST_PG_URL and VIBEY_TEST_AMQP_URL (see README)", file=sys.stderr)
        return 2
    rounds: list[Ratios] = []
    turns = max(args.rounds, 1)
    unprofiled = argparse.Namespace(**{**vars(args), "profile": 0})
    for turn in range(turns):
        # The profile, when asked for, once: in the last round, whose figures are printed.
        found = run(args if turn == turns - 1 else unprofiled, admin, amqp)
        dbos = dbos_run(args, admin)
        if dbos is not None:
            rounds.append(ratios(args.workflows, found, dbos))
            if args.rounds > 1:
                print(f"round {turn + 1}: {rounds[-1]}")
    n, pg = args.workflows, found["pg"]
    print(
        f"one {STEPS}-step workflow at a time, start → completed ({args.processes} processes × "
        f"{args.threads} threads, nothing else running): client {ms(found['seen'])}; "
        f"database stamps {ms(found['stamped'])}"
    )
    print(
        "  where its time goes, p50 of each segment (the database's stamps: a transaction's "
        "now()): "
        + "; ".join(
            f"{name} {statistics.median(v) * 1000:.1f} ms" for name, v in found["segments"].items()
        )
    )
    print(
        f"{n:,} {STEPS}-step workflows started one by one through the client "
        f"({found['started']:.2f} s to start them = {n / found['started']:,.0f}/s): "
        f"{n / found['window']:,.0f} completed workflows/s ({n * STEPS / found['window']:,.0f} "
        f"steps/s; first start → last completed {found['window']:.2f} s)"
    )
    b_started, b_window = found["batched"]
    print(
        f"{n:,} started through Client.start_many, {args.batch} a transaction "
        f"({b_started:.2f} s to start them = {n / b_started:,.0f}/s): "
        f"{n / b_window:,.0f} completed workflows/s ({n * STEPS / b_window:,.0f} steps/s)"
    )
    steps, steps_p = n * STEPS, args.profile * STEPS
    print(
        f"  cpu per workflow step (one by one, first start → last completed; bench = the "
        f"client's starts and polls): {per_unit(found['cpu'], steps)}; load average "
        f"{', '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    mode = f"in place, chains of {args.in_place_steps}" if args.in_place_steps else "via the broker"
    print(
        f"step → next step ({mode}; one workflow at a time, settle transaction to settle "
        f"transaction): {ms(found['gaps'])}"
    )
    print(
        f"  postgres per workflow step (one by one): {pg.wal_sync / steps:.2f} WAL flushes, "
        f"{pg.commits / steps:.2f} commits (the starts' and the bench's polls included; WAL is "
        f"cluster-wide: other databases committed {pg.elsewhere:,} transactions meanwhile)"
    )
    if found["profile"] is not None:
        stats, tally = found["profile"]
        print_top(f"profile: {args.profile:,} workflows in one in-process worker", stats, steps_p)
        print(
            f"  statements per workflow step (the worker's threads, profile run): "
            f"{tally.statements / steps_p:.2f}, round trips {tally.round_trips / steps_p:.2f}; "
            f"the most sent (per step):"
        )
        for line in tally.top(TOP_STATEMENTS, steps_p):
            print(f"    {line}")
    if dbos is not None:
        print(
            f"dbos transact, same workload right after: one workflow p50 "
            f"{dbos['p50'] * 1000:.1f} ms, p90 {dbos['p90'] * 1000:.1f} ms (called directly); "
            f"{dbos['throughput']:,.0f} completed workflows/s through its queue "
            f"(worker_concurrency {dbos['concurrency']}, polled every {dbos['poll']} s)"
        )
        print(f"ratio vibey/dbos: {rounds[-1]}")  # the last round's
    if len(rounds) > 1:
        print(f"ratio vibey/dbos, median of {len(rounds)} alternating rounds: {median(rounds)}")
    return 0


@dataclass(frozen=True)
class Ratios:
    """One round's vibey/DBOS ratios: throughput started one by one and through start_many,
    and one workflow's p50 (vibey's client p50 over DBOS's)."""

    one_by_one: float
    start_many: float
    p50: float

    def __str__(self) -> str:
        return (
            f"throughput {self.one_by_one:.2f}x (started one by one), {self.start_many:.2f}x "
            f"(start_many); one workflow (client p50) {self.p50:.2f}x the time"
        )


def ratios(n: int, found: dict[str, Any], dbos: dict[str, Any]) -> Ratios:
    return Ratios(
        one_by_one=n / found["window"] / dbos["throughput"],
        start_many=n / found["batched"][1] / dbos["throughput"],
        p50=statistics.median(found["seen"]) / dbos["p50"],
    )


def median(rounds: Sequence[Ratios]) -> Ratios:
    return Ratios(
        one_by_one=statistics.median(r.one_by_one for r in rounds),
        start_many=statistics.median(r.start_many for r in rounds),
        p50=statistics.median(r.p50 for r in rounds),
    )


if __name__ == "__main__":
    raise SystemExit(main())
