"""Benchmark: claims + acks per second on the PostgreSQL backend with 8 worker processes.

Creates a scratch database through an admin URL (VIBEY_TEST_PG_URL, e.g.
postgresql://postgres@127.0.0.1:5432/postgres), migrates it, enqueues N no-op jobs, then
starts W processes that each loop claim(1) → ack until the queue is empty, and prints the
figure. The scratch database is dropped afterwards.

    .venv/bin/python ops/bench/claim_ack.py [--jobs 20000] [--workers 8] [--batch 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import uuid

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from store.jobs import PostgresJobRepository
from store.migrate import migrate
from workflows.queue import EnqueueRequest

PROJECT = "bench"


def with_database(url: str, name: str) -> str:
    head, _, _ = url.rpartition("/")
    return f"{head}/{name}"


def worker(url: str, batch: int, start: mp.synchronize.Event, done: mp.Queue) -> None:  # type: ignore[name-defined]
    with ConnectionPool(
        url, min_size=1, max_size=1, open=True, kwargs={"autocommit": True}
    ) as pool:
        repo = PostgresJobRepository(pool=pool)
        owner = f"bench-{os.getpid()}"
        settled = 0
        start.wait()
        while jobs := repo.claim(PROJECT, owner=owner, limit=batch):
            for job in jobs:
                settled += repo.ack(job.lease).applied
        done.put(settled)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1, help="jobs per claim")
    args = parser.parse_args()
    admin = os.environ.get("VIBEY_TEST_PG_URL")
    if not admin:
        print(
            "export VIBEY_TEST_PG_URL=postgresql://postgres@127.0.0.1:5432/postgres (an admin "
            "URL; the benchmark creates and drops a scratch database), or run `just up`",
            file=sys.stderr,
        )
        return 2
    name = f"vibey_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(admin, name)
    try:
        migrate(url)
        with ConnectionPool(
            url, min_size=1, max_size=2, open=True, kwargs={"autocommit": True}
        ) as pool:
            repo = PostgresJobRepository(pool=pool)
            for offset in range(0, args.jobs, 1000):
                repo.enqueue_batch(
                    [
                        EnqueueRequest(project_id=PROJECT, kind="design.spec", subject=f"job-{i}")
                        for i in range(offset, min(offset + 1000, args.jobs))
                    ]
                )
        ctx = mp.get_context("spawn")
        start, done = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=worker, args=(url, args.batch, start, done))
            for _ in range(args.workers)
        ]
        for proc in procs:
            proc.start()
        time.sleep(2.0)  # let every worker connect before the clock starts
        began = time.perf_counter()
        start.set()
        settled = sum(done.get(timeout=600) for _ in procs)
        elapsed = time.perf_counter() - began
        for proc in procs:
            proc.join()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    print(
        f"postgres backend: {settled} jobs claimed+acked by {args.workers} worker processes "
        f"(claim batch {args.batch}) in {elapsed:.2f} s = {settled / elapsed:,.0f} claims+acks/s"
    )
    return 0 if settled == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
