"""Benchmark: the CPU a workflow step costs each process, with nothing else running.

``--workflows`` three-step workflows (``bench_workflow.py``) are started first, through
``Client.start_many`` with no worker running, so their first pointers wait in the broker.
Then a fleet of ``--processes`` × ``--threads`` starts and drains them: no client competes
with it for the box's cores. Prints, per round, the drain's steps/s and the CPU each party
spent per step (the workers and their children, the processes of the PostgreSQL cluster
that serves VIBEY_TEST_PG_URL, the RabbitMQ node),
then the medians over ``--rounds``. A worker's start is in its figure (about 0.1 s of CPU,
under 3 % of a 1,000-workflow round).

This is the figure to compare two trees by (run them back to back, or interleaved:
``PYTHONPATH=<tree> .venv/bin/python <tree>/ops/bench/drain.py``): it does not move with the
client's pace, as ``three_steps.py``'s throughput does.

    .venv/bin/python ops/bench/drain.py [--workflows 1000] [--processes 1] [--threads 8]
        [--rounds 3] [--in-place-steps 16] [--spy FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_workflow  # noqa: E402
import psycopg  # noqa: E402
from steps import (  # noqa: E402
    cpu_sample,
    cpu_spent,
    declared_topology,
    postmaster_of,
    running_fleet,
    scratch_database,
)
from three_steps import bench_parts  # noqa: E402

from actors.in_place import DEFAULT_STEPS  # noqa: E402
from store.migrate import migrate  # noqa: E402
from vibey.client import Client  # noqa: E402

STEPS = len(bench_workflow.STEPS)
PARTIES = ("workers", "postgres", "rabbitmq")


def completed(pg_url: str, count: int, timeout: float) -> float:
    """Wait until ``count`` workflows completed; the seconds first → last step settled."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'), "
                "(SELECT extract(epoch FROM max(settled_at) - min(settled_at)) FROM job) "
                "FROM workflow"
            ).fetchone()
            assert row is not None
            if row[0] == count:
                return float(row[1])
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {row[0]} of {count} workflows completed")
            time.sleep(0.05)


def one_round(args: argparse.Namespace, admin: str, amqp: str) -> dict[str, float]:
    token = uuid.uuid4().hex[:8]
    with (
        scratch_database(admin, f"vibey_bench_drain_{token}") as pg_url,
        tempfile.TemporaryDirectory() as work,
    ):
        migrate(pg_url)
        config, settings, registry = bench_parts(
            pg_url, amqp, f"bdrn{token}", args.threads, args.in_place_steps, work
        )
        with declared_topology(config):
            with Client(settings, registry=registry, name="bench-drain") as client:
                for first in range(0, args.workflows, 500):
                    last = min(first + 500, args.workflows)
                    client.start_many(
                        [f"d{n:06d}" for n in range(first, last)], bench_workflow.NAME
                    )
            time.sleep(1)  # the client's relay has published (its drain on close)
            with running_fleet(config, args.processes, Path(work) / "fleet.log") as fleet:
                while len(fleet.pids) < args.processes:  # the supervisor forks them
                    time.sleep(0.01)
                postmaster = postmaster_of(pg_url)  # this cluster's processes alone
                before = cpu_sample(fleet.pids, postmaster)
                began = time.monotonic()
                spy = None
                if args.spy:
                    spy = subprocess.Popen(
                        [
                            "py-spy",
                            "record",
                            "--pid",
                            str(fleet.pids[0]),
                            "--rate",
                            "400",
                            "--format",
                            "raw",
                            "--output",
                            args.spy,
                            "--nonblocking",
                            "--threads",
                            "--gil",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                window = completed(pg_url, args.workflows, timeout=120 + args.workflows / 10)
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=30)
                wall = time.monotonic() - began
                spent = cpu_spent(before, cpu_sample(fleet.pids, postmaster))
    steps = args.workflows * STEPS
    found = {party: spent[party] * 1000 / steps for party in PARTIES}
    found["steps/s"] = steps / window
    found["wall"] = wall
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-place-steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument(
        "--spy",
        metavar="FILE",
        help="py-spy's samples of the first worker while it holds the GIL (its Python CPU), "
        "raw, to FILE (py-spy on PATH: pip install py-spy; not a dependency of vibey)",
    )
    args = parser.parse_args(argv)
    if args.spy and shutil.which("py-spy") is None:
        parser.error("--spy needs py-spy on PATH (pip install py-spy)")
    admin, amqp = os.environ.get("VIBEY_TEST_PG_URL"), os.environ.get("VIBEY_TEST_AMQP_URL")
    if not admin or not amqp:
        print("set VIBEY_TEST_PG_URL and VIBEY_TEST_AMQP_URL (see README)", file=sys.stderr)
        return 2
    rounds = []
    for n in range(args.rounds):
        found = one_round(args, admin, amqp)
        rounds.append(found)
        print(f"round {n + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in found.items()), flush=True)
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(
        f"median of {len(rounds)}: {medians['steps/s']:.0f} steps/s; CPU a step: "
        + ", ".join(f"{p} {medians[p]:.2f} ms" for p in PARTIES)
        + f" ({medians['workers'] + medians['postgres'] + medians['rabbitmq']:.2f} ms in all)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
