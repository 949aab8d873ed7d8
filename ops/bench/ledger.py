"""Benchmark: ledger appends per second with 1, 4 and 8 concurrent appenders.

Each appender is a process of its own with one connection, committing ``--batch`` events a
transaction (``Ledger.append``: one statement that moves the project's head and inserts the
events) for ``--seconds``. Two layouts:

* one project: every appender writes the same project, so they serialise on its head row
  (the worst case: one project's steps settling at once);
* a project each: no shared head row (many projects at once).

The figure is committed events per second over the run, all appenders together. Payloads
are about 150 bytes of JSON, like a question or a decision.

VIBEY_TEST_PG_URL is an admin URL: a scratch database is created, migrated, and dropped.

    .venv/bin/python ops/bench/ledger.py [--seconds 5] [--batch 1] [--appenders 1,4,8]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from psycopg_pool import ConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from steps import scratch_database

from store.ledger import Ledger
from store.migrate import migrate
from workflows.ledger import EventKind, NewEvent


def appender(url: str, project: str, batch: int, start: float, stop: float, out: mp.Queue) -> None:
    with ConnectionPool(url, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        ledger = Ledger(pool)
        job = uuid.uuid4()
        while time.time() < start:
            time.sleep(0.001)
        appended = 0
        while time.time() < stop:
            events = [
                NewEvent(
                    EventKind.DecisionRecorded,
                    {
                        "id": f"d-{os.getpid()}-{appended + i}",
                        "text": "Use PostgreSQL for the ledger: one statement per append.",
                        "by": "bench",
                    },
                )
                for i in range(batch)
            ]
            ledger.append(project, events, causation_id=str(job), job_id=job)
            appended += batch
    out.put(appended)


def run(url: str, appenders: int, *, shared: bool, batch: int, seconds: float) -> float:
    tag = uuid.uuid4().hex[:6]
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    start = time.time() + 1.5  # time for every process to start and connect
    stop = start + seconds
    procs = [
        ctx.Process(
            target=appender,
            args=(url, f"bench-{tag}" if shared else f"bench-{tag}-{i}", batch, start, stop, out),
        )
        for i in range(appenders)
    ]
    for proc in procs:
        proc.start()
    total = sum(out.get(timeout=seconds + 60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    return total / seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=1, help="events per transaction")
    parser.add_argument("--appenders", default="1,4,8")
    args = parser.parse_args(argv)
    admin = os.environ.get("VIBEY_TEST_PG_URL")
    if not admin:
        print("set VIBEY_TEST_PG_URL to an admin URL (a scratch database is made)", file=sys.stderr)
        return 2
    counts = [int(n) for n in args.appenders.split(",")]
    with scratch_database(admin, f"vibey_bench_ledger_{uuid.uuid4().hex[:8]}") as url:
        migrate(url)
        print(
            f"ledger appends/s ({args.batch} event{'s' if args.batch > 1 else ''} a transaction, "
            f"{args.seconds:g}s each, committed events over all appenders)"
        )
        print(f"{'appenders':>9}  {'one project':>12}  {'a project each':>14}")
        for n in counts:
            one = run(url, n, shared=True, batch=args.batch, seconds=args.seconds)
            each = run(url, n, shared=False, batch=args.batch, seconds=args.seconds)
            print(f"{n:>9}  {one:>12,.0f}  {each:>14,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
