"""A chaos-test worker: a real process on the PostgreSQL backend, killed at will by the test.

Protocol on stdio, one line each:
  worker → test  ``CLAIM <job_id> <attempt>`` once the claim committed; then it waits
  test → worker  ``go`` (or SIGKILL, which lands mid-job: after the claim, before the settle)
  worker → test  ``ACK|STALE|NACK <job_id> <attempt>`` after the settle committed

What a job does is decided from (seed, job id, attempt), so a seed reproduces every decision:
most jobs work for 10-60 ms and ack; some fail their first attempt (nack); a few stall past
their lease without heartbeating, so their settle must be refused (the fence at work).

The ack and the ``chaos_commit`` row share one transaction, and ``chaos_commit.job_id`` is a
primary key: a second commit of one job fails loudly (exit code 3).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from datetime import timedelta

import psycopg
from psycopg_pool import ConnectionPool

from store.jobs import PostgresJobRepository
from store.notify import PostgresJobReadyNotifier
from store.unit_of_work import UnitOfWork
from workflows.job import FailureClass, LeasePolicy
from workflows.queue import Job

STALL_RATE = 0.03
FAIL_RATE = 0.05
REAP_EVERY = 0.5


def fraction(*parts: object) -> float:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def work(repo: PostgresJobRepository, job: Job, *, seed: int, lease_s: float) -> str:
    roll = fraction(seed, "work", job.id, job.attempts)
    if roll < STALL_RATE:
        time.sleep(lease_s + 1.0)  # stuck past the lease, no heartbeat
    else:
        time.sleep(0.01 + 0.05 * roll)
    lease = job.lease
    if job.attempts == 1 and fraction(seed, "fail", job.id) < FAIL_RATE:
        settled = repo.nack(
            lease,
            error="chaos: first attempt fails",
            failure_class=FailureClass.WORK,
            retry_in=timedelta(milliseconds=200),
        )
        return "NACK" if settled.applied else "STALE"
    with repo.transaction() as conn:
        settled = repo.ack_txn(UnitOfWork(conn), lease, result={"attempt": job.attempts})
        if settled.applied:
            conn.execute(
                "INSERT INTO chaos_commit (job_id, attempt) VALUES (%s, %s)",
                (job.id, job.attempts),
            )
            return "ACK"
        conn.execute(
            "INSERT INTO chaos_stale (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempts)
        )
        return "STALE"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--lease-ms", type=int, required=True)
    parser.add_argument("--owner", required=True)
    args = parser.parse_args()
    lease_s = args.lease_ms / 1000
    leases = LeasePolicy(default=timedelta(milliseconds=args.lease_ms), by_kind={})
    notifier = PostgresJobReadyNotifier(url=args.url)
    notifier.listen()
    with ConnectionPool(
        args.url, min_size=1, max_size=2, open=True, kwargs={"autocommit": True}
    ) as pool:
        repo = PostgresJobRepository(pool=pool, leases=leases)
        last_reap = 0.0
        while True:
            claimed = repo.claim(args.project, owner=args.owner)
            if not claimed:
                if time.monotonic() - last_reap > REAP_EVERY:
                    repo.reap()
                    last_reap = time.monotonic()
                notifier.wait(args.project, timeout=REAP_EVERY)
                continue
            job = claimed[0]
            say(f"CLAIM {job.id} {job.attempts}")
            if sys.stdin.readline().strip() != "go":
                return 0
            try:
                outcome = work(repo, job, seed=args.seed, lease_s=lease_s)
            except psycopg.errors.UniqueViolation:
                say(f"DOUBLE {job.id} {job.attempts}")
                return 3
            say(f"{outcome} {job.id} {job.attempts}")


if __name__ == "__main__":
    sys.exit(main())
