"""Benchmark: the gate inbox and the CLI at 10,000 and 100,000 parked workflows.

For each size, on a scratch database and a topology under a unique prefix, with one in-process
Runtime (the real step actor, relay, PostgreSQL and RabbitMQ) running the ``parked`` definition
(``ops/bench/parked.py``: it opens a gate at its start and runs nothing until it is answered):

1. parking them: ``--real`` workflows started through ``WorkflowStore.start`` (4 threads; the
   rate), the rest bulk-created in SQL as copies of the first one's rows (workflow, history,
   gate), in one statement each;
2. what they cost while parked: leases, jobs, unsent outbox rows, messages in every work and
   wait-tier queue (all must be 0);
3. ``vibey gate list`` (its first page): the page query and the count query alone (in-process,
   median of 20), and the command's wall time end to end (a subprocess, start-up included,
   median of ``--cli-runs``);
4. answering one gate among them → its next step started: ``--answers`` gates, one at a time
   (p50).

Then the CLI's start-up: ``vibey --version`` and ``vibey --help`` (median of ``--cli-runs``),
beside ``python -c pass`` and ``python -c "import psycopg"`` timed the same way (how busy the
box is, and the floor of any command that reads the database).

VIBEY_TEST_PG_URL is an admin URL (scratch databases are created and dropped);
VIBEY_TEST_AMQP_URL the broker (queues and exchanges under a unique prefix, deleted after).

    .venv/bin/python ops/bench/inbox.py [--sizes 10000,100000] [--real 1000] [--answers 20]
        [--cli-runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import pika  # noqa: E402
from parked import STEP_KIND  # noqa: E402
from protocol import StepClock, ms  # noqa: E402
from steps import declared_topology, scratch_database  # noqa: E402

from actors.capabilities import detect  # noqa: E402
from actors.config import (  # noqa: E402
    BusSettings,
    DatabaseSettings,
    EngineSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
    WorkflowSettings,
)
from actors.worker import Runtime, WorkerConfig  # noqa: E402
from store.listings import (  # noqa: E402
    COUNT_CAP,
    GateFilter,
    Listings,
    PageSpec,
    directed,
    gate_params,
)
from store.migrate import migrate  # noqa: E402
from store.sql import load  # noqa: E402
from workflows.steps import Success  # noqa: E402

VIBEY = str(REPO / ".venv" / "bin" / "vibey")
Q = load("listings.sql")

CLONE_WORKFLOWS = """
WITH clones AS (
    INSERT INTO workflow (id, project_id, definition, version, phase, cycle, status, input,
                          state, last_seq, applied_seq, created_at, updated_at)
    SELECT gen_random_uuid(), 'bulk' || i, w.definition, w.version, w.phase, w.cycle, w.status,
           w.input, w.state, w.last_seq, w.applied_seq, now(), now() - i * interval '10 ms'
    FROM workflow w, generate_series(1, %(n)s) AS i WHERE w.id = %(template)s
    RETURNING id
)
INSERT INTO workflow_history (workflow_id, seq, event, commands, recorded_at)
SELECT c.id, h.seq, h.event, h.commands, h.recorded_at
FROM clones c, workflow_history h WHERE h.workflow_id = %(template)s
"""
CLONE_GATES = """
INSERT INTO gate (id, project_id, workflow_id, name, kind, prompt, answers, schema, context,
                  evidence, opened_at)
SELECT gen_random_uuid(), w.project_id, w.id, g.name, g.kind, g.prompt, g.answers, g.schema,
       g.context, g.evidence, w.updated_at
FROM workflow w, gate g WHERE w.project_id LIKE 'bulk%%' AND g.workflow_id = %(template)s
"""
QUIET = """
SELECT (SELECT count(*) FROM job WHERE state = 'leased') AS leases,
       (SELECT count(*) FROM job) AS jobs,
       (SELECT count(*) FROM job_outbox WHERE sent_at IS NULL) AS unsent,
       (SELECT count(*) FROM gate WHERE answered_at IS NULL) AS open_gates,
       (SELECT count(*) FROM workflow WHERE status IN ('running', 'blocked')) AS live
"""


def median_ms(values: Sequence[float]) -> str:
    return (
        f"{statistics.median(values) * 1000:.1f} ms (min {min(values) * 1000:.1f}, n={len(values)})"
    )


def timed(run: Callable[[], Any], times: int) -> list[float]:
    spent = []
    for _ in range(times):
        t0 = time.perf_counter()
        run()
        spent.append(time.perf_counter() - t0)
    return spent


def cli_wall(args: Sequence[str], env: dict[str, str], runs: int) -> list[float]:
    def once() -> None:
        done = subprocess.run([VIBEY, *args], env=env, capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"vibey {' '.join(args)}: {done.stderr.decode()[:300]}")

    once()  # warm the page cache once
    return timed(once, runs)


def cli_env(pg_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
    if pg_url is not None:
        env["VIBEY_PG_URL"] = pg_url
    return env


def park(runtime: Runtime, n: int, real: int) -> tuple[float, float]:
    """``real`` starts through the store, then the rest copied in SQL; the two wall times."""
    store = runtime.workflows
    real = min(real, n)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as threads:
        started = list(
            threads.map(
                lambda i: store.start(f"real{i}", definition="parked", input={}), range(real)
            )
        )
    real_s = time.perf_counter() - t0
    template = started[0].workflow.id
    t0 = time.perf_counter()
    with runtime.pool.connection() as conn, conn.transaction():
        conn.execute(CLONE_WORKFLOWS, {"n": n - real, "template": template})
        conn.execute(CLONE_GATES, {"template": template})
    bulk_s = time.perf_counter() - t0
    with runtime.pool.connection() as conn:
        conn.execute("VACUUM ANALYZE workflow")
        conn.execute("VACUUM ANALYZE gate")
        conn.execute("VACUUM ANALYZE workflow_history")
    return real_s, bulk_s


def queue_messages(config: WorkerConfig) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(config.amqp_url))
    try:
        caps = detect(connection)
        channel = connection.channel()
        return sum(
            channel.queue_declare(spec.name, passive=True).method.message_count
            for spec in config.topology().queues(caps)
        )
    finally:
        connection.close()


def sql_times(runtime: Runtime) -> tuple[list[float], list[float]]:
    """The first page's query and the count query, each alone, 20 times."""
    params = {**gate_params(GateFilter()), "after_at": None, "after_id": None, "limit": 51}
    params["cap"] = COUNT_CAP + 1
    params["cap"] = COUNT_CAP + 1
    page = directed(Q["gate_page"], newest_first=False).encode()
    count = Q["gate_count"].encode()
    with runtime.pool.connection() as conn:
        pages = timed(lambda: conn.execute(page, params).fetchall(), 20)
        counts = timed(lambda: conn.execute(count, params).fetchall(), 20)
    return pages, counts


