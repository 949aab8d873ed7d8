"""Benchmark: durable no-op steps per second through the whole RabbitMQ dispatch path.

Prints, from one run (the figures issue 3 asks `just bench` for):

1. durable no-op steps/s. A supervised fleet (``--processes`` × ``--threads``, default 2 × 8)
   runs ``--chains`` chains of ``--length`` dependent steps (default 200 × 10; the kinds
   alternate between the INTERACTIVE and BUILD lanes). The chains are enqueued in one
   transaction through a dispatching PostgresJobRepository with no relay, so the fleet's
   reconcilers (every second) drain the first pointers from the outbox; every later pointer
   goes enqueue-free through the whole path: settle → outbox row → the settling process's
   relay → RabbitMQ → Dramatiq consumer → step actor → fenced claim → handler. The figure is
   steps over the busy window, first step start → last step end (so the wait for the first
   drain is not counted; the end-to-end time from the enqueue commit is printed beside it).
2. step → next-step start latency p50/p99: handler start of step n+1 − handler end of step n
   in the same chain (settle, relay, broker hop, delivery, fenced claim), measured on the same
   fleet with ``--light-chains`` chains of 200 steps (default 1: nothing else runs, so this is
   the path's own latency; with more chains the steps' CPU begins to queue on the 2 cores),
   and under the throughput load above (where it is mostly queueing: ≈ chains ÷ steps/s).
3. raw Dramatiq no-op messages/s on the same broker (``ops/bench/raw_dramatiq.py``, drained by
   ``dramatiq raw_dramatiq -p P -t T``), and 4. the ratio durable/raw.
5. PostgreSQL WAL flushes and commits per step (``pg_stat_wal`` is cluster-wide: the line says
   how many transactions other databases committed meanwhile), and the CPU each party spent
   per step (PostgreSQL's and RabbitMQ's whole servers; "others" is the rest of the box).
6. where the time goes, in one in-process Runtime (``--threads`` threads, no Supervisor): the
   light workload with wall-clock timers on the step path (each hop cut into segments: the
   unit of work that claims, runs and settles a short step, the relay, the broker, Dramatiq),
   then the throughput workload under cProfile measuring CPU time per thread (the pstats
   file is kept; its path is printed).

The no-op handlers are :class:`~workflows.steps.Short`: each step's first delivery is claimed,
run and settled in one transaction.

Every workload is enqueued and then ANALYZEd, as a deployed database would have statistics
(without them the step path's plans differ, and change when autovacuum catches up); each
in-process run starts from empty tables.

VIBEY_TEST_PG_URL is an admin URL: the bench creates a scratch database and drops it.
VIBEY_TEST_AMQP_URL is the broker: every queue and exchange is named under a unique prefix and
deleted afterwards. Every process the bench starts is stopped by its pid, on failure too.

    .venv/bin/python ops/bench/steps.py [--processes 2] [--threads 8] [--chains 200]
        [--length 10] [--light-chains 4] [--raw-messages 20000] [--no-profile]

This module is longer than the conventions' ~400 lines because it is one script: the setup,
the three measured runs and their report read best top to bottom in one place.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import itertools
import json
import math
import multiprocessing
import multiprocessing.forkserver
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import bench_handlers
import pika
import pika.exceptions
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from actors.broker import PointerConsumer
from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.fleet import Supervisor
from actors.worker import Runtime, WorkerConfig
from store.jobs import PostgresJobRepository
from store.migrate import migrate
from workflows.queue import EnqueueRequest

HERE = Path(__file__).resolve().parent
# raw_dramatiq.py reads these at import, so it is imported only once they are set.
RAW_URL_ENV, RAW_QUEUE_ENV, RAW_DIR_ENV = (
    "VIBEY_BENCH_RAW_AMQP_URL",
    "VIBEY_BENCH_RAW_QUEUE",
    "VIBEY_BENCH_RAW_DIR",
)
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "awaiting_human"})
RECONCILE = timedelta(seconds=1)
LIGHT_LENGTH = 200  # steps per chain in the latency run
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


class BenchFailure(Exception):
    """The bench could not measure what it promised; the message says what went wrong."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="fleet worker processes")
    parser.add_argument("--threads", type=int, default=8, help="Dramatiq threads per process")
    parser.add_argument("--chains", type=int, default=200, help="independent chains")
    parser.add_argument("--length", type=int, default=10, help="dependent steps per chain")
    parser.add_argument(
        "--light-chains", type=int, default=1, help=f"{LIGHT_LENGTH}-step chains, latency run"
    )
    parser.add_argument("--raw-messages", type=int, default=20_000, help="raw Dramatiq messages")
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false", help="skip the in-process runs"
    )
    return parser.parse_args(argv)


