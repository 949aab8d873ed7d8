"""ops/bench/three_steps.py's side-by-side: each round's vibey/DBOS ratios and their medians."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops" / "bench"))
import three_steps

positive = st.floats(0.01, 1000, allow_nan=False, allow_infinity=False)


def test_a_rounds_ratios_divide_vibeys_figures_by_dbos():
    found = {"window": 5.0, "batched": (1.0, 4.0), "seen": [0.010, 0.020, 0.030]}
    dbos = {"throughput": 100.0, "p50": 0.010}
    got = three_steps.ratios(1000, found, dbos)
    assert (got.one_by_one, got.start_many, got.p50) == (2.0, 2.5, 2.0)
    assert str(got).startswith("throughput 2.00x (started one by one), 2.50x (start_many)")


@given(st.lists(st.tuples(positive, positive, positive), min_size=1, max_size=9))
def test_the_median_is_taken_figure_by_figure(rounds):
    got = three_steps.median([three_steps.Ratios(*r) for r in rounds])
    for field, values in zip(
        ("one_by_one", "start_many", "p50"), zip(*rounds, strict=True), strict=True
    ):
        assert getattr(got, field) == statistics.median(values)
    # one round's swing moves the median only as far as the middle round
    assert min(r[0] for r in rounds) <= got.one_by_one <= max(r[0] for r in rounds)


def test_rounds_default_to_one_and_are_read():
    assert three_steps.parse_args([]).rounds == 1
    assert three_steps.parse_args(["--rounds", "3"]).rounds == 3
