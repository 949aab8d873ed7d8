"""Capacity states (workflows/capacity.py): credits never have a reset time, at every layer the
pure code holds (the type, probe scheduling, the codec)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.capacity import (
    PROBE_BACKOFF,
    WINDOW_BACKOFF,
    AuthenticationFailed,
    Available,
    BackoffProbe,
    CapacityCodecError,
    CapacityKind,
    CapacityState,
    CreditsExhausted,
    DeadlineProbe,
    WindowExhausted,
    decode_state,
    encode_state,
    from_columns,
    rejection_from_payload,
    resets_at_of,
    schedule_probe,
)

NOW = datetime(2026, 9, 15, 12, 0, tzinfo=UTC)

aware = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7)), timezone(timedelta(hours=9))]),
)
details = st.text(max_size=30)
states: st.SearchStrategy[CapacityState] = st.one_of(
    st.just(Available()),
    st.builds(WindowExhausted, resets_at=aware, detail=details),
    st.builds(CreditsExhausted, detail=details),
    st.builds(AuthenticationFailed, detail=details),
)
attempts = st.integers(min_value=1, max_value=10_000)


# -- layer 1: the type ---------------------------------------------------------------------


def test_credits_exhausted_has_no_resets_at_field_and_none_can_be_set() -> None:
    assert [f.name for f in dataclasses.fields(CreditsExhausted)] == ["detail"]
    with pytest.raises(TypeError):
        CreditsExhausted(resets_at=NOW)  # type: ignore[call-arg]
    credits = CreditsExhausted("out of credits")
    assert not hasattr(credits, "resets_at")
    assert not hasattr(credits, "__dict__")  # slots: no attribute can be added
    with pytest.raises((AttributeError, TypeError)):
        object.__setattr__(credits, "resets_at", NOW)
    with pytest.raises(TypeError):
        dataclasses.replace(credits, resets_at=NOW)  # type: ignore[call-arg]
    assert resets_at_of(credits) is None


def test_a_window_needs_an_aware_reset_time() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        WindowExhausted(resets_at=datetime(2026, 1, 1))
    assert resets_at_of(WindowExhausted(NOW)) == NOW


def test_kinds_are_the_four_stored_names() -> None:
    assert [k.value for k in CapacityKind] == [
        "Available",
        "WindowExhausted",
        "CreditsExhausted",
        "AuthenticationFailed",
    ]
    assert Available().kind is CapacityKind.AVAILABLE
    assert CreditsExhausted().kind is CapacityKind.CREDITS_EXHAUSTED


# -- layer 2: probe scheduling -------------------------------------------------------------


@given(
    detail=details,
    now=aware,
    attempt=attempts,
)
def test_credits_only_ever_get_a_backoff_probe(detail: str, now: datetime, attempt: int) -> None:
    probe = schedule_probe(CreditsExhausted(detail), now, attempt)
    assert isinstance(probe, BackoffProbe)
    assert not isinstance(probe, DeadlineProbe)
    assert probe.attempt == attempt
    assert now < probe.at <= now + PROBE_BACKOFF.cap


@given(state=states, now=aware, attempt=attempts)
def test_only_a_window_yields_a_deadline_probe(
    state: CapacityState, now: datetime, attempt: int
) -> None:
    probe = schedule_probe(state, now, attempt)
    if isinstance(state, WindowExhausted):
        assert isinstance(probe, DeadlineProbe) and probe.at >= max(state.resets_at, now)
    else:
        assert isinstance(probe, BackoffProbe)


@given(state=st.builds(WindowExhausted, resets_at=aware, detail=details), now=aware)
def test_a_first_window_is_probed_at_its_reset_exactly(
    state: WindowExhausted, now: datetime
) -> None:
    assert schedule_probe(state, now, 1) == DeadlineProbe(at=max(state.resets_at, now))


# -- repeated windows back off -------------------------------------------------------------


@given(
    resets_in=st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=6)),
    attempt=attempts,
)
def test_a_repeated_window_backs_off_monotonically(resets_in: timedelta, attempt: int) -> None:
    """Each window the probe of the last one met again waits at least as long as the one
    before it, and never less than the reset its CLI named."""
    window = WindowExhausted(NOW + resets_in)
    this, following = (schedule_probe(window, NOW, n).at for n in (attempt, attempt + 1))
    assert NOW + resets_in <= this <= following


@given(
    resets_in=st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=6)),
    attempt=attempts,
)
def test_a_repeated_window_backoff_is_capped(resets_in: timedelta, attempt: int) -> None:
    """Never later than the cap, unless the CLI itself named a later reset."""
    probe = schedule_probe(WindowExhausted(NOW + resets_in), NOW, attempt)
    assert probe.at <= NOW + max(resets_in, WINDOW_BACKOFF.cap)


def test_a_short_reset_met_again_and_again_is_left_alone_longer_each_time() -> None:
    """A 4 s window (a per-minute limit): 4 s, then 30 s, 1, 2, 4 … minutes, at most 30."""
    window = WindowExhausted(NOW + timedelta(seconds=4))
    waits = [schedule_probe(window, NOW, n).at - NOW for n in range(1, 10)]
    seconds = [4, 30, 60, 120, 240, 480, 960, 1800, 1800]
    assert waits == [timedelta(seconds=s) for s in seconds]


@given(resets_in=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=7)))
def test_a_window_is_probed_at_its_reset(resets_in: timedelta) -> None:
    assert schedule_probe(WindowExhausted(NOW + resets_in), NOW, 1) == DeadlineProbe(
        NOW + resets_in
    )


def test_a_window_already_reset_is_probed_now() -> None:
    assert schedule_probe(WindowExhausted(NOW - timedelta(hours=1)), NOW, 1) == DeadlineProbe(NOW)


@given(state=st.sampled_from([CreditsExhausted(), AuthenticationFailed(), Available()]))
def test_backoff_probes_grow_then_cap(state: CapacityState) -> None:
    gaps = [schedule_probe(state, NOW, n).at - NOW for n in range(1, 12)]
    assert gaps[:4] == [timedelta(minutes=m) for m in (1, 2, 4, 8)]
    assert gaps == sorted(gaps)
    assert gaps[-1] == timedelta(hours=1)


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        schedule_probe(CreditsExhausted(), NOW, 0)


# -- the codec -----------------------------------------------------------------------------


@given(state=states)
def test_codec_round_trips_through_json_text(state: CapacityState) -> None:
    encoded = encode_state(state)
    assert decode_state(json.loads(json.dumps(encoded))) == state


@given(detail=details)
def test_no_resets_at_key_survives_encoding_credits(detail: str) -> None:
    encoded = encode_state(CreditsExhausted(detail))
    assert "resets_at" not in encoded
    assert encoded == {"state": "CreditsExhausted", "detail": detail}


@given(state=states)
def test_only_a_window_encodes_a_resets_at(state: CapacityState) -> None:
    assert ("resets_at" in encode_state(state)) == isinstance(state, WindowExhausted)


@given(
    detail=details,
    resets_at=st.one_of(st.none(), aware.map(lambda d: d.isoformat()), st.integers(), st.text()),
)
def test_decoding_credits_with_a_resets_at_raises(detail: str, resets_at: object) -> None:
    with pytest.raises(CapacityCodecError, match="CreditsExhausted has no resets_at"):
        decode_state({"state": "CreditsExhausted", "detail": detail, "resets_at": resets_at})


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"state": "Exhausted"},
        {"state": None},
        {"state": "Available", "detail": ""},
        {"state": "Available", "resets_at": "2026-01-01T00:00:00+00:00"},
        {"state": "WindowExhausted", "detail": ""},
        {"state": "WindowExhausted", "detail": "", "resets_at": "2026-01-01T00:00:00"},
        {"state": "WindowExhausted", "detail": "", "resets_at": "tomorrow"},
        {"state": "WindowExhausted", "detail": "", "resets_at": 1767225600},
        {"state": "CreditsExhausted"},
        {"state": "CreditsExhausted", "detail": 3},
        {"state": "AuthenticationFailed", "detail": "", "resets_at": "2026-01-01T00:00:00+00:00"},
        {"state": "AuthenticationFailed", "detail": "", "extra": 1},
    ],
)
def test_decoding_is_strict(data: dict[str, object]) -> None:
    with pytest.raises(CapacityCodecError):
        decode_state(data)


def test_from_columns_reads_table_rows_by_the_same_rules() -> None:
    assert from_columns("Available", None, "") == Available()
    assert from_columns("WindowExhausted", NOW, "429") == WindowExhausted(NOW, "429")
    assert from_columns("CreditsExhausted", None, "spent") == CreditsExhausted("spent")
    with pytest.raises(CapacityCodecError, match="CreditsExhausted has no resets_at"):
        from_columns("CreditsExhausted", NOW, "spent")
    with pytest.raises(CapacityCodecError, match="missing keys"):
        from_columns("WindowExhausted", None, "")


@given(state=states.filter(lambda s: not isinstance(s, Available)))
def test_a_rejection_payload_reads_back_its_state(state: CapacityState) -> None:
    payload = {**encode_state(state), "engine": "claude"}
    assert rejection_from_payload(payload) == state


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"state": "Available"},
        {"state": "WindowExhausted", "detail": "429"},
        {"state": "CreditsExhausted", "detail": "", "resets_at": "2026-01-01T00:00:00+00:00"},
        {"state": "RateLimited"},
    ],
)
def test_an_unreadable_rejection_is_still_a_rejection_and_never_a_deadline(
    payload: dict[str, object],
) -> None:
    assert isinstance(rejection_from_payload(payload), CreditsExhausted)
