"""Circuits (workflows/circuit.py): capacity opens at once, engine failures after three, work and
vibey failures never; probes follow schedule_probe; a capacity rejection outranks a completion
claim."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.capacity import (
    WINDOW_BACKOFF,
    AuthenticationFailed,
    Available,
    BackoffProbe,
    CreditsExhausted,
    DeadlineProbe,
    Exhausted,
    WindowExhausted,
)
from workflows.circuit import (
    ENGINE_FAILURE_THRESHOLD,
    NO_CLAIM,
    PROBE_IN_FLIGHT,
    AttemptFailed,
    CapacityRejected,
    Circuit,
    CircuitStatus,
    Completed,
    CompletionClaimed,
    Failed,
    Outcome,
    OutOfCapacity,
    Progress,
    StepEvent,
    Success,
    half_open,
    reauthenticated,
    record,
    settle_verdict,
)
from workflows.job import FailureClass

NOW = datetime(2026, 9, 15, 12, 0, tzinfo=UTC)

exhausted: st.SearchStrategy[Exhausted] = st.one_of(
    st.builds(
        WindowExhausted,
        resets_at=st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=6)).map(
            lambda d: NOW + d
        ),
        detail=st.just("429"),
    ),
    st.builds(CreditsExhausted, detail=st.just("spent")),
    st.builds(AuthenticationFailed, detail=st.just("401")),
)
outcomes: st.SearchStrategy[Outcome] = st.one_of(
    st.just(Success()),
    st.sampled_from(list(FailureClass)),
    st.builds(CapacityRejected, exhausted),
)
gaps = st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=2))
histories = st.lists(st.tuples(outcomes, gaps), max_size=40)


def run(history: list[tuple[Outcome, timedelta]]) -> list[Circuit]:
    """Every circuit a history passes through; before each outcome, a due probe half-opens."""
    circuit, now, seen = Circuit("claude"), NOW, []
    for outcome, gap in history:
        now += gap
        circuit = record(half_open(circuit, now), outcome, now)
        seen.append(circuit)
    return seen


def engine_failures(n: int) -> list[tuple[Outcome, timedelta]]:
    return [(FailureClass.ENGINE, timedelta(seconds=1))] * n


# -- what touches the circuit --------------------------------------------------------------


@given(history=histories, failure=st.sampled_from([FailureClass.WORK, FailureClass.VIBEY]))
def test_work_and_vibey_failures_never_touch_the_circuit(
    history: list[tuple[Outcome, timedelta]], failure: FailureClass
) -> None:
    for circuit in [Circuit("claude"), *run(history)]:
        assert record(circuit, failure, NOW + timedelta(days=1)) == circuit


@given(history=histories, state=exhausted)
def test_a_capacity_rejection_opens_the_circuit_at_once(
    history: list[tuple[Outcome, timedelta]], state: Exhausted
) -> None:
    later = NOW + timedelta(days=2)
    for circuit in [Circuit("claude"), *run(history)]:
        opened = record(circuit, CapacityRejected(state), later)
        assert opened.status is CircuitStatus.OPEN
        assert opened.capacity == state
        # Only a window that has already reset, the first since the circuit last closed
        # (a repeated one backs off), is due for its probe at once.
        already_reset = isinstance(state, WindowExhausted) and state.resets_at <= later
        already_reset = already_reset and opened.probes == 0
        assert opened.admits(later) == already_reset


def test_a_bare_capacity_failure_is_taken_as_credits_and_gets_no_deadline() -> None:
    opened = record(Circuit("claude"), FailureClass.CAPACITY, NOW)
    assert opened.is_open
    assert isinstance(opened.capacity, CreditsExhausted)
    assert isinstance(opened.probe, BackoffProbe)


def test_engine_failures_open_after_three_in_a_row() -> None:
    assert ENGINE_FAILURE_THRESHOLD == 3
    circuits = run(engine_failures(3))
    assert [c.status for c in circuits] == [
        CircuitStatus.CLOSED,
        CircuitStatus.CLOSED,
        CircuitStatus.OPEN,
    ]
    opened = circuits[-1]
    assert opened.capacity == Available()
    assert isinstance(opened.probe, BackoffProbe)
    assert opened.opened_at == NOW + timedelta(seconds=3)


@given(
    history=st.lists(
        st.sampled_from([Success(), FailureClass.ENGINE, FailureClass.WORK, FailureClass.VIBEY]),
        max_size=30,
    )
)
def test_opens_exactly_when_three_engine_failures_come_without_a_success_between(
    history: list[Outcome],
) -> None:
    circuits = run([(o, timedelta(seconds=1)) for o in history])
    streak, expect_open = 0, False
    for outcome, circuit in zip(history, circuits, strict=True):
        if outcome == Success():
            streak = 0
        elif outcome is FailureClass.ENGINE:
            streak += 1
        expect_open = expect_open or streak >= ENGINE_FAILURE_THRESHOLD
        assert circuit.is_open == expect_open  # seconds apart: no probe falls due


def test_a_success_while_open_does_not_close_it() -> None:
    opened = record(Circuit("claude"), CapacityRejected(CreditsExhausted()), NOW)
    assert record(opened, Success(), NOW + timedelta(seconds=1)) == opened


# -- probing -------------------------------------------------------------------------------


def test_a_window_is_probed_at_its_reset_then_closes_on_success() -> None:
    resets = NOW + timedelta(hours=1)
    opened = record(Circuit("claude"), CapacityRejected(WindowExhausted(resets)), NOW)
    assert opened.probe == DeadlineProbe(resets)
    assert half_open(opened, resets - timedelta(seconds=1)) == opened
    probing = half_open(opened, resets)
    assert probing.status is CircuitStatus.HALF_OPEN and probing.admits(resets)
    assert record(probing, Success(), resets) == Circuit("claude")


def test_failed_credit_probes_back_off_further_each_time() -> None:
    circuit, now, waits = (
        record(Circuit("claude"), CapacityRejected(CreditsExhausted()), NOW),
        NOW,
        [],
    )
    for _ in range(5):
        assert isinstance(circuit.probe, BackoffProbe)
        waits.append(circuit.probe.at - now)
        now = circuit.probe.at
        circuit = record(half_open(circuit, now), CapacityRejected(CreditsExhausted()), now)
    assert waits == [timedelta(minutes=m) for m in (1, 2, 4, 8, 16)]
    assert circuit.probes == 5 and circuit.opened_at == NOW


resets = st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=2))


def windows_met_by_their_probes(
    first: Circuit, start: datetime, resets_in: list[timedelta]
) -> tuple[Circuit, list[timedelta]]:
    """Each window's probe (at its due time) meets another window: how long each kept the
    circuit open."""
    circuit, now, open_for = first, start, []
    for reset in resets_in:
        circuit = record(
            half_open(circuit, now), CapacityRejected(WindowExhausted(now + reset)), now
        )
        assert circuit.probe is not None
        open_for.append(circuit.probe.at - now)
        now = circuit.probe.at
    return circuit, open_for


@given(reset=resets, n=st.integers(min_value=2, max_value=20))
def test_repeated_windows_keep_the_circuit_open_longer_each_time(reset: timedelta, n: int) -> None:
    _, open_for = windows_met_by_their_probes(Circuit("claude"), NOW, [reset] * n)
    assert open_for[0] == reset  # the first: the CLI's own reset
    assert open_for == sorted(open_for)  # monotone
    assert all(wait >= reset for wait in open_for)  # never before the stated reset
    assert all(wait <= max(reset, WINDOW_BACKOFF.cap) for wait in open_for)  # capped
    if reset < WINDOW_BACKOFF.base:
        assert open_for[1] > reset  # even a short stated reset backs off


@given(before=st.lists(resets, min_size=1, max_size=10), reset=resets)
def test_a_success_starts_the_back_off_over(before: list[timedelta], reset: timedelta) -> None:
    limited, _ = windows_met_by_their_probes(Circuit("claude"), NOW, before)
    assert limited.probe is not None
    at = limited.probe.at
    closed = record(half_open(limited, at), Success(), at)
    assert closed == Circuit("claude")
    again = record(closed, CapacityRejected(WindowExhausted(at + reset)), at)
    assert again.probe == DeadlineProbe(at + reset)


def test_a_probe_is_in_flight_from_its_start_until_its_outcome_or_the_longest_lease() -> None:
    opened = record(Circuit("claude"), CapacityRejected(WindowExhausted(NOW)), NOW)
    assert not opened.probing(NOW) and not Circuit("claude").probing(NOW)
    later = NOW + timedelta(hours=5)  # picked long after its probe fell due
    probing = half_open(opened, later)
    assert probing.probe == DeadlineProbe(later)
    assert probing.probing(later + PROBE_IN_FLIGHT - timedelta(seconds=1))
    assert not probing.probing(later + PROBE_IN_FLIGHT)  # its outcome never came back
    assert not record(probing, Success(), later).probing(later)


def test_a_half_open_engine_failure_reopens_at_once() -> None:
    opened = run(engine_failures(3))[-1]
    assert opened.probe is not None
    probing = half_open(opened, opened.probe.at)
    reopened = record(probing, FailureClass.ENGINE, opened.probe.at)
    assert reopened.is_open and reopened.probes == 1


def test_a_doctor_pass_makes_a_failed_login_due_for_its_probe_now() -> None:
    locked_out = record(Circuit("claude"), CapacityRejected(AuthenticationFailed("401")), NOW)
    later = NOW + timedelta(seconds=10)
    assert not locked_out.admits(later)
    due = reauthenticated(locked_out, later)
    assert due.admits(later) and due.is_open
    assert due.probe == BackoffProbe(later, 1)
    # Nothing else is changed by a doctor pass.
    credits = record(Circuit("claude"), CapacityRejected(CreditsExhausted()), NOW)
    for circuit in (Circuit("claude"), credits, due):
        assert reauthenticated(circuit, later) == circuit


@given(history=histories)
def test_credits_never_carry_a_deadline_probe(history: list[tuple[Outcome, timedelta]]) -> None:
    for circuit in run(history):
        if isinstance(circuit.capacity, CreditsExhausted):
            assert not isinstance(circuit.probe, DeadlineProbe)
        if isinstance(circuit.probe, DeadlineProbe):
            assert isinstance(circuit.capacity, WindowExhausted)
        assert (circuit.status is CircuitStatus.CLOSED) == (circuit.probe is None)


def test_a_circuit_cannot_be_built_with_credits_and_a_deadline() -> None:
    with pytest.raises(ValueError, match="only a rate-limit window"):
        Circuit(
            "claude",
            status=CircuitStatus.OPEN,
            capacity=CreditsExhausted(),
            opened_at=NOW,
            probe=DeadlineProbe(NOW),
        )
    with pytest.raises(ValueError, match="exactly when it is not closed"):
        Circuit("claude", probe=BackoffProbe(NOW, 1))


# -- a capacity rejection outranks a completion claim --------------------------------------

other_events: st.SearchStrategy[StepEvent] = st.one_of(
    st.builds(CompletionClaimed, st.just("done")),
    st.builds(AttemptFailed, st.sampled_from(list(FailureClass))),
    st.builds(Progress, st.sampled_from(["TurnCompleted", "ToolInvoked", "FileEdited"])),
)


@given(
    before=st.lists(other_events, max_size=8),
    after=st.lists(other_events, max_size=8),
    rejection=exhausted,
)
def test_a_capacity_rejection_is_never_settled_as_complete(
    before: list[StepEvent], after: list[StepEvent], rejection: Exhausted
) -> None:
    verdict = settle_verdict([*before, CapacityRejected(rejection), *after])
    assert isinstance(verdict, OutOfCapacity)
    assert not isinstance(verdict, Completed)


@given(
    events=st.lists(st.one_of(other_events, st.builds(CapacityRejected, exhausted)), max_size=12)
)
def test_credits_among_the_rejections_always_win(events: list[StepEvent]) -> None:
    verdict = settle_verdict([*events, CapacityRejected(CreditsExhausted("spent"))])
    assert isinstance(verdict, OutOfCapacity)
    assert isinstance(verdict.state, CreditsExhausted)


def test_a_deadline_is_kept_only_when_every_rejection_named_one() -> None:
    early, late = WindowExhausted(NOW), WindowExhausted(NOW + timedelta(hours=1))
    assert settle_verdict([CapacityRejected(late), CapacityRejected(early)]) == OutOfCapacity(late)
    mixed = [CapacityRejected(late), CapacityRejected(AuthenticationFailed("401"))]
    assert settle_verdict(mixed) == OutOfCapacity(AuthenticationFailed("401"))


@given(events=st.lists(other_events, max_size=12))
def test_without_a_rejection_a_failure_then_a_claim_decides(events: list[StepEvent]) -> None:
    verdict = settle_verdict(events)
    failures = [e for e in events if isinstance(e, AttemptFailed)]
    if failures:
        assert verdict == Failed(failures[0].failure_class, failures[0].detail)
    elif any(isinstance(e, CompletionClaimed) for e in events):
        assert verdict == Completed("done")
    else:
        assert verdict == Failed(FailureClass.ENGINE, NO_CLAIM)
