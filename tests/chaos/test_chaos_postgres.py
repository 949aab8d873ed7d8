"""Chaos on the PostgreSQL backend: real worker processes, SIGKILLed mid-job.

8 worker processes drain 500 jobs (300 independent, 50 chains of 4). Each is forked from a
forkserver that imported the worker once (``chaos_worker.run_forked``), so a respawn costs a
fork, not an interpreter's start and its imports. Each claim is reported to this test, which
SIGKILLs the worker for 20% of executions (decided from the seed) while the job is held, and
respawns it. Leases are 3 s; the workers and a reaper thread here reap.

Invariants: every job terminal or parked (T); no job lost (L); exactly one commit per
succeeded job, counted through a row written in the ack's own transaction under a primary key
(D); settles from lost leases were attempted and all refused (F).

Reproduce a run with ``VIBEY_CHAOS_SEED=<seed printed by the run>``.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing as mp
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TextIO

import pytest
from psycopg_pool import ConnectionPool

from actors.fleet import PRELOAD
from store.jobs import PostgresJobRepository
from tests.chaos import chaos_worker
from tests.chaos.figures import figure
from workflows.job import LeasePolicy
from workflows.queue import EnqueueRequest

pytestmark = pytest.mark.chaos

WORKERS = 8
INDEPENDENT = 300
CHAINS, CHAIN_LENGTH = 50, 4
KILL_RATE = 0.20
LEASE_MS = 3000
DEADLINE_S = 300
PROJECT = "chaos"
FORKS = mp.get_context("forkserver")

CHAOS_TABLES = """
CREATE TABLE chaos_commit (
    job_id uuid PRIMARY KEY REFERENCES job (id),
    attempt integer NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE chaos_stale (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL REFERENCES job (id),
    attempt integer NOT NULL
);
"""


def fraction(*parts: object) -> float:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


@dataclass
class Tally:
    executions: int = 0
    kills: int = 0
    respawns: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    doubles: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Worker:
    """A forked worker process and this side of its two pipes."""

    process: Any  # multiprocessing's forkserver Process
    to_worker: TextIO
    from_worker: TextIO


class Fleet:
    """Runs the workers, answers their claims with ``go`` or SIGKILL, respawns the dead."""

    def __init__(self, url: str, seed: int, tally: Tally) -> None:
        self.url, self.seed, self.tally = url, seed, tally
        # The worker's imports once, in the forkserver (set when the fleet starts, as a
        # Supervisor sets it, not when the module is collected). The server is one per process,
        # shared with the other chaos tests' fleets: it preloads what theirs would too (when one
        # of them started it first, it holds the store modules this worker imports).
        FORKS.set_forkserver_preload([*PRELOAD, "tests.chaos.chaos_worker"])
        self.slots: list[Worker | None] = [None] * WORKERS
        self.stopping = threading.Event()
        self.pids: set[int] = set()
        self.readers: list[threading.Thread] = []

    def spawn(self, slot: int) -> None:
        worker_in, to_worker = FORKS.Pipe(duplex=False)
        from_worker, worker_out = FORKS.Pipe(duplex=False)
        process = FORKS.Process(
            target=chaos_worker.run_forked,
            args=(worker_in, worker_out, self.url, PROJECT, self.seed, LEASE_MS, f"w{slot}"),
            name=f"chaos-worker-{slot}",
        )
        process.start()
        worker_in.close()  # the worker's ends are its own: its death ends what we read
        worker_out.close()
        worker = Worker(
            process,
            chaos_worker.writing(to_worker),
            chaos_worker.reading(from_worker),
        )
        self.slots[slot] = worker
        assert process.pid is not None
        self.pids.add(process.pid)
        reader = threading.Thread(target=self.converse, args=(worker,), daemon=True)
        reader.start()
        self.readers.append(reader)

    def converse(self, worker: Worker) -> None:
        try:
            for line in worker.from_worker:
                word, job_id, attempt = line.split()
                if word == "CLAIM":
                    self.on_claim(worker, job_id, int(attempt))
                else:
                    with self.tally.lock:
                        self.tally.outcomes[word] += 1
                        if word == "DOUBLE":
                            self.tally.doubles.append(job_id)
        finally:
            worker.process.join()
            worker.from_worker.close()
            with contextlib.suppress(BrokenPipeError):
                worker.to_worker.close()

    def on_claim(self, worker: Worker, job_id: str, attempt: int) -> None:
        with self.tally.lock:
            self.tally.executions += 1
        if fraction(self.seed, "kill", job_id, attempt) < KILL_RATE:
            os.kill(worker.process.pid, signal.SIGKILL)
            with self.tally.lock:
                self.tally.kills += 1
            return
        try:
            worker.to_worker.write("go\n")
            worker.to_worker.flush()
        except BrokenPipeError:
            pass

    def supervise(self) -> None:
        while not self.stopping.is_set():
            for slot, worker in enumerate(self.slots):
                if (
                    worker is not None
                    and worker.process.exitcode is not None
                    and not self.stopping.is_set()
                ):
                    with self.tally.lock:
                        self.tally.respawns += 1
                    self.spawn(slot)
            time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()
        for worker in self.slots:
            if worker is not None and worker.process.exitcode is None:
                worker.process.kill()
        for reader in self.readers:
            reader.join(timeout=10)
        for pid in self.pids:  # every process this test started is gone, by pid
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def enqueue_work(repo: PostgresJobRepository, seed: int) -> int:
    rng = random.Random(seed)

    def next_id() -> uuid.UUID:  # job ids come from the seed, so every decision reproduces
        return uuid.UUID(int=rng.getrandbits(128), version=4)

    requests = [
        EnqueueRequest(
            project_id=PROJECT,
            kind="build.implement",
            subject=f"item-{i}",
            priority=rng.randint(0, 3),
            max_attempts=8,
            job_id=next_id(),
        )
        for i in range(INDEPENDENT)
    ]
    for chain in range(CHAINS):
        previous: tuple[uuid.UUID, ...] = ()
        for step in range(CHAIN_LENGTH):
            job_id = next_id()
            requests.append(
                EnqueueRequest(
                    project_id=PROJECT,
                    kind="build.verify",
                    subject=f"chain-{chain}-{step}",
                    depends_on=previous,
                    job_id=job_id,
                    max_attempts=8,
                )
            )
            previous = (job_id,)
    repo.enqueue_batch(requests)
    return len(requests)


def unsettled(pool: ConnectionPool) -> int:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM job WHERE state NOT IN "
            "('succeeded', 'failed', 'cancelled', 'awaiting_human')"
        ).fetchone()
    return int(row[0]) if row else -1


def test_sigkilled_workers_lose_nothing_and_commit_once(pg_url: str) -> None:
    seed = int(os.environ.get("VIBEY_CHAOS_SEED") or random.SystemRandom().randrange(2**31))
    figure(f"\nchaos seed: {seed} (rerun with VIBEY_CHAOS_SEED={seed})")
    tally = Tally()
    started = time.monotonic()
    leases = LeasePolicy(default=timedelta(milliseconds=LEASE_MS), by_kind={})
    with ConnectionPool(
        pg_url, min_size=1, max_size=4, open=True, kwargs={"autocommit": True}
    ) as pool:
        with pool.connection() as conn:
            conn.execute(CHAOS_TABLES)
        repo = PostgresJobRepository(pool=pool, leases=leases)
        total = enqueue_work(repo, seed)
        fleet = Fleet(pg_url, seed, tally)
        for slot in range(WORKERS):
            fleet.spawn(slot)
        supervisor = threading.Thread(target=fleet.supervise, daemon=True)
        supervisor.start()
        try:
            while unsettled(pool) and time.monotonic() - started < DEADLINE_S:
                repo.reap()
                time.sleep(0.5)
        finally:
            fleet.stop()
            supervisor.join(timeout=5)
        with pool.connection() as conn:
            states: dict[Any, Any] = dict(
                conn.execute("SELECT state::text, count(*) FROM job GROUP BY 1").fetchall()
            )
            succeeded = {r[0] for r in conn.execute("SELECT id FROM job WHERE state = 'succeeded'")}
            commits = conn.execute("SELECT job_id FROM chaos_commit").fetchall()
            stale = conn.execute("SELECT count(*) FROM chaos_stale").fetchone()
    stale_rejected = tally.outcomes["STALE"]
    figure(
        f"chaos tally (seed {seed}): jobs={total} executions={tally.executions} "
        f"kills={tally.kills} ({tally.kills / max(tally.executions, 1):.0%}) "
        f"respawns={tally.respawns} acks={tally.outcomes['ACK']} nacks={tally.outcomes['NACK']} "
        f"stale_settles_rejected={tally.outcomes['STALE']} double_commits={len(tally.doubles)} "
        f"states={states} wall={time.monotonic() - started:.1f}s"
    )
    assert sum(states.values()) == total, "a job was lost"
    settled = {"succeeded", "failed", "cancelled", "awaiting_human"}
    assert set(states) <= settled, f"jobs neither terminal nor parked: {states}"
    assert tally.doubles == [], "a job committed twice"
    assert len(commits) == len({c[0] for c in commits}) == len(succeeded)
    assert {c[0] for c in commits} == succeeded, "a succeeded job without exactly one commit"
    assert tally.kills >= total * 0.1, "the chaos did not happen"
    assert stale_rejected >= 1, "no settle from a lost lease reached the fence"
    assert stale is not None and stale[0] <= stale_rejected  # refused acks, as recorded
