"""The effort ladder (workflows/effort.py): base effort per phase, escalation after failures,
bounded ladders, and each engine's saturating projection onto its own flags."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.effort import (
    LADDERS,
    Attempt,
    Effort,
    EffortFlags,
    LadderExhausted,
    NoEngineWork,
    base_effort,
    effort_for,
    ladder,
    next_attempt,
)
from workflows.phases import Phase

ENGINE_PHASES = sorted(LADDERS)
phases = st.sampled_from(ENGINE_PHASES)
failures = st.integers(min_value=0, max_value=1_000)

# Seed 004, "Effort ladder".
SEED_BASE = {
    Phase.DESIGN: Effort.HIGH,
    Phase.VISUAL_DESIGN: Effort.HIGH,
    Phase.BUILD: Effort.LOW,
    Phase.REVIEW: Effort.HIGH,
    Phase.DEPLOY_DESIGN: Effort.HIGH,
    Phase.DEPLOY_EXECUTE: Effort.LOW,
    Phase.DEPLOY_REVIEW: Effort.HIGH,
}


def test_the_ladder_has_five_levels_in_order() -> None:
    assert [e.name for e in sorted(Effort)] == ["TRIVIAL", "LOW", "STANDARD", "HIGH", "MAX"]


def test_base_effort_per_phase_is_the_seeds() -> None:
    assert {p: base_effort(p) for p in ENGINE_PHASES} == SEED_BASE


@pytest.mark.parametrize("phase", [Phase.BUILD, Phase.DEPLOY_EXECUTE])
def test_autonomous_phases_escalate_low_standard_high(phase: Phase) -> None:
    assert [effort_for(phase, n) for n in range(5)] == [
        Effort.LOW,
        Effort.STANDARD,
        Effort.HIGH,
        Effort.HIGH,
        Effort.HIGH,
    ]


@pytest.mark.parametrize("phase", [p for p in ENGINE_PHASES if SEED_BASE[p] is Effort.HIGH])
def test_interactive_phases_stay_at_their_base(phase: Phase) -> None:
    assert {effort_for(phase, n) for n in range(6)} == {Effort.HIGH}


@pytest.mark.parametrize("phase", [Phase.INTAKE, Phase.DONE])
def test_phases_without_an_engine_have_no_effort(phase: Phase) -> None:
    with pytest.raises(NoEngineWork, match="runs no engine"):
        effort_for(phase, 0)


@given(phase=phases, n=failures)
def test_effort_is_monotone_in_failures(phase: Phase, n: int) -> None:
    assert effort_for(phase, n) <= effort_for(phase, n + 1)


@given(phase=phases, n=failures)
def test_effort_saturates_at_the_ladders_top_and_never_exceeds_max(phase: Phase, n: int) -> None:
    effort = effort_for(phase, n)
    assert base_effort(phase) <= effort <= ladder(phase)[-1] <= Effort.MAX
    if n >= len(ladder(phase)):
        assert effort == ladder(phase)[-1]


def test_negative_failures_are_refused() -> None:
    with pytest.raises(ValueError, match="count"):
        effort_for(Phase.BUILD, -1)


# -- bounded ladders -----------------------------------------------------------------------


def test_build_runs_its_ladder_then_parks() -> None:
    assert [next_attempt(Phase.BUILD, n) for n in range(4)] == [
        Attempt(Effort.LOW, granted=False),
        Attempt(Effort.STANDARD, granted=False),
        Attempt(Effort.HIGH, granted=False),
        LadderExhausted(failures=3, top=Effort.HIGH),
    ]


def test_granted_attempts_run_at_the_top_then_park_again() -> None:
    # A person granted two more attempts after the ladder ran out.
    assert [next_attempt(Phase.BUILD, n, granted=2) for n in range(3, 6)] == [
        Attempt(Effort.HIGH, granted=True),
        Attempt(Effort.HIGH, granted=True),
        LadderExhausted(failures=5, top=Effort.HIGH),
    ]


@given(phase=phases, n=failures, granted=st.integers(0, 50))
def test_a_ladder_never_loops_past_its_bound(phase: Phase, n: int, granted: int) -> None:
    step = next_attempt(phase, n, granted)
    bound = len(ladder(phase)) + granted
    assert isinstance(step, LadderExhausted) == (n >= bound)
    if isinstance(step, Attempt):
        assert step.effort == effort_for(phase, n)
        assert step.granted == (n >= len(ladder(phase)))


# -- projection onto native flags ----------------------------------------------------------

THREE_LEVELS = EffortFlags.of(
    {
        Effort.LOW: ("--effort", "low"),
        Effort.STANDARD: ("--effort", "medium"),
        Effort.HIGH: ("--effort", "high"),
    }
)


def test_three_native_levels_saturate_both_ways() -> None:
    assert [THREE_LEVELS.project(e) for e in Effort] == [
        ("--effort", "low"),
        ("--effort", "low"),
        ("--effort", "medium"),
        ("--effort", "high"),
        ("--effort", "high"),
    ]


def test_an_engine_without_effort_flags_gets_none() -> None:
    assert {EffortFlags().project(e) for e in Effort} == {()}
    assert EffortFlags().level(Effort.MAX) is None


def test_levels_must_be_distinct_and_ordered() -> None:
    with pytest.raises(ValueError, match="ladder order"):
        EffortFlags(((Effort.HIGH, ("-h",)), (Effort.LOW, ("-l",))))


native_maps = st.dictionaries(
    st.sampled_from(list(Effort)),
    st.tuples(st.text(alphabet="abcxyz-", min_size=1, max_size=6)),
    min_size=1,
)


@given(native=native_maps, effort=st.sampled_from(list(Effort)))
def test_projection_is_monotone_saturating_and_lands_on_a_native_level(
    native: dict[Effort, tuple[str]], effort: Effort
) -> None:
    flags = EffortFlags.of(native)
    level = flags.level(effort)
    assert level in native
    assert flags.project(effort) == native[level]
    top, bottom = max(native), min(native)
    if effort >= top:
        assert level == top  # saturates at the engine's top
    elif effort <= bottom:
        assert level == bottom
    else:
        assert level <= effort
    if effort < Effort.MAX:
        higher = flags.level(Effort(effort + 1))
        assert higher is not None and level <= higher
    if effort in native:
        assert level == effort
