"""Properties of the pure job domain (workflows/job.py) against seed 004's "Jobs" section."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import workflows.job as job_module
from workflows.job import (
    DEFAULT_BACKOFF,
    TERMINAL_STATES,
    TRANSITIONS,
    BackoffPolicy,
    FailureClass,
    JobState,
    LeasePolicy,
    UnknownJobKindError,
    backoff,
    can_transition,
    idempotency_key,
    jitter_fraction,
)
from workflows.phases import Phase
from workflows.protocol.kinds import STEP_KINDS

# The protocol declares its kinds (workflows/protocol/kinds.py); these views are what the old
# module-level tables were, so the seed's facts are checked against the declarations.
KIND_ALIASES = dict(STEP_KINDS.aliases)
KIND_PHASES = {k: Phase(v.phase) for k, v in STEP_KINDS.items() if v.phase is not None}
REGISTERED_KINDS = frozenset(KIND_PHASES) | frozenset(KIND_ALIASES)
canonical_kind = STEP_KINDS.canonical


def phase_of(kind: str) -> Phase:
    return KIND_PHASES[canonical_kind(kind)]


US = timedelta(microseconds=1)

# Seed 004, "Jobs": the kinds registered against handlers, grouped by phase (and the merge
# queue's build.resolve, issue 20).
SEED_KINDS_BY_PHASE: dict[Phase, tuple[str, ...]] = {
    Phase.DESIGN: ("design.interview", "design.research", "design.synthesize", "design.spec"),
    Phase.VISUAL_DESIGN: ("visual.inventory", "visual.plan"),
    Phase.BUILD: (
        "build.decompose",
        "build.implement",
        "build.verify",
        "build.integrate",
        "build.resolve",
    ),
    Phase.REVIEW: (
        "review.demo",
        "review.collect",
        "review.triage",
        "review.deployment_choice",
    ),
    Phase.DEPLOY_DESIGN: ("deploy.design", "deploy.interview", "deploy.synthesize", "deploy.spec"),
    Phase.DEPLOY_EXECUTE: ("deploy.execute",),
    Phase.DEPLOY_REVIEW: ("deploy.demo", "deploy.triage", "deploy.route"),
}
SEED_ALIASES: dict[str, str] = {
    "build.plan": "build.decompose",
    "deploy.accept": "deploy.spec",
    "deploy.graph": "deploy.execute",
}
SEED_CANONICAL: tuple[str, ...] = tuple(k for ks in SEED_KINDS_BY_PHASE.values() for k in ks)
SEED_PHASE_OF: dict[str, Phase] = {k: p for p, ks in SEED_KINDS_BY_PHASE.items() for k in ks}
SEED_ALL_NAMES: tuple[str, ...] = SEED_CANONICAL + tuple(SEED_ALIASES)

kinds = st.sampled_from(sorted(SEED_ALL_NAMES))
canonical_kinds = st.sampled_from(sorted(SEED_CANONICAL))


# --- JobState ----------------------------------------------------------------------------


def test_job_state_has_exactly_the_seven_seed_states() -> None:
    assert {s.value for s in JobState} == {
        "ready",
        "leased",
        "succeeded",
        "failed",
        "awaiting_human",
        "awaiting_capacity",
        "cancelled",
    }
    assert len(JobState) == 7


def test_terminal_states_are_succeeded_failed_cancelled() -> None:
    assert {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED} == TERMINAL_STATES
    for state in JobState:
        assert state.terminal == (state in TERMINAL_STATES)


def test_transitions_cover_every_state_and_only_states() -> None:
    assert set(TRANSITIONS) == set(JobState)
    for targets in TRANSITIONS.values():
        assert targets <= set(JobState)


def test_terminal_states_have_no_outgoing_transitions() -> None:
    for state in JobState:
        if state.terminal:
            assert TRANSITIONS[state] == frozenset()
        else:
            assert TRANSITIONS[state], f"{state} is not terminal yet has no way out"


def test_no_state_transitions_to_itself() -> None:
    for state in JobState:
        assert state not in TRANSITIONS[state]


def _reachable(start: JobState) -> set[JobState]:
    seen: set[JobState] = set()
    frontier = deque([start])
    while frontier:
        state = frontier.popleft()
        for target in TRANSITIONS[state]:
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    return seen


@pytest.mark.parametrize("state", [s for s in JobState if not s.terminal])
def test_every_non_terminal_state_can_reach_a_terminal_state(state: JobState) -> None:
    assert _reachable(state) & TERMINAL_STATES


def test_every_state_is_reachable_from_ready() -> None:
    assert _reachable(JobState.READY) | {JobState.READY} == set(JobState)


def test_leased_can_settle_into_each_outcome_the_seed_names() -> None:
    # ready → leased → succeeded | failed | awaiting_human | awaiting_capacity | cancelled.
    assert can_transition(JobState.READY, JobState.LEASED)
    for outcome in (
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.AWAITING_HUMAN,
        JobState.AWAITING_CAPACITY,
        JobState.CANCELLED,
    ):
        assert can_transition(JobState.LEASED, outcome)


@given(st.sampled_from(list(JobState)), st.sampled_from(list(JobState)))
def test_can_transition_agrees_with_the_table(source: JobState, target: JobState) -> None:
    assert can_transition(source, target) == (target in TRANSITIONS[source])


def test_only_awaiting_human_is_parked() -> None:
    assert [s for s in JobState if s.parked] == [JobState.AWAITING_HUMAN]


# --- FailureClass ------------------------------------------------------------------------


def test_failure_classes_are_exactly_the_seed_four() -> None:
    assert [f.value for f in FailureClass] == ["capacity", "engine", "work", "vibey"]


# --- Kinds -------------------------------------------------------------------------------


def test_registered_kinds_are_the_seed_25_names_and_build_resolve() -> None:
    assert len(SEED_CANONICAL) == 23
    assert len(SEED_ALIASES) == 3
    assert set(KIND_PHASES) == set(SEED_CANONICAL)
    assert dict(KIND_ALIASES) == SEED_ALIASES
    assert set(SEED_ALL_NAMES) == REGISTERED_KINDS
    assert len(REGISTERED_KINDS) == 26


@pytest.mark.parametrize(("alias", "target"), sorted(SEED_ALIASES.items()))
def test_alias_canonicalises_to_its_target(alias: str, target: str) -> None:
    assert canonical_kind(alias) == target
    assert phase_of(alias) is phase_of(target)


@given(canonical_kinds)
def test_canonical_kind_is_identity_on_canonical_names(kind: str) -> None:
    assert canonical_kind(kind) == kind


@given(kinds)
def test_canonical_kind_is_idempotent(kind: str) -> None:
    once = canonical_kind(kind)
    assert canonical_kind(once) == once
    assert once in KIND_PHASES


@given(st.text().filter(lambda s: s not in SEED_ALL_NAMES))
def test_any_unregistered_string_is_an_unknown_kind(kind: str) -> None:
    with pytest.raises(UnknownJobKindError) as raised:
        canonical_kind(kind)
    assert raised.value.kind == kind
    assert repr(kind) in str(raised.value)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(UnknownJobKindError):
        phase_of(kind)


@given(
    kinds,
    st.sampled_from(
        [
            str.upper,
            str.title,
            lambda k: f" {k}",
            lambda k: f"{k} ",
            lambda k: k.replace(".", "_"),
            lambda k: k.replace(".", ":"),
            lambda k: k + ".x",
            lambda k: k[:-1],
        ]
    ),
)
def test_near_misses_of_registered_kinds_are_unknown(
    kind: str, mangle: Callable[[str], str]
) -> None:
    mangled = mangle(kind)
    assume(mangled not in REGISTERED_KINDS)
    with pytest.raises(UnknownJobKindError):
        canonical_kind(mangled)


@given(kinds)
def test_phase_of_matches_the_seed_grouping(kind: str) -> None:
    assert phase_of(kind) is SEED_PHASE_OF[SEED_ALIASES.get(kind, kind)]


def test_no_kind_belongs_to_intake_or_done() -> None:
    assert {phase_of(k) for k in SEED_ALL_NAMES}.isdisjoint({Phase.INTAKE, Phase.DONE})


# --- idempotency_key ---------------------------------------------------------------------

HEX64 = re.compile(r"[0-9a-f]{64}")
# Text rich in the separators a naive "a:b:c" or "a|b" encoding would confuse.
tricky_text = st.text(alphabet=st.sampled_from(':|/,;"\\[]{} \n\x00ab1é'), max_size=8) | st.text()
cycles = st.integers(min_value=0, max_value=2**63)
key_parts = st.tuples(tricky_text, cycles, kinds, tricky_text)


@given(key_parts)
def test_idempotency_key_is_deterministic_64_lowercase_hex(
    parts: tuple[str, int, str, str],
) -> None:
    first = idempotency_key(*parts)
    assert first == idempotency_key(*parts)
    assert HEX64.fullmatch(first), first


@given(tricky_text, cycles, st.sampled_from(sorted(SEED_ALIASES)), tricky_text)
def test_alias_and_canonical_kind_share_a_key(
    project: str, cycle: int, alias: str, subject: str
) -> None:
    # A step is keyed under its canonical kind (the engine resolves the alias first).
    assert idempotency_key(project, cycle, canonical_kind(alias), subject) == idempotency_key(
        project, cycle, SEED_ALIASES[alias], subject
    )


@given(key_parts, key_parts)
def test_different_parts_give_different_keys(
    a: tuple[str, int, str, str], b: tuple[str, int, str, str]
) -> None:
    assume(a != b)
    assert idempotency_key(*a) != idempotency_key(*b)


@given(key_parts, st.integers(min_value=0, max_value=3), st.data())
def test_changing_any_one_part_changes_the_key(
    parts: tuple[str, int, str, str], index: int, data: st.DataObject
) -> None:
    project, cycle, kind, subject = parts
    if index == 0:
        project = data.draw(tricky_text.filter(lambda s: s != parts[0]))
    elif index == 1:
        cycle = data.draw(cycles.filter(lambda c: c != parts[1]))
    elif index == 2:
        kind = data.draw(kinds.filter(lambda k: k != parts[2]))
    else:
        subject = data.draw(tricky_text.filter(lambda s: s != parts[3]))
    assert idempotency_key(*parts) != idempotency_key(project, cycle, kind, subject)


SEPARATORS = [":", "|", "/", ",", " ", "\x00", "", '","', '", "', "\\"]


def _shifted_pair(
    sep: str, project: str, cycle: int, kind: str, subject: str, middle: str
) -> tuple[tuple[str, int, str, str], tuple[str, int, str, str]]:
    """Two tuples that move ``middle`` across the field boundary: under a naive
    ``sep.join(parts)`` encoding both flatten to the same text."""
    a = (project, cycle, kind, sep.join([middle, str(cycle), kind, subject]))
    b = (sep.join([project, str(cycle), kind, middle]), cycle, kind, subject)
    assert sep.join(map(str, a)) == sep.join(map(str, b))  # the trap is armed
    return a, b


@given(
    st.sampled_from(SEPARATORS) | st.text(max_size=3),
    tricky_text,
    cycles,
    canonical_kinds,
    tricky_text,
    tricky_text,
)
def test_moving_text_across_a_field_boundary_changes_the_key(
    sep: str, project: str, cycle: int, kind: str, subject: str, middle: str
) -> None:
    a, b = _shifted_pair(sep, project, cycle, kind, subject, middle)
    assert idempotency_key(*a) != idempotency_key(*b)


@pytest.mark.parametrize("sep", SEPARATORS)
def test_separator_collisions_do_not_happen(sep: str) -> None:
    a, b = _shifted_pair(sep, "p", 0, "build.implement", "s", "x")
    assert idempotency_key(*a) != idempotency_key(*b)


def test_digits_moving_between_project_and_cycle_change_the_key() -> None:
    assert idempotency_key("p1", 2, "build.verify", "s") != idempotency_key(
        "p", 12, "build.verify", "s"
    )


# --- backoff -----------------------------------------------------------------------------


@st.composite
def backoff_policies(draw: st.DrawFn) -> BackoffPolicy:
    base = draw(st.timedeltas(min_value=US, max_value=timedelta(days=30)))
    cap = draw(
        st.one_of(
            st.timedeltas(min_value=base, max_value=base * 2**12),
            st.timedeltas(min_value=base, max_value=timedelta.max),
            st.just(base),
            st.just(timedelta.max),
        )
    )
    jitter = draw(st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
    return BackoffPolicy(base=base, cap=cap, jitter=jitter)


policies = st.one_of(st.just(DEFAULT_BACKOFF), backoff_policies())
attempts = st.integers(min_value=1, max_value=200) | st.integers(min_value=1, max_value=10**6)
spreads = st.floats(min_value=0.0, max_value=1.0)


def _us(delta: timedelta) -> int:
    return delta // US


def _expected_raw_us(attempt: int, policy: BackoffPolicy) -> int:
    # cap < 2**67 microseconds, so an exponent of 100 is already capped.
    return min(_us(policy.base) << min(attempt - 1, 100), _us(policy.cap))


@given(st.integers(max_value=0), policies)
def test_backoff_rejects_attempts_below_one(attempt: int, policy: BackoffPolicy) -> None:
    with pytest.raises(ValueError, match="attempt"):
        backoff(attempt, policy)


@given(
    attempts,
    st.floats(allow_nan=True).filter(lambda f: not 0.0 <= f <= 1.0),
)
def test_backoff_rejects_spreads_outside_unit_interval(attempt: int, spread: float) -> None:
    with pytest.raises(ValueError, match="spread"):
        backoff(attempt, spread=spread)


@given(attempts, policies, spreads)
def test_backoff_never_exceeds_the_cap(attempt: int, policy: BackoffPolicy, spread: float) -> None:
    delay = backoff(attempt, policy, spread=spread)
    assert timedelta(0) <= delay <= policy.cap


@given(attempts, policies)
def test_backoff_without_spread_is_capped_exponential(attempt: int, policy: BackoffPolicy) -> None:
    assert _us(backoff(attempt, policy)) == _expected_raw_us(attempt, policy)


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [
        (1, timedelta(seconds=5)),
        (2, timedelta(seconds=10)),
        (3, timedelta(seconds=20)),
        (8, timedelta(seconds=640)),
        (9, timedelta(minutes=15)),
        (10**6, timedelta(minutes=15)),
        (10**18, timedelta(minutes=15)),
    ],
)
def test_default_backoff_examples(attempt: int, expected: timedelta) -> None:
    assert backoff(attempt) == expected


@given(attempts, attempts, policies, spreads)
def test_backoff_is_monotone_in_attempt(
    a: int, b: int, policy: BackoffPolicy, spread: float
) -> None:
    low, high = sorted((a, b))
    assert backoff(low, policy, spread=spread) <= backoff(high, policy, spread=spread)


@given(attempts, policies, spreads)
def test_backoff_spread_stays_within_the_jitter_range(
    attempt: int, policy: BackoffPolicy, spread: float
) -> None:
    raw = _expected_raw_us(attempt, policy)
    delay = _us(backoff(attempt, policy, spread=spread))
    assert delay <= raw
    # One microsecond of rounding slack, plus float precision for delays beyond 2**53 µs.
    slack = 1 + raw // 2**50
    assert delay >= (1.0 - policy.jitter) * raw - slack


@given(attempts, policies)
def test_full_spread_takes_off_the_whole_jitter(attempt: int, policy: BackoffPolicy) -> None:
    raw = _expected_raw_us(attempt, policy)
    delay = _us(backoff(attempt, policy, spread=1.0))
    assert abs(delay - (1.0 - policy.jitter) * raw) <= 1 + raw // 2**50


@pytest.mark.parametrize("attempt", [10**6, 10**9, 10**18])
def test_huge_attempts_do_not_overflow(attempt: int) -> None:
    for policy in (
        DEFAULT_BACKOFF,
        BackoffPolicy(base=US, cap=timedelta(days=365)),
        BackoffPolicy(base=timedelta.max, cap=timedelta.max, jitter=0.5),
    ):
        assert backoff(attempt, policy) == policy.cap
        assert backoff(attempt, policy, spread=1.0) <= policy.cap


@given(st.timedeltas(max_value=timedelta(0)))
def test_backoff_policy_rejects_non_positive_base(base: timedelta) -> None:
    with pytest.raises(ValueError, match="base"):
        BackoffPolicy(base=base, cap=timedelta(hours=1))


@given(st.timedeltas(min_value=2 * US, max_value=timedelta(days=1)), st.data())
def test_backoff_policy_rejects_cap_below_base(base: timedelta, data: st.DataObject) -> None:
    cap = data.draw(st.timedeltas(max_value=base - US))
    with pytest.raises(ValueError, match="cap"):
        BackoffPolicy(base=base, cap=cap)


@given(st.floats(allow_nan=True).filter(lambda f: not 0.0 <= f < 1.0))
def test_backoff_policy_rejects_jitter_outside_0_1(jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        BackoffPolicy(jitter=jitter)


# --- jitter_fraction ---------------------------------------------------------------------

jitter_parts = st.lists(st.one_of(st.integers(), st.text(), st.uuids()), max_size=4)


@given(jitter_parts)
def test_jitter_fraction_is_deterministic_and_in_unit_interval(parts: list[object]) -> None:
    value = jitter_fraction(*parts)
    assert value == jitter_fraction(*parts)
    assert 0.0 <= value < 1.0


def test_jitter_fraction_varies_with_its_parts() -> None:
    values = {jitter_fraction("job", attempt) for attempt in range(64)}
    assert len(values) == 64


@pytest.mark.parametrize("first_bytes", [b"\xff" * 8, b"\xff" * 7 + b"\xfe", b"\x00" * 8])
def test_jitter_fraction_stays_below_one_at_the_extremes(
    monkeypatch: pytest.MonkeyPatch, first_bytes: bytes
) -> None:
    # The largest 8-byte prefixes divided by 2**64 round to 1.0 in a float; the fraction must
    # still be < 1 (a preimage is out of reach, so the digest is stubbed).
    digest = SimpleNamespace(digest=lambda: first_bytes + b"\x00" * 24)
    monkeypatch.setattr(job_module, "hashlib", SimpleNamespace(sha256=lambda _data: digest))
    assert 0.0 <= jitter_fraction("any") < 1.0


# --- LeasePolicy -------------------------------------------------------------------------

TWO_HOURS = timedelta(hours=2)
FIFTEEN_MINUTES = timedelta(minutes=15)
TWO_MINUTES = timedelta(minutes=2)
SEED_DEFAULT_LEASES: dict[str, timedelta] = {
    name: {
        "build.implement": TWO_HOURS,
        "build.verify": TWO_HOURS,
        "build.resolve": TWO_HOURS,
        "build.decompose": FIFTEEN_MINUTES,
        "build.integrate": FIFTEEN_MINUTES,
    }.get(SEED_ALIASES.get(name, name), TWO_MINUTES)
    for name in SEED_ALL_NAMES
}
positive_durations = st.timedeltas(min_value=US, max_value=timedelta(days=7))


def declared(kind: str) -> timedelta:
    return STEP_KINDS.get_kind(kind).lease


def lease(policy: LeasePolicy, kind: str) -> timedelta:
    """The lease a job of ``kind`` gets: the policy's override, else the kind's declaration."""
    return policy.resolved(canonical_kind).lease_for(canonical_kind(kind), declared(kind))


@pytest.mark.parametrize("kind", sorted(SEED_ALL_NAMES))
def test_declared_lease_for_every_registered_name(kind: str) -> None:
    assert lease(LeasePolicy(), kind) == SEED_DEFAULT_LEASES[kind]


def test_declared_lease_examples_through_aliases() -> None:
    policy = LeasePolicy()
    assert lease(policy, "build.plan") == FIFTEEN_MINUTES
    assert lease(policy, "deploy.graph") == TWO_MINUTES
    assert lease(policy, "deploy.accept") == TWO_MINUTES
    assert policy.default == TWO_MINUTES
    assert policy.lease_for("orders.charge") == TWO_MINUTES  # declared by no one: the default


@st.composite
def overrides(draw: st.DrawFn) -> dict[str, timedelta]:
    """Leases for distinct canonical kinds, each keyed by the kind or one of its aliases."""
    chosen = draw(st.lists(canonical_kinds, unique=True, max_size=8))
    result: dict[str, timedelta] = {}
    for kind in chosen:
        names = [kind, *(a for a, t in SEED_ALIASES.items() if t == kind)]
        result[draw(st.sampled_from(names))] = draw(positive_durations)
    return result


@given(overrides())
def test_with_overrides_replaces_only_what_it_names(changes: dict[str, timedelta]) -> None:
    before = LeasePolicy()
    after = before.with_overrides(changes)
    named = {canonical_kind(k): v for k, v in changes.items()}
    for kind in SEED_ALL_NAMES:
        expected = named.get(canonical_kind(kind), lease(before, kind))
        assert lease(after, kind) == expected
    assert after.default == before.default
    # The original is untouched.
    for kind in SEED_ALL_NAMES:
        assert lease(before, kind) == SEED_DEFAULT_LEASES[kind]


@given(positive_durations, overrides())
def test_default_key_changes_only_the_default(
    default: timedelta, changes: dict[str, timedelta]
) -> None:
    base = LeasePolicy().with_overrides(changes)
    after = base.with_overrides({"default": default})
    assert after.default == default
    for kind in SEED_ALL_NAMES:
        assert lease(after, kind) == lease(base, kind)  # declared or overridden: not the default
    assert after.lease_for("orders.charge") == default


@given(st.sampled_from(sorted(SEED_ALIASES)), positive_durations)
def test_override_through_an_alias_lands_on_the_canonical_kind(
    alias: str, duration: timedelta
) -> None:
    policy = LeasePolicy().with_overrides({alias: duration}).resolved(canonical_kind)
    target = SEED_ALIASES[alias]
    assert policy.by_kind[target] == duration
    assert alias not in policy.by_kind
    assert lease(policy, target) == duration
    assert lease(policy, alias) == duration


@given(kinds, st.timedeltas(max_value=timedelta(0)))
def test_non_positive_leases_are_rejected(kind: str, duration: timedelta) -> None:
    with pytest.raises(ValueError, match="positive"):
        LeasePolicy().with_overrides({kind: duration})
    with pytest.raises(ValueError, match="positive"):
        LeasePolicy().with_overrides({"default": duration})
    with pytest.raises(ValueError, match="positive"):
        LeasePolicy(default=duration)
    with pytest.raises(ValueError, match="positive"):
        LeasePolicy(by_kind={kind: duration})


@given(st.text().filter(lambda s: s not in SEED_ALL_NAMES and s != "default"))
def test_overrides_of_undeclared_kinds_are_refused_when_resolved(kind: str) -> None:
    with pytest.raises(UnknownJobKindError):
        LeasePolicy().with_overrides({kind: TWO_MINUTES}).resolved(canonical_kind)


def test_lease_policy_does_not_share_the_callers_mapping() -> None:
    leases = {"build.verify": TWO_HOURS}
    policy = LeasePolicy(by_kind=leases)
    leases["build.verify"] = TWO_MINUTES
    assert policy.lease_for("build.verify") == TWO_HOURS
    with pytest.raises(TypeError):
        policy.by_kind["build.verify"] = TWO_MINUTES  # type: ignore[index]


def test_a_lease_policy_pickles_for_worker_processes() -> None:
    import pickle

    policy = LeasePolicy().with_overrides({"design.spec": timedelta(seconds=7)})
    assert pickle.loads(pickle.dumps(policy)) == policy