def answer_some(runtime: Runtime, clock: StepClock, answers: int) -> list[float]:
    lists = Listings(runtime.pool)
    chosen = lists.gates(GateFilter(), PageSpec(limit=answers, newest_first=True)).items
    spent = []
    for gate, _ in chosen:
        workflow_id = str(gate.workflow_id)
        t0 = time.perf_counter()
        runtime.workflows.answer(gate.id, "yes", by="bench")
        spent.append(clock.wait_for(workflow_id, 1) - t0)
    return spent


def one_size(args: argparse.Namespace, admin: str, amqp: str, n: int) -> None:
    tag = uuid.uuid4().hex[:8]
    with (
        scratch_database(admin, f"vibey_bench_inbox_{tag}") as pg_url,
        tempfile.TemporaryDirectory() as work,
    ):
        migrate(pg_url)
        config = WorkerConfig(
            database=DatabaseSettings(url=pg_url),
            bus=BusSettings(amqp_url=amqp, prefix=f"bin{tag}"),
            queue=QueueSettings(rabbitmq=RabbitMqSettings(reconcile_interval_seconds=1)),
            worker=WorkerSettings(threads=4),
            workflow=WorkflowSettings(definitions="parked:DEFINITIONS"),
            engine=EngineSettings(workspace=work),
        )
        clock = StepClock()
        with declared_topology(config):
            handlers = clock.wrap({STEP_KIND: lambda job: Success()})
            runtime = Runtime(config, handlers=handlers, owner="bench")
            runtime.start()
            try:
                report(args, runtime, clock, config, pg_url, n)
            finally:
                runtime.stop(timeout=30)


def report(
    args: argparse.Namespace,
    runtime: Runtime,
    clock: StepClock,
    config: WorkerConfig,
    pg_url: str,
    n: int,
) -> None:
    real_s, bulk_s = park(runtime, n, args.real)
    real = min(args.real, n)
    print(f"{n:,} parked workflows")
    print(
        f"  parked: {real:,} through WorkflowStore.start in {real_s:.1f} s "
        f"({real / real_s:.0f}/s, 4 threads), {n - real:,} bulk-copied in SQL in {bulk_s:.1f} s"
    )
    time.sleep(2)  # a reconcile pass or two: nothing may wake up
    with runtime.pool.connection() as conn:
        quiet = conn.execute(QUIET).fetchone()
    assert quiet is not None
    leases, jobs, unsent, open_gates, live = quiet
    messages = queue_messages(config)
    print(
        f"  while parked: {leases} leases, {jobs} jobs, {unsent} unsent outbox rows, "
        f"{messages} messages in the work and tier queues ({open_gates:,} open gates, "
        f"{live:,} live workflows)"
    )
    pages, counts = sql_times(runtime)
    print(f"  gate list first page, SQL: page query {median_ms(pages)}, count {median_ms(counts)}")
    wall = cli_wall(["gate", "list"], cli_env(pg_url), args.cli_runs)
    print(f"  `vibey gate list` (first page), wall incl. start-up: {median_ms(wall)}")
    answered = answer_some(runtime, clock, args.answers)
    print(f"  one gate among {n:,} answered → its next step started: {ms(answered)}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--real", type=int, default=1000)
    parser.add_argument("--answers", type=int, default=20)
    parser.add_argument("--cli-runs", type=int, default=10)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    admin, amqp = os.environ.get("VIBEY_TEST_PG_URL"), os.environ.get("VIBEY_TEST_AMQP_URL")
    if not admin or not amqp:
        print("set VIBEY_TEST_PG_URL and VIBEY_TEST_AMQP_URL (see README)", file=sys.stderr)
        return 2
    for n in (int(size) for size in args.sizes.split(",")):
        one_size(args, admin, amqp, n)
    print("CLI start-up (a subprocess each, no database):")
    for command in (["--version"], ["--help"]):
        spent = cli_wall(command, cli_env(), args.cli_runs)
        print(f"  `vibey {' '.join(command)}`: {median_ms(spent)}")
    python = str(REPO / ".venv" / "bin" / "python")
    for label, code in (
        ("python -c pass", "pass"),
        ('python -c "import psycopg"', "import psycopg"),
    ):
        spent = timed(lambda c=code: subprocess.run([python, "-c", c], check=True), args.cli_runs)
        print(f"  for scale, on this box now: `{label}`: {median_ms(spent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
