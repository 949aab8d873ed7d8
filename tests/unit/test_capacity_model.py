"""ops/bench/capacity.py reads steps.py's figures and sizes the fleet from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops" / "bench"))
import capacity

BENCH = (
    "durable: 1,000 no-op steps in 9.44 s (busy window: ...) = 1,060 steps/s  "
    "[2 processes × 8 threads, 100 chains × 10 steps]\n"
    "postgres per step: 1.50 WAL flushes (pg_stat_wal.wal_sync), 1.52 WAL writes, "
    "4.0 KiB WAL, 1.25 commits (xact_commit)\n"
)


def test_the_bench_figures_are_read():
    bench = capacity.parse_bench(BENCH)
    assert (bench.steps_per_s, bench.processes, bench.threads) == (1060.0, 2, 8)
    assert (bench.flushes_per_step, bench.wal_kib_per_step, bench.commits_per_step) == (
        1.5,
        4.0,
        1.25,
    )
    assert bench.per_process == 530.0


def test_output_without_the_figures_names_the_bench():
    with pytest.raises(SystemExit, match=r"run ops/bench/steps\.py"):
        capacity.parse_bench("nothing here")


def test_long_steps_are_bounded_by_slots_and_short_ones_by_cpu(capsys):
    bench = capacity.parse_bench(BENCH)
    capacity.report(bench, 8 * 1024, step_s=120, peak=10)
    long_run = capsys.readouterr().out.splitlines()
    million = next(line for line in long_run if line.strip().startswith("1,000,000"))
    assert "engine slots" in million and " 13889 " in million  # 115.7/s × 120 s in flight
    capacity.report(bench, None, step_s=0.001, peak=1000)
    short = capsys.readouterr().out.splitlines()
    assert "orchestration CPU" in next(x for x in short if x.strip().startswith("1,000,000"))
