"""Capacity model: the fleet and the database for 10k, 100k and 1M workflow steps a day.

Inputs, measured (docs/capacity.md explains each):

* from `just bench` (``ops/bench/steps.py``'s output, a file or stdin): durable no-op steps/s
  and the fleet that ran them (processes × threads), PostgreSQL commits and WAL flushes per
  step, the CPU each party spent per step;
* with ``--pg-url``: the bytes a step leaves in a vibey database that ran real workflows (job,
  dependency, history, gate, ledger and outbox relations over the number of jobs);
* ``--step-seconds``: how long a real step's handler runs (an engine turn is minutes; a
  no-op step is what the bench measures), ``--peak``: the busiest hour's rate over the day's
  average.

Prints, per daily volume: the average and peak step rate, the worker slots (concurrent
steps, Little's law: rate × step time) and processes, PostgreSQL commits/s and WAL flushes/s
at the peak, RabbitMQ messages/s, the database's growth per day, and which of them runs out
first.

    python ops/bench/steps.py --no-profile > bench.txt
    python ops/bench/capacity.py bench.txt [--pg-url URL | --step-kib K] [--step-seconds 120]
        [--peak 10]
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

DAY_S = 86_400
VOLUMES = (10_000, 100_000, 1_000_000)
# One publish per step (its outbox row), its delivery and its ack; a delayed step adds one
# tier hop (publish + dead-letter). Confirms ride back on the publish channel.
BROKER_MESSAGES_PER_STEP = 3
# What one PostgreSQL server on a mid-size managed instance commits with synchronous WAL
# flushes (group commit) before fsync latency dominates: a planning figure, not a measurement.
PG_FLUSHES_PER_S = 4_000
INDEX_OVERHEAD = 2.0  # row data × this ≈ what a large table and its indexes take on disk
STORAGE_TABLES = ("job", "job_dependency", "workflow_history", "gate", "ledger_event", "job_outbox")


@dataclass(frozen=True)
class Bench:
    steps_per_s: float
    processes: int
    threads: int
    commits_per_step: float
    flushes_per_step: float
    wal_kib_per_step: float

    @property
    def per_process(self) -> float:
        return self.steps_per_s / self.processes


def parse_bench(text: str) -> Bench:
    durable = re.search(
        r"= ([\d,.]+) steps/s\s+\[(\d+) processes × (\d+) threads", text
    ) or _missing("the 'durable: … steps/s [P processes × T threads' line")
    pg = re.search(
        r"postgres per step: ([\d.]+) WAL flushes .*?([\d.]+) KiB WAL, ([\d.]+) commits", text
    ) or _missing("the 'postgres per step:' line")
    return Bench(
        steps_per_s=float(durable.group(1).replace(",", "")),
        processes=int(durable.group(2)),
        threads=int(durable.group(3)),
        flushes_per_step=float(pg.group(1)),
        wal_kib_per_step=float(pg.group(2)),
        commits_per_step=float(pg.group(3)),
    )


def _missing(what: str) -> re.Match[str]:
    raise SystemExit(f"capacity: {what} is not in the bench output: run ops/bench/steps.py")


def bytes_per_step(url: str) -> float:
    """Row data per job across the tables a step writes (pg_column_size of each row; indexes
    and page overhead come on top, about as much again in a large table)."""
    import psycopg

    with psycopg.connect(url) as conn:
        total = sum(
            conn.execute(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t").fetchone()[
                0
            ]
            for table in STORAGE_TABLES
        )
        (jobs,) = conn.execute("SELECT count(*) FROM job").fetchone()
    if not jobs:
        raise SystemExit("capacity: the database at --pg-url has no jobs to measure")
    return INDEX_OVERHEAD * total / jobs


def report(bench: Bench, step_bytes: float | None, step_s: float, peak: float) -> None:
    print(
        f"measured: {bench.steps_per_s:,.0f} no-op steps/s on {bench.processes} processes × "
        f"{bench.threads} threads ({bench.per_process:,.0f}/s per process), "
        f"{bench.commits_per_step:.2f} commits, {bench.flushes_per_step:.2f} WAL flushes and "
        f"{bench.wal_kib_per_step:.1f} KiB WAL per step"
        + (f", {step_bytes / 1024:.1f} KiB stored per step" if step_bytes else "")
    )
    print(f"model: a step's handler runs {step_s:g} s; the peak hour is {peak:g}× the average\n")
    header = (
        f"{'steps/day':>10} {'avg/s':>7} {'peak/s':>7} {'slots':>6} {'processes':>9} "
        f"{'commits/s':>9} {'flushes/s':>9} {'msgs/s':>7} {'GiB/day':>8}  first limit"
    )
    print(header)
    for volume in VOLUMES:
        avg = volume / DAY_S
        rate = avg * peak
        slots = max(rate * step_s, 1.0)  # Little's law: steps in flight at the peak
        by_cpu = rate / bench.per_process  # processes the orchestration alone needs
        processes = max(slots / bench.threads, by_cpu, 1.0)
        flushes = rate * bench.flushes_per_step
        growth = "" if step_bytes is None else f"{volume * step_bytes / 2**30:8.2f}"
        print(
            f"{volume:>10,} {avg:7.2f} {rate:7.1f} {slots:6.0f} {processes:9.1f} "
            f"{rate * bench.commits_per_step:9.1f} {flushes:9.1f} "
            f"{rate * BROKER_MESSAGES_PER_STEP:7.1f} {growth:>8}  "
            f"{limit(bench, rate, slots, flushes)}"
        )


def limit(bench: Bench, rate: float, slots: float, flushes: float) -> str:
    """Which resource this volume exhausts first, as a share of what one unit gives."""
    shares = {
        "engine slots (worker threads)": slots / bench.threads,
        "orchestration CPU (worker processes)": rate / bench.per_process,
        "PostgreSQL WAL flushes (one primary)": flushes / PG_FLUSHES_PER_S,
    }
    name, share = max(shares.items(), key=lambda item: item[1])
    return f"{name}: {share:.2f} units"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", nargs="?", type=Path, help="steps.py output (default: stdin)")
    parser.add_argument("--pg-url", help="a vibey database that ran workflows (storage/step)")
    parser.add_argument("--step-kib", type=float, help="stored KiB per step (instead of --pg-url)")
    parser.add_argument("--step-seconds", type=float, default=120.0, help="handler time")
    parser.add_argument("--peak", type=float, default=10.0, help="peak hour ÷ daily average")
    args = parser.parse_args(argv)
    text = args.bench.read_text(encoding="utf-8") if args.bench else sys.stdin.read()
    step_bytes = bytes_per_step(args.pg_url) if args.pg_url else None
    if step_bytes is None and args.step_kib is not None:
        step_bytes = args.step_kib * 1024
    report(parse_bench(text), step_bytes, args.step_seconds, args.peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
