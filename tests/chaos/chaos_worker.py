"""A chaos-test worker: a real process on the PostgreSQL backend, killed at will by the test.

The test forks each one from a forkserver that imported this module once (:func:`run_forked`,
its two pipes in place of stdio); ``python chaos_worker.py --url … --project … --seed …
--lease-ms … --owner …`` runs one on stdio by hand.

Protocol, one line each:
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
import os
import sys
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import TextIO

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


def say(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


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


def serve(
    url: str, project: str, seed: int, lease_ms: int, owner: str, inp: TextIO, out: TextIO
) -> int:
    """Claim, report, wait for ``go``, work and report, until ``inp`` ends or says otherwise."""
    lease_s = lease_ms / 1000
    leases = LeasePolicy(default=timedelta(milliseconds=lease_ms), by_kind={})
    notifier = PostgresJobReadyNotifier(url=url)
    notifier.listen()
    with ConnectionPool(
        url, min_size=1, max_size=2, open=True, kwargs={"autocommit": True}
    ) as pool:
        repo = PostgresJobRepository(pool=pool, leases=leases)
        last_reap = 0.0
        while True:
            claimed = repo.claim(project, owner=owner)
            if not claimed:
                if time.monotonic() - last_reap > REAP_EVERY:
                    repo.reap()
                    last_reap = time.monotonic()
                notifier.wait(project, timeout=REAP_EVERY)
                continue
            job = claimed[0]
            say(out, f"CLAIM {job.id} {job.attempts}")
            if inp.readline().strip() != "go":
                return 0
            try:
                outcome = work(repo, job, seed=seed, lease_s=lease_s)
            except psycopg.errors.UniqueViolation:
                say(out, f"DOUBLE {job.id} {job.attempts}")
                return 3
            say(out, f"{outcome} {job.id} {job.attempts}")


def reading(conn: Connection) -> TextIO:
    """Lines read from a pipe's raw end (the Connection's own framing unused)."""
    fd = os.dup(conn.fileno())
    conn.close()
    return os.fdopen(fd, "r")


def writing(conn: Connection) -> TextIO:
    """Lines written to a pipe's raw end."""
    fd = os.dup(conn.fileno())
    conn.close()
    return os.fdopen(fd, "w")


def run_forked(
    inp: Connection, out: Connection, url: str, project: str, seed: int, lease_ms: int, owner: str
) -> None:
    """A forked worker's body: the pipes' raw ends as its input and output, its exit code
    :func:`serve`'s."""
    with reading(inp) as lines_in, writing(out) as lines_out:
        code = serve(url, project, seed, lease_ms, owner, lines_in, lines_out)
    sys.exit(code)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--lease-ms", type=int, required=True)
    parser.add_argument("--owner", required=True)
    args = parser.parse_args()
    return serve(
        args.url, args.project, args.seed, args.lease_ms, args.owner, sys.stdin, sys.stdout
    )


if __name__ == "__main__":
    sys.exit(main())
