"""Rotation (workflows/rotation.py): eligibility, local preference, forced rotation, and the four
properties seed 004 names for smooth weighted round robin."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.phases import Phase
from workflows.rotation import (
    Boundary,
    Candidate,
    RotationPolicy,
    RotationState,
    Trigger,
    rotate,
    select,
)

NOW = datetime(2026, 9, 15, 12, 0, tzinfo=UTC)
FRESH = NOW - timedelta(hours=1)
BUILD = Boundary(Trigger.NEW_WORK_ITEM, Phase.BUILD)

engine_ids = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
weight_maps = st.dictionaries(engine_ids, st.integers(0, 12), min_size=1, max_size=6).filter(
    lambda ws: sum(ws.values()) > 0
)


def candidates_of(weights: dict[str, int]) -> list[Candidate]:
    return [Candidate(e, weight=w, authenticated_at=FRESH) for e, w in weights.items()]


def run(
    candidates: list[Candidate], n: int, state: RotationState | None = None
) -> tuple[list[str], RotationState]:
    state = state or RotationState()
    chosen: list[str] = []
    for _ in range(n):
        engine, state = select(candidates, state)
        assert engine is not None
        chosen.append(engine)
    return chosen, state


# -- the four properties -------------------------------------------------------------------


@given(weights=weight_maps, warmup=st.integers(0, 40))
def test_no_starvation(weights: dict[str, int], warmup: int) -> None:
    """Over sum(weight) consecutive selections, every candidate with weight > 0 is chosen."""
    candidates = candidates_of(weights)
    total = sum(weights.values())
    _, state = run(candidates, warmup)
    window, _ = run(candidates, total, state)
    assert {e for e, w in weights.items() if w > 0} <= set(window)
    assert not {e for e, w in weights.items() if w == 0} & set(window)


@given(weights=weight_maps, warmup=st.integers(0, 40))
def test_weight_fidelity_over_any_full_period(weights: dict[str, int], warmup: int) -> None:
    """Counts over any sum(weight) consecutive selections are within ±1 of the weights (SWRR
    gives them exactly)."""
    candidates = candidates_of(weights)
    _, state = run(candidates, warmup)
    window, _ = run(candidates, sum(weights.values()), state)
    counts = Counter(window)
    for engine, weight in weights.items():
        assert abs(counts[engine] - weight) <= 1
    assert counts == Counter({e: w for e, w in weights.items() if w > 0})


@given(weights=weight_maps)
def test_smoothness(weights: dict[str, int]) -> None:
    """Each choice goes to a candidate lagging furthest behind its share (n·w/W minus its count
    so far), ties to the smaller id: so none is chosen twice in a row while another has gone
    unselected longer in its own weighted time. Computed from the choices alone."""
    candidates = candidates_of(weights)
    total = sum(weights.values())
    chosen, _ = run(candidates, 2 * total)
    counts: Counter[str] = Counter()
    live = sorted(e for e, w in weights.items() if w > 0)
    for n, engine in enumerate(chosen, start=1):
        # Scaled by W to stay in integers: lag·W = n·w − W·count.
        lag = {e: n * weights[e] - total * counts[e] for e in live}
        most = max(lag.values())
        assert lag[engine] == most
        assert engine == min(e for e in live if lag[e] == most)
        counts[engine] += 1


@given(n=st.integers(2, 6), rounds=st.integers(1, 4))
def test_equal_weights_make_plain_round_robin(n: int, rounds: int) -> None:
    engines = [f"e{i}" for i in range(n)]
    chosen, _ = run(candidates_of(dict.fromkeys(engines, 3)), n * rounds)
    assert chosen == engines * rounds


@given(weights=weight_maps, warmup=st.integers(0, 30), data=st.data())
def test_determinism(weights: dict[str, int], warmup: int, data: st.DataObject) -> None:
    """The same candidates and state give the same choice and state, in any input order."""
    candidates = candidates_of(weights)
    _, state = run(candidates, warmup)
    shuffled = data.draw(st.permutations(candidates))
    assert select(candidates, state) == select(shuffled, state)
    assert select(candidates, state) == select(list(candidates), state)


def test_the_nginx_example() -> None:
    chosen, state = run(candidates_of({"a": 5, "b": 1, "c": 1}), 7)
    assert "".join(chosen) == "aabacaa"
    assert state == RotationState((("a", 0), ("b", 0), ("c", 0)))


@given(first=weight_maps, second=weight_maps, warmup=st.integers(1, 30))
def test_a_different_set_starts_from_zero(
    first: dict[str, int], second: dict[str, int], warmup: int
) -> None:
    _, state = run(candidates_of(first), warmup)
    after, _ = run(candidates_of(second), 5, state)
    fresh, _ = run(candidates_of(second), 5)
    live = {e for e, w in first.items() if w > 0}
    if live != {e for e, w in second.items() if w > 0}:
        assert after == fresh


def test_no_candidate_with_weight_selects_nothing() -> None:
    state = RotationState((("a", 0),))
    assert select([], state) == (None, state)
    assert select(candidates_of({"a": 0}), state) == (None, state)


def test_an_engine_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="listed twice: a"):
        select([Candidate("a"), Candidate("a")], RotationState())


# -- eligibility ---------------------------------------------------------------------------


def test_each_eligibility_rule_excludes_and_says_why() -> None:
    policy = RotationPolicy(
        doctor_ttl=timedelta(hours=24),
        allow_lists={Phase.BUILD: frozenset({"ok", "uninstalled", "stale", "open", "weak"})},
    )
    boundary = Boundary(Trigger.NEW_WORK_ITEM, Phase.BUILD, requires=frozenset({"git"}))
    git = frozenset({"git", "tools"})
    candidates = [
        Candidate("ok", authenticated_at=FRESH, capabilities=git),
        Candidate("uninstalled", installed=False, authenticated_at=FRESH, capabilities=git),
        Candidate("stale", authenticated_at=NOW - timedelta(hours=25), capabilities=git),
        Candidate("never", capabilities=git),
        Candidate("open", authenticated_at=FRESH, circuit_admits=False, capabilities=git),
        Candidate("weak", authenticated_at=FRESH, capabilities=frozenset({"tools"})),
        Candidate("elsewhere", authenticated_at=FRESH, capabilities=git),
    ]
    selection = rotate(candidates, RotationState(), boundary, policy, NOW)
    assert selection.engine_id == "ok"
    assert selection.considered == ("ok",)
    assert dict(selection.ineligible) == {
        "uninstalled": "not installed",
        "stale": "no doctor pass within the TTL",
        "never": "no doctor pass within the TTL",
        "open": "circuit open",
        "weak": "lacks git",
        "elsewhere": "not allowed in build",
    }


def test_a_phase_without_an_allow_list_allows_every_engine() -> None:
    policy = RotationPolicy(allow_lists={Phase.REVIEW: frozenset({"b"})})
    candidates = [Candidate("a", authenticated_at=FRESH), Candidate("b", authenticated_at=FRESH)]
    assert rotate(candidates, RotationState(), BUILD, policy, NOW).considered == ("a", "b")
    review = Boundary(Trigger.PHASE_TRANSITION, Phase.REVIEW)
    assert rotate(candidates, RotationState(), review, policy, NOW).considered == ("b",)


def test_the_doctor_ttl_boundary_is_inclusive() -> None:
    policy = RotationPolicy(doctor_ttl=timedelta(hours=2))
    at_edge = [Candidate("a", authenticated_at=NOW - timedelta(hours=2))]
    past = [Candidate("a", authenticated_at=NOW - timedelta(hours=2, microseconds=1))]
    assert rotate(at_edge, RotationState(), BUILD, policy, NOW).engine_id == "a"
    assert rotate(past, RotationState(), BUILD, policy, NOW).engine_id is None


@given(weights=weight_maps, data=st.data())
def test_forced_rotation_never_picks_the_rejecting_engine(
    weights: dict[str, int], data: st.DataObject
) -> None:
    rejecting = data.draw(st.sampled_from(sorted(weights)))
    boundary = Boundary(Trigger.CAPACITY_REJECTION, Phase.BUILD, rejected_by=rejecting)
    state = RotationState()
    for _ in range(2 * sum(weights.values())):
        selection = rotate(candidates_of(weights), state, boundary, RotationPolicy(), NOW)
        assert selection.engine_id != rejecting
        assert (rejecting, "rejected for capacity") in selection.ineligible
        state = selection.state


def test_only_a_capacity_rejection_names_the_rejecting_engine() -> None:
    with pytest.raises(ValueError, match="rejected_by"):
        Boundary(Trigger.CAPACITY_REJECTION, Phase.BUILD)
    with pytest.raises(ValueError, match="rejected_by"):
        Boundary(Trigger.OPERATOR_REQUEST, Phase.BUILD, rejected_by="a")


def test_triggers_are_the_five_boundaries() -> None:
    assert {t.value for t in Trigger} == {
        "new_work_item",
        "capacity_rejection",
        "effort_escalation",
        "phase_transition",
        "operator_request",
    }


# -- local engines -------------------------------------------------------------------------

LOCAL = [
    Candidate("claude", weight=3, authenticated_at=FRESH),
    Candidate("codex", weight=2, authenticated_at=FRESH),
    Candidate("gptossloop", weight=1, authenticated_at=FRESH, local=True),
    Candidate("qwenloop", weight=1, authenticated_at=FRESH, local=True),
]


def test_a_local_engine_switched_on_is_preferred_first() -> None:
    policy = RotationPolicy(local_on=frozenset({"gptossloop"}))
    selection = rotate(LOCAL, RotationState(), BUILD, policy, NOW)
    assert selection.considered == ("gptossloop",)
    assert selection.engine_id == "gptossloop"
    assert ("qwenloop", "local, switched off") in selection.ineligible


def test_local_engines_rotate_among_themselves_when_several_are_on() -> None:
    policy = RotationPolicy(local_on=frozenset({"gptossloop", "qwenloop"}))
    state, chosen = RotationState(), []
    for _ in range(4):
        selection = rotate(LOCAL, state, BUILD, policy, NOW)
        chosen.append(selection.engine_id)
        state = selection.state
    assert chosen == ["gptossloop", "qwenloop", "gptossloop", "qwenloop"]


def test_with_every_local_engine_off_or_ineligible_the_remote_ones_rotate() -> None:
    off = rotate(LOCAL, RotationState(), BUILD, RotationPolicy(), NOW)
    assert off.considered == ("claude", "codex")
    not_preferred = RotationPolicy(local_on=frozenset({"gptossloop"}), prefer_local=False)
    assert rotate(LOCAL, RotationState(), BUILD, not_preferred, NOW).considered == (
        "claude",
        "codex",
        "gptossloop",
    )
    forced = Boundary(Trigger.CAPACITY_REJECTION, Phase.BUILD, rejected_by="gptossloop")
    on = RotationPolicy(local_on=frozenset({"gptossloop"}))
    assert rotate(LOCAL, RotationState(), forced, on, NOW).considered == ("claude", "codex")


# -- no step joins a probe in flight -------------------------------------------------------

health_maps = st.dictionaries(
    engine_ids, st.tuples(st.integers(0, 12), st.booleans()), min_size=1, max_size=6
)


def with_probes(healths: dict[str, tuple[int, bool]]) -> list[Candidate]:
    """Eligible candidates (a half-open circuit admits work), probing or not."""
    return [
        Candidate(e, weight=w, authenticated_at=FRESH, probing=probing)
        for e, (w, probing) in healths.items()
    ]


@given(healths=health_maps, n=st.integers(1, 30))
def test_a_step_prefers_an_engine_whose_circuit_is_not_half_open(
    healths: dict[str, tuple[int, bool]], n: int
) -> None:
    """While any eligible engine with weight is not being probed, no half-open one is picked;
    with none, the half-open ones rotate as before."""
    candidates = with_probes(healths)
    settled = {e for e, (w, probing) in healths.items() if not probing and w > 0}
    state, chosen = RotationState(), []
    for _ in range(n):
        selection = rotate(candidates, state, BUILD, RotationPolicy(), NOW)
        state = selection.state
        chosen.append(selection.engine_id)
        if settled:
            assert set(selection.considered) == settled
    if settled:
        assert set(chosen) <= settled
    elif any(w > 0 for w, _ in healths.values()):
        assert None not in chosen


@given(weights=weight_maps, probing=st.sets(engine_ids, max_size=3))
def test_the_round_robin_keeps_its_weights_over_the_engines_not_probed(
    weights: dict[str, int], probing: set[str]
) -> None:
    """SWRR's weight fidelity holds over the engines not being probed, whatever half-open
    ones stand by."""
    settled = {e: w for e, w in weights.items() if e not in probing}
    if not any(settled.values()):
        return
    extra = [Candidate(e, weight=3, authenticated_at=FRESH, probing=True) for e in probing]
    candidates = [*candidates_of(settled), *extra]
    state, chosen = RotationState(), []
    for _ in range(sum(settled.values())):
        selection = rotate(candidates, state, BUILD, RotationPolicy(), NOW)
        state = selection.state
        chosen.append(selection.engine_id)
    assert Counter(chosen) == Counter({e: w for e, w in settled.items() if w > 0})


def test_a_half_open_engine_takes_a_step_only_when_no_other_is_eligible() -> None:
    limited = Candidate("claude", weight=3, authenticated_at=FRESH, probing=True)
    healthy = Candidate("codex", weight=1, authenticated_at=FRESH)
    both = [limited, healthy]
    assert rotate(both, RotationState(), BUILD, RotationPolicy(), NOW).engine_id == "codex"
    forced = Boundary(Trigger.CAPACITY_REJECTION, Phase.BUILD, rejected_by="codex")
    assert rotate(both, RotationState(), forced, RotationPolicy(), NOW).engine_id == "claude"


def test_a_remote_engine_goes_before_a_half_open_local_one() -> None:
    local = Candidate("gptossloop", 1, authenticated_at=FRESH, local=True, probing=True)
    remote = Candidate("codex", weight=1, authenticated_at=FRESH)
    policy = RotationPolicy(local_on=frozenset({"gptossloop"}))
    assert rotate([local, remote], RotationState(), BUILD, policy, NOW).considered == ("codex",)