# -- what the bench creates, and removes -----------------------------------------------------


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@contextmanager
def scratch_database(admin: str, name: str) -> Iterator[str]:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def delete_broker_objects(url: str, queues: Sequence[str], exchanges: Sequence[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for name in queues:
            with suppress(pika.exceptions.ChannelClosedByBroker):
                connection.channel().queue_delete(name)
        for name in exchanges:
            with suppress(pika.exceptions.ChannelClosedByBroker):
                connection.channel().exchange_delete(name)
    finally:
        connection.close()


@contextmanager
def declared_topology(config: WorkerConfig) -> Iterator[None]:
    """Declare the fleet's topology first (as a deployment would), delete it at the end."""
    topology = config.topology()
    connection = pika.BlockingConnection(pika.URLParameters(config.amqp_url))
    caps = detect(connection)  # reads the handshake, nothing more
    queues = [spec.name for spec in topology.queues(caps)]
    exchanges = [spec.name for spec in topology.exchanges()]
    try:
        try:
            topology.declare(connection.channel(), caps)
        finally:
            connection.close()
        yield
    finally:
        delete_broker_objects(config.amqp_url, queues, exchanges)


def start_forkserver(log: Path) -> None:
    """Start multiprocessing's forkserver with its stderr on ``log``: the worker processes it
    forks log there (INFO, APScheduler every second) instead of over the bench's figures."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        multiprocessing.forkserver.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


@contextmanager
def running_fleet(config: WorkerConfig, processes: int, log: Path) -> Iterator[Supervisor]:
    supervisor = Supervisor(config, processes=processes)  # sets the forkserver's preload
    start_forkserver(log)
    thread = threading.Thread(target=supervisor.run, name="bench-supervisor", daemon=True)
    thread.start()
    try:
        yield supervisor
    finally:
        supervisor.stop()  # its thread sends SIGTERM to each worker by pid; each drains
        thread.join(timeout=60)
        for child in multiprocessing.active_children():  # a worker that did not stop
            child.kill()
            child.join(timeout=10)
        thread.join(timeout=10)


@contextmanager
def raw_workers(processes: int, threads: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``dramatiq raw_dramatiq -p P -t T`` in its own process group, stopped by its pid."""
    command = [str(Path(sys.executable).with_name("dramatiq")), "raw_dramatiq"]
    command += ["-p", str(processes), "-t", str(threads)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=out, start_new_session=True, env=dict(os.environ)
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)  # the master forwards it to its worker processes
        try:
            proc.wait(timeout=30)
        finally:
            with suppress(ProcessLookupError):  # the group is the master's own session
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of it is left
            proc.wait()


def tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return f"({path.name} is empty)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# -- the workload ----------------------------------------------------------------------------


def chain_requests(tag: str, chains: int, length: int) -> list[EnqueueRequest]:
    """Project ``bench<tag>``; subjects ``<tag>:<chain>:<index>``; each step depends on the
    one before it; the kinds alternate between the INTERACTIVE and BUILD lanes."""
    requests = []
    for chain in range(chains):
        previous: tuple[uuid.UUID, ...] = ()
        for index in range(length):
            job_id = uuid.uuid4()
            requests.append(
                EnqueueRequest(
                    project_id=f"bench{tag}",
                    kind=bench_handlers.KINDS[index % len(bench_handlers.KINDS)],
                    subject=f"{tag}:{chain}:{index}",
                    depends_on=previous,
                    job_id=job_id,
                )
            )
            previous = (job_id,)
    return requests


def enqueue(pool: ConnectionPool, config: WorkerConfig, requests: list[EnqueueRequest]) -> float:
    """One transaction, dispatching but with no relay (the outbox rows wait for a
    reconciler's drain), then ANALYZE: a deployed database has statistics, and without them
    the plans of the step path's statements differ (and change when autovacuum catches up)."""
    repo = PostgresJobRepository(pool=pool, leases=config.queue.lease, dispatch=True)
    repo.enqueue_batch(requests)
    committed = time.time()
    with pool.connection() as conn:
        conn.execute("ANALYZE job, job_dependency, job_outbox")
    return committed


def reset_tables(pool: ConnectionPool) -> None:
    with pool.connection() as conn:
        conn.execute("TRUNCATE job, job_dependency, job_outbox, gate")


@dataclass
class Waited:
    states: dict[str, int]
    polls: int  # transactions the bench itself committed on the scratch database
    timed_out: bool


def wait_until_settled(pool: ConnectionPool, project: str, total: int, timeout: float) -> Waited:
    deadline, polls = time.monotonic() + timeout, 0
    while True:
        with pool.connection() as conn:
            rows = conn.execute(
                "SELECT state::text, count(*) FROM job WHERE project_id = %s GROUP BY 1",
                (project,),
            ).fetchall()
        polls += 1
        states = {state: int(n) for state, n in rows}
        settled = sum(n for state, n in states.items() if state in TERMINAL)
        if settled == total or time.monotonic() > deadline:
            return Waited(states, polls, settled != total)
        time.sleep(0.05)


def wait_for_consumers(url: str, queues: Sequence[str], count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        while True:
            found = {
                q: channel.queue_declare(q, passive=True).method.consumer_count for q in queues
            }
            if all(n >= count for n in found.values()):
                return
            if time.monotonic() > deadline:
                raise BenchFailure(f"the fleet was not consuming after {timeout:.0f}s: {found}")
            time.sleep(0.1)
    finally:
        connection.close()


def job_summary(pool: ConnectionPool, project: str) -> tuple[int, int]:
    """(jobs with more than one attempt, claims in all)."""
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE attempts > 1), coalesce(sum(attempts), 0) "
            "FROM job WHERE project_id = %s",
            (project,),
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def unfinished(pool: ConnectionPool, project: str, limit: int = 5) -> str:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT subject, kind, state::text, dispatch_seq, attempts FROM job "
            "WHERE project_id = %s AND state <> 'succeeded' ORDER BY subject LIMIT %s",
            (project, limit),
        ).fetchall()
    return "; ".join(f"{s} {k} {st} seq={q} attempts={a}" for s, k, st, q, a in rows)


# -- measuring -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTally:
    runs: int  # handler runs
    by_key: dict[tuple[int, int], tuple[str, float, float]]  # (chain, index) → id, start, end

    @property
    def steps(self) -> int:
        return len(self.by_key)

    @property
    def window(self) -> float:
        starts = [start for _job, start, _end in self.by_key.values()]
        return max(end for _job, _start, end in self.by_key.values()) - min(starts)

    @property
    def rate(self) -> float:
        return self.steps / self.window if self.window > 0 else math.nan

    def hop_pairs(self) -> Iterator[tuple[tuple[str, float, float], tuple[str, float, float]]]:
        """(step n, step n+1) of every chain."""
        for (chain, index), step in self.by_key.items():
            following = self.by_key.get((chain, index + 1))
            if following is not None:
                yield step, following

    @property
    def hops(self) -> list[float]:
        """Step → next-step start, seconds."""
        return [following[1] - step[2] for step, following in self.hop_pairs()]


def read_steps(directory: Path, tag: str) -> StepTally:
    """A step that ran twice keeps its first start and its last end."""
    by_key: dict[tuple[int, int], tuple[str, float, float]] = {}
    runs = 0
    for path in directory.glob("*.steps"):
        for line in path.read_text().splitlines():
            subject, job, start, end = line.split()
            line_tag, chain, index = subject.split(":")
            if line_tag != tag:
                continue
            runs += 1
            key = (int(chain), int(index))
            _job, first, last = by_key.get(key, (job, math.inf, -math.inf))
            by_key[key] = (job, min(first, float(start)), max(last, float(end)))
    if not by_key:
        raise BenchFailure(f"no step of {tag} ran: nothing in {directory}")
    return StepTally(runs, by_key)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def latency(hops: Sequence[float]) -> str:
    ms = [h * 1000 for h in hops]
    if not ms:
        return "no hops (chains of one step)"
    return (
        f"p50 {percentile(ms, 50):.2f} ms, p99 {percentile(ms, 99):.2f} ms, "
        f"max {max(ms):.1f} ms ({len(ms):,} hops)"
    )


PARTIES = {"postgres": "postgres", "beam.smp": "rabbitmq"}


def is_rabbitmq_node(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"rabbit\x00boot" in cmdline.read()
    except OSError:
        return False


def proc_cpu(pid: str) -> tuple[str, int, float] | None:
    """(command name, parent pid, CPU seconds) of a process, or None once it exited."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            head, _, rest = stat.read().rpartition(")")
    except OSError:
        return None
    fields = rest.split()
    return head.partition("(")[2], int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def box_busy() -> float:
    """CPU seconds the whole machine has been busy (every core, every process, the kernel)."""
    with open("/proc/stat", encoding="ascii") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = stat.readline().split()[1:9]
    return sum(int(v) for v in (user, nice, system, irq, softirq, steal)) / CLOCK_TICK


def cpu_sample(
    workers: Sequence[int], postmaster: int | None = None
) -> dict[int, tuple[str, float]]:
    """CPU seconds used so far by each process of a party: the workers (these pids and their
    children), PostgreSQL (every ``postgres`` process; with ``postmaster``, only that
    cluster's: it and the processes it forked, :func:`postmaster_of`), RabbitMQ (the
    ``beam.smp`` running the node), this bench (key 0), and the whole box (key -1)."""
    found: dict[int, tuple[str, float]] = {}
    for entry in os.scandir("/proc"):
        sample = proc_cpu(entry.name) if entry.name.isdigit() else None
        if sample is None:
            continue
        pid, (comm, parent, seconds) = int(entry.name), sample
        worker = pid in workers or parent in workers
        party = "workers" if worker else PARTIES.get(comm)
        if party == "rabbitmq" and not is_rabbitmq_node(pid):
            continue  # rabbitmqctl runs an Erlang VM too
        if party == "postgres" and postmaster not in (None, pid, parent):
            continue  # another cluster's
        if party is not None:
            found[pid] = (party, seconds)
    times = os.times()
    found[0] = ("bench", times.user + times.system)
    found[-1] = ("box", box_busy())
    return found


def postmaster_of(pg_url: str) -> int:
    """The pid of the postmaster serving ``pg_url`` (the parent of a backend of it)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the backend lives while it is read
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        found = proc_cpu(str(row[0]))
    assert found is not None, "PostgreSQL runs on another machine: its CPU cannot be read here"
    return found[1]


def cpu_spent(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds by party between two samples; "others" is the rest of the box."""
    spent = dict.fromkeys(("workers", "postgres", "rabbitmq", "bench", "box"), 0.0)
    for pid, (party, seconds) in after.items():
        spent[party] += seconds - before.get(pid, (party, 0.0))[1]
    box = spent.pop("box")
    spent["others"] = max(0.0, box - sum(spent.values()))
    return spent


def per_unit(cpu: dict[str, float], units: int) -> str:
    return ", ".join(f"{party} {seconds * 1000 / units:.2f} ms" for party, seconds in cpu.items())


@dataclass(frozen=True)
class PgCounters:
    wal_sync: int
    wal_write: int
    wal_bytes: int
    commits: dict[str, int]  # xact_commit by database

    def since(self, before: PgCounters, database: str) -> PgDelta:
        """The change; other databases' commits count only where a database still exists."""
        elsewhere = sum(
            n - before.commits.get(name, 0) for name, n in self.commits.items() if name != database
        )
        return PgDelta(
            self.wal_sync - before.wal_sync,
            self.wal_write - before.wal_write,
            self.wal_bytes - before.wal_bytes,
            self.commits.get(database, 0) - before.commits.get(database, 0),
            elsewhere,
        )


@dataclass(frozen=True)
class PgDelta:
    wal_sync: int
    wal_write: int
    wal_bytes: int
    commits: int  # the scratch database's
    elsewhere: int  # every other database's


def pg_counters(admin: str) -> PgCounters:
    with psycopg.connect(admin, autocommit=True) as conn:
        wal = conn.execute("SELECT wal_sync, wal_write, wal_bytes FROM pg_stat_wal").fetchone()
        rows = conn.execute(
            "SELECT datname, xact_commit FROM pg_stat_database WHERE datname IS NOT NULL"
        ).fetchall()
    assert wal is not None
    return PgCounters(int(wal[0]), int(wal[1]), int(wal[2]), {n: int(c) for n, c in rows})


@dataclass(frozen=True)
class Phase:
    tally: StepTally
    total: int
    end_to_end: float  # enqueue commit → last step end
    cpu: dict[str, float]  # CPU seconds by party, enqueue → every job succeeded
    own_commits: int  # the bench's transactions on the scratch database


def run_phase(
    args: argparse.Namespace,
    config: WorkerConfig,
    pool: Any,
    workload: tuple[str, int, int],
    workers: Sequence[int] = (),
) -> Phase:
    """Enqueue ``workload`` (tag, chains, length) and wait until every job succeeded."""
    tag, chains, length = workload
    requests = chain_requests(tag, chains, length)
    before = cpu_sample(workers)
    enqueued_at = enqueue(pool, config, requests)
    waited = wait_until_settled(pool, f"bench{tag}", len(requests), 60 + len(requests) / 20)
    cpu = cpu_spent(before, cpu_sample(workers))
    if waited.states.get("succeeded", 0) != len(requests):
        raise BenchFailure(
            f"{tag}: not every job succeeded ({'timed out, ' if waited.timed_out else ''}"
            f"states {waited.states}): {unfinished(pool, f'bench{tag}')}"
        )
    tally = read_steps(args.steps_dir, tag)
    last_end = max(end for _job, _start, end in tally.by_key.values())
    return Phase(tally, len(requests), last_end - enqueued_at, cpu, waited.polls + 2)


# -- 1, 2, 5: the durable fleet --------------------------------------------------------------


@dataclass(frozen=True)
class Durable:
    load: Phase  # the throughput run
    light: Phase  # one chain by default: the path's own latency, no queueing
    retried: int
    claims: int
    pg: PgDelta  # over both phases


def fleet_run(args: argparse.Namespace, config: WorkerConfig, admin: str, pool: Any) -> Durable:
    log = Path(args.work) / "fleet.log"
    try:
        with running_fleet(config, args.processes, log) as fleet:
            wait_for_consumers(config.amqp_url, config.queues(), args.processes, timeout=60)
            pg_before = pg_counters(admin)
            load = run_phase(args, config, pool, ("fleet", args.chains, args.length), fleet.pids)
            light = run_phase(args, config, pool, ("light", args.light_chains, LIGHT_LENGTH))
    except BenchFailure as exc:
        raise BenchFailure(f"{exc}\nworker log ({log}):\n{tail(log)}") from None
    time.sleep(0.5)  # the workers' backends report their statistics as they exit
    pg = pg_counters(admin).since(pg_before, args.database)
    pg = replace(pg, commits=pg.commits - load.own_commits - light.own_commits)
    return Durable(load, light, *job_summary(pool, "benchfleet"), pg)


def print_durable(args: argparse.Namespace, d: Durable) -> float:
    t = d.load.tally
    print(
        f"durable: {t.steps:,} no-op steps in {t.window:.2f} s (busy window: first step start → "
        f"last step end) = {t.rate:,.0f} steps/s  [{args.processes} processes × {args.threads} "
        f"threads, {args.chains} chains × {args.length} steps]"
    )
    print(
        f"  end to end from the enqueue commit: {d.load.end_to_end:.2f} s (the first pointers "
        f"wait for a reconciler's outbox drain, every {RECONCILE.total_seconds():.0f} s); "
        f"handler runs {t.runs:,} for {d.load.total:,} jobs ({t.runs - t.steps} duplicates), "
        f"claims {d.claims:,}, jobs retried {d.retried}"
    )
    print(
        f"step → next-step start latency, {args.light_chains} × {LIGHT_LENGTH}-step chain(s) (no "
        f"queueing): {latency(d.light.tally.hops)}"
    )
    print(
        f"  under the throughput load ({args.chains} chains in flight, so mostly queueing, "
        f"≈ chains ÷ throughput): {latency(t.hops)}"
    )
    pg, n = d.pg, t.steps + d.light.tally.steps
    print(
        f"postgres per step: {pg.wal_sync / n:.2f} WAL flushes (pg_stat_wal.wal_sync), "
        f"{pg.wal_write / n:.2f} WAL writes, {pg.wal_bytes / n / 1024:.1f} KiB WAL, "
        f"{pg.commits / n:.2f} commits (xact_commit, read-only ones included)  [both runs; WAL "
        f"is cluster-wide: other databases committed {pg.elsewhere:,} transactions meanwhile]"
    )
    cores = os.cpu_count() or 1
    print(
        f"cpu per step (enqueue → all succeeded): {per_unit(d.load.cpu, t.steps)}; at "
        f"{t.rate:,.0f} steps/s {cores} cores give {cores * 1000 / t.rate:.2f} ms"
    )
    return t.rate


# -- 3: raw Dramatiq ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    messages: int
    processed: int
    window: float
    enqueue_s: float
    cpu: dict[str, float]  # CPU seconds by party while the queue drained


def wait_for_depth(channel: Any, queue: str, done: Callable[[int], bool], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        depth = channel.queue_declare(queue, passive=True).method.message_count
        if done(depth):
            return int(depth)
        if time.monotonic() > deadline:
            raise BenchFailure(f"raw Dramatiq: queue {queue} still holds {depth} messages")
        time.sleep(0.01)


def raw_run(args: argparse.Namespace, amqp: str, queue: str) -> Raw:
    tally_dir = Path(args.work) / "raw"
    tally_dir.mkdir()
    os.environ.update({RAW_URL_ENV: amqp, RAW_QUEUE_ENV: queue, RAW_DIR_ENV: str(tally_dir)})
    raw = importlib.import_module("raw_dramatiq")
    began = time.perf_counter()
    for _ in range(args.raw_messages):
        raw.noop.send()
    enqueue_s = time.perf_counter() - began
    raw.broker.close()
    log = Path(args.work) / "raw.log"
    connection = pika.BlockingConnection(pika.URLParameters(amqp))
    try:
        channel = connection.channel()
        wait_for_depth(channel, queue, lambda n: n >= args.raw_messages, timeout=30)
        with raw_workers(args.processes, args.threads, log) as proc:
            timeout = 60 + args.raw_messages / 1000
            started = lambda n: n < args.raw_messages or proc.poll() is not None  # noqa: E731
            wait_for_depth(channel, queue, started, timeout)
            before = cpu_sample([proc.pid])
            wait_for_depth(channel, queue, lambda n: n == 0 or proc.poll() is not None, timeout)
            cpu = cpu_spent(before, cpu_sample([proc.pid]))
            time.sleep(0.3)  # the last prefetched messages (≤ 2 × threads per process)
    finally:
        connection.close()
    tallies = [json.loads(p.read_text()) for p in tally_dir.glob("*.json")]
    tallies = [t for t in tallies if t["count"]]
    if not tallies:
        raise BenchFailure(f"raw Dramatiq processed nothing; its log:\n{tail(log)}")
    window = max(t["last"] for t in tallies) - min(t["first"] for t in tallies)
    processed = sum(t["count"] for t in tallies)
    return Raw(args.raw_messages, processed, window, enqueue_s, cpu)


def print_raw(args: argparse.Namespace, raw: Raw) -> float:
    rate = raw.processed / raw.window
    print(
        f"raw dramatiq: {raw.processed:,} of {raw.messages:,} no-op messages drained by "
        f"{args.processes} processes × {args.threads} threads in {raw.window:.2f} s (first message"
        f" start → last message end) = {rate:,.0f} msg/s  [enqueued beforehand without confirms "
        f"in {raw.enqueue_s:.2f} s = {raw.enqueue_s * 1e3 / raw.messages:.3f} ms each]"
    )
    print(f"  cpu per message while the queue drained: {per_unit(raw.cpu, raw.processed)}")
    return rate


# -- 6: where the time goes (one in-process Runtime) ------------------------------------------


class Timed:
    """A bound method whose calls are recorded: (start, end, job ids), ``time.time()``."""

    def __init__(self, fn: Callable[..., Any], keys: Callable[..., list[str]]) -> None:
        self.fn = fn
        self.keys = keys
        self.calls: list[tuple[float, float, list[str]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        began = time.time()
        result = self.fn(*args, **kwargs)
        self.calls.append((began, time.time(), self.keys(args, kwargs, result)))
        return result

    def by_job(self, *, last: bool) -> dict[str, tuple[float, float]]:
        found: dict[str, tuple[float, float]] = {}
        for began, ended, jobs in self.calls:
            for job in jobs:
                if last or job not in found:
                    found[job] = (began, ended)
        return found


def profile_new_threads(profilers: list[cProfile.Profile]) -> Callable[..., None]:
    """A threading.setprofile hook: each new thread swaps it for its own CPU-time profiler."""

    def hook(_frame: Any, _event: str, _arg: Any) -> None:
        profiler = cProfile.Profile(time.thread_time)
        profilers.append(profiler)
        profiler.enable()

    return hook


# The store calls of the step path, each with the job ids a call concerns.
TIMED: dict[str, tuple[str, Callable[..., list[str]]]] = {
    "claim_pointer_txn": ("records", lambda a, kw, r: [] if r is None else [str(kw["job_id"])]),
    "mark_sent": ("records", lambda a, kw, r: []),
}
SEGMENTS = (
    "handler end → committed: settle + release the next step (the claim's unit of work)",
    "→ the relay's I/O thread publishes (the pointer fields come from the commit)",
    "→ the consumer receives it: RabbitMQ (quorum queue), pika",
    "→ the fenced claim starts: Dramatiq's work queue and worker thread",
    "→ handler start: BEGIN + claim, one round trip",
)


@contextmanager
def instrumented(runtime: Runtime) -> Iterator[dict[str, Timed]]:
    """Wall-clock timers on the step path of a started in-process Runtime: its store calls,
    its relay's publishes (on the I/O thread) and its consumers' receipts. Read-only
    wrappers, removed on exit."""
    timers: dict[str, Timed] = {}
    for name, (part, keys) in TIMED.items():
        target = getattr(runtime, part)
        timers[name] = Timed(getattr(target, name), keys)
        setattr(target, name, timers[name])  # StepRunner and Relay share these objects
    units = runtime.jobs.units  # private: measuring only
    timers["committed"] = Timed(
        units._publish,  # type: ignore[arg-type]
        lambda a, kw, r: [str(row.job_id) for row in a[0]],
    )
    units._publish = timers["committed"]
    publisher = runtime.relay._io  # private: measuring only
    timers["publish"] = Timed(
        publisher._send,
        lambda a, kw, r: [p.message_id.split(":")[0] for p in a[0]],
    )
    publisher._send = timers["publish"]  # type: ignore[method-assign]
    original = PointerConsumer.__next__
    receive = timers["receive"] = Timed(
        original, lambda a, kw, r: [] if r is None else [r.kwargs["job_id"]]
    )
    PointerConsumer.__next__ = lambda self: receive(self)  # type: ignore[method-assign]
    try:
        yield timers
    finally:
        PointerConsumer.__next__ = original  # type: ignore[method-assign]


def in_process_run(
    args: argparse.Namespace,
    config: WorkerConfig,
    pool: Any,
    workload: tuple[str, int, int],
    profilers: list[cProfile.Profile] | None,
) -> tuple[Phase, dict[str, Timed]]:
    """The workload in one Runtime in this process: instrumented with wall-clock timers, or
    (given ``profilers``) with a CPU-time profiler in every new thread."""
    reset_tables(pool)
    if profilers is not None:
        threading.setprofile(profile_new_threads(profilers))
    try:
        runtime = Runtime(config, handlers=bench_handlers.HANDLERS, owner=f"bench-{workload[0]}")
        try:
            runtime.start()
            with ExitStack() as stack:
                timers = {} if profilers is not None else stack.enter_context(instrumented(runtime))
                phase = run_phase(args, config, pool, workload)
        finally:
            runtime.stop(timeout=30)
    finally:
        threading.setprofile(None)
    return phase, timers


def hop_segments(tally: StepTally, timers: dict[str, Timed]) -> list[list[float]]:
    """For each hop, the wall time of each of SEGMENTS, seconds."""
    first = {name: timers[name].by_job(last=False) for name in ("committed", "publish")}
    last = {name: timers[name].by_job(last=True) for name in ("receive", "claim_pointer_txn")}
    found = []
    for (_job, _start, end), (following, start, _end) in tally.hop_pairs():
        committed, publish = first["committed"].get(following), first["publish"].get(following)
        receive, claim = last["receive"].get(following), last["claim_pointer_txn"].get(following)
        if committed and publish and receive and claim:  # else a reconciler sent it
            points = (end, committed[0], publish[0], receive[1], claim[0], start)
            found.append([b - a for a, b in itertools.pairwise(points)])
    return found


def print_wall(args: argparse.Namespace, phase: Phase, timers: dict[str, Timed]) -> None:
    t = phase.tally
    print(
        f"in-process runtime, 1 process × {args.threads} threads, {args.light_chains} × "
        f"{LIGHT_LENGTH}-step chain(s), no profiler: step → next-step {latency(t.hops)}; "
        f"client CPU {phase.cpu['bench'] * 1000 / t.steps:.2f} ms per step"
    )
    parts = []
    for name, timer in timers.items():
        calls = [(ended - began) * 1000 for began, ended, _jobs in timer.calls] or [math.nan]
        parts.append(
            f"{name} p50 {percentile(calls, 50):.2f} ms ({len(timer.calls) / t.steps:.2f}/step)"
        )
    print("  wall per call: " + "; ".join(parts[:4]))
    segments = hop_segments(t, timers)
    if segments:
        print(f"  one hop, segment by segment (p50 of {len(segments):,} hops):")
        for index, title in enumerate(SEGMENTS):
            print(f"    {percentile([s[index] for s in segments], 50) * 1000:7.2f} ms  {title}")


def label(func: tuple[str, int, str]) -> str:
    path, line, name = func
    for marker in ("site-packages/", f"{HERE.parent.parent}/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path}:{line})" if line else name


THREAD_BODIES = frozenset({"_bootstrap", "_bootstrap_inner", "run"})  # of threading.py
TOP = int(os.environ.get("VIBEY_BENCH_TOP", "12"))


def print_profile(args: argparse.Namespace, phase: Phase, stats: pstats.Stats) -> None:
    print_top(
        f"profile: the same workload in one Runtime ({args.threads} threads), profiled "
        f"{phase.tally.rate:,.0f} steps/s; pstats: {args.pstats}",
        stats,
        phase.tally.steps,
    )


def print_top(title: str, stats: pstats.Stats, n: int) -> None:
    """The CPU per step (``n`` steps) of a profile, and its top functions."""
    rows: Any = stats.stats
    total = sum(tt for _cc, _nc, tt, _ct, _callers in rows.values())
    print(f"{title} under cProfile (CPU time per thread): {total * 1000 / n:.2f} ms CPU per step")
    entries = [
        (func, nc, tt, ct)
        for func, (_cc, nc, tt, ct, _callers) in rows.items()
        if not (func[0].endswith("threading.py") and func[2] in THREAD_BODIES)
    ]
    for heading, key in (("cumulative", 3), ("self", 2)):
        print(f"  top {TOP} by {heading} CPU (ms per step, calls per step, function):")
        for func, nc, tt, ct in sorted(entries, key=lambda e: e[key], reverse=True)[:TOP]:
            value = ct if key == 3 else tt
            print(f"    {value * 1000 / n:7.3f} {nc / n:7.2f}  {label(func)}")


def where_the_time_goes(args: argparse.Namespace, config: WorkerConfig, pool: Any) -> None:
    light = ("wall", args.light_chains, LIGHT_LENGTH)
    phase, timers = in_process_run(args, config, pool, light, None)
    print_wall(args, phase, timers)
    profilers: list[cProfile.Profile] = []
    phase, _ = in_process_run(args, config, pool, ("prof", args.chains, args.length), profilers)
    stats = pstats.Stats(*profilers)
    stats.dump_stats(args.pstats)
    print_profile(args, phase, stats)


# -- main --------------------------------------------------------------------------------------


def run(args: argparse.Namespace, admin: str, amqp: str) -> int:
    token = uuid.uuid4().hex[:8]
    args.database = f"vibey_bench_{token}"
    with ExitStack() as stack:
        args.work = stack.enter_context(tempfile.TemporaryDirectory(prefix="vibey-bench-"))
        url = stack.enter_context(scratch_database(admin, args.database))
        migrate(url)
        config = WorkerConfig(
            database=DatabaseSettings(url=url),
            bus=BusSettings(amqp_url=amqp, prefix=f"vibeybench{token}"),
            queue=QueueSettings(
                rabbitmq=RabbitMqSettings(reconcile_interval_seconds=RECONCILE.total_seconds())
            ),
            worker=WorkerSettings(threads=args.threads, handlers="bench_handlers:HANDLERS"),
        )
        stack.enter_context(declared_topology(config))
        pool = stack.enter_context(
            ConnectionPool(url, min_size=1, max_size=1, open=True, kwargs={"autocommit": True})
        )
        # The forkserver starts after these are set, so every worker process inherits them.
        args.steps_dir = Path(args.work) / "steps"
        args.steps_dir.mkdir()
        os.environ[bench_handlers.ENV] = str(args.steps_dir)
        paths = [str(HERE), os.environ.get("PYTHONPATH", "")]
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        print(f"vibey bench: scratch database {args.database}, broker prefix {config.bus.prefix}")
        durable = print_durable(args, fleet_run(args, config, admin, pool))
        raw_queue = f"vibeybench{token}_raw"
        stack.callback(
            delete_broker_objects, amqp, [raw_queue, f"{raw_queue}.DQ", f"{raw_queue}.XQ"], []
        )
        raw = print_raw(args, raw_run(args, amqp, raw_queue))
        print(f"ratio durable/raw: {durable / raw:.3f} ({durable:,.0f} / {raw:,.0f})")
        if args.profile:
            fd, args.pstats = tempfile.mkstemp(prefix="vibey-bench-steps-", suffix=".pstats")
            os.close(fd)
            where_the_time_goes(args, config, pool)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
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
    try:
        return run(args, admin, amqp)
    except BenchFailure as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
