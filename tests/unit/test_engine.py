"""The engine's strict codec (workflows/engine.py): every field of every event and command
round-trips, and every field refuses a value of the wrong type."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.engine import (
    CancelRequested,
    CodecError,
    Command,
    Complete,
    Event,
    Fail,
    GateAnswered,
    GateExpired,
    Header,
    OpenGate,
    ScheduleStep,
    Started,
    StartTimer,
    Status,
    StepFailed,
    StepSucceeded,
    TimerFired,
    TransitionPhase,
    decode_command,
    decode_commands,
    decode_event,
    encode_command,
    encode_commands,
    encode_event,
    engine_rule,
    follow,
)
from workflows.job import FailureClass

names = st.text(min_size=1, max_size=20)
kind_names = st.from_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z][a-z0-9_]{0,8}){0,2}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
durations = st.integers(0, 10**12).map(lambda us: timedelta(microseconds=us))
strings = st.lists(st.text(max_size=8), max_size=4).map(tuple)

events: st.SearchStrategy[Event] = st.one_of(
    st.builds(Started, input=objects),
    st.builds(StepSucceeded, step=names, result=objects),
    st.builds(
        StepFailed, step=names, failure_class=st.sampled_from(FailureClass), detail=st.text()
    ),
    st.builds(GateAnswered, gate=names, answer=st.text(), by=st.text()),
    st.builds(TimerFired, timer=names),
    st.builds(CancelRequested, by=st.text(), reason=st.text()),
    st.builds(GateExpired, gate=names),
)
commands: st.SearchStrategy[Command] = st.one_of(
    st.builds(
        ScheduleStep,
        step=names,
        kind=kind_names,
        subject=st.text(max_size=8),
        input=objects,
        after=strings,
        delay=durations,
        cycle=st.integers(0, 100),
        max_attempts=st.integers(1, 50),
    ),
    st.builds(
        OpenGate,
        gate=names,
        kind=st.text(max_size=8),
        question=st.text(),
        answers=strings,
        schema=objects,
        context=objects,
        evidence=objects,
        deadline=st.none() | durations.filter(bool),
        on_deadline=st.sampled_from(["escalate", "fail"]),
        default=st.none() | st.text(),
        reminders=st.lists(durations.filter(bool), max_size=3).map(tuple),
    ),
    st.builds(StartTimer, timer=names, delay=durations),
    st.builds(TransitionPhase, phase=st.text(max_size=8), cycle=st.integers(0, 100)),
    st.builds(Complete, mode=st.text(max_size=8)),
    st.builds(Fail, reason=st.text()),
)


@given(events)
def test_every_event_round_trips_through_json(event: Event) -> None:
    wire = json.loads(json.dumps(encode_event(event)))
    assert decode_event(wire) == event


@given(commands)
def test_every_command_round_trips_through_json(command: Command) -> None:
    wire = json.loads(json.dumps(encode_command(command)))
    assert decode_command(wire) == command


@given(st.lists(commands, max_size=5))
def test_command_lists_round_trip(listed: list[Command]) -> None:
    assert decode_commands(encode_commands(listed)) == tuple(listed)


# A value of the wrong type for each field annotation the codec knows.
WRONG: dict[str, list[Any]] = {
    "str": [1, None, ["x"], {"a": 1}, True],
    "int": ["1", 1.0, None, True],
    "JsonObject": ["x", [1], None, 3],
    "tuple[str, ...]": ["ab", [1], None, {"a": "b"}],
    "timedelta": [-1, 1.5, "1", None, True],
    "FailureClass": ["bogus", 1, None],
    "timedelta | None": [-1, 1.5, "1", True],
    "str | None": [1, ["x"], True],
    "tuple[timedelta, ...]": ["ab", [-1], None, ["1"]],
}
SAMPLES: list[Event | Command] = [
    Started({"a": 1}),
    StepSucceeded("s", {"r": 1}),
    StepFailed("s", FailureClass.WORK, "d"),
    GateAnswered("g", "yes", "me"),
    TimerFired("t"),
    CancelRequested("me", "why"),
    GateExpired("g"),
    ScheduleStep("s", "a.b", "subj", {"i": 1}, ("x",), timedelta(seconds=1), 2, 3),
    OpenGate("g", "k", "q?", ("a",), {"type": "string"}, {"c": 1}, {"e": 1}),
    OpenGate("g", "k", "q?", deadline=timedelta(seconds=2), default="a", reminders=(timedelta(1),)),
    StartTimer("t", timedelta(seconds=2)),
    TransitionPhase("p", 1),
    Complete("m"),
    Fail("r"),
]
FIELD_CASES = [
    (sample, field.name, bad)
    for sample in SAMPLES
    for field in dataclasses.fields(sample)
    for bad in WRONG[str(field.type)]
]


EVENT_TYPES = (
    Started,
    StepSucceeded,
    StepFailed,
    GateAnswered,
    TimerFired,
    CancelRequested,
    GateExpired,
)


def _encode(value: Any) -> dict[str, Any]:
    return encode_event(value) if isinstance(value, EVENT_TYPES) else encode_command(value)


def _decode(value: Any, data: Any) -> Any:
    return decode_event(data) if isinstance(value, EVENT_TYPES) else decode_command(data)


def test_every_field_type_of_every_event_and_command_is_covered() -> None:
    annotations = {str(f.type) for s in SAMPLES for f in dataclasses.fields(s)}
    assert annotations == set(WRONG)
    kinds = {type(s) for s in SAMPLES}
    assert len(kinds) == 13


@pytest.mark.parametrize(("sample", "name", "bad"), FIELD_CASES, ids=repr)
def test_each_field_refuses_a_value_of_the_wrong_type(sample: Any, name: str, bad: Any) -> None:
    data = _encode(sample)
    data[name] = bad
    with pytest.raises(CodecError) as raised:
        _decode(sample, data)
    assert data["type"] in str(raised.value)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: type(s).__name__)
def test_a_missing_or_an_extra_field_or_an_unknown_type_is_refused(sample: Any) -> None:
    data = _encode(sample)
    field = next(iter(f.name for f in dataclasses.fields(sample)))
    with pytest.raises(CodecError, match="missing"):
        _decode(sample, {k: v for k, v in data.items() if k != field})
    with pytest.raises(CodecError, match="unknown field"):
        _decode(sample, {**data, "surprise": 1})
    with pytest.raises(CodecError, match="unknown"):
        _decode(sample, {**data, "type": "nope"})
    with pytest.raises(CodecError):
        _decode(sample, [data])


def test_a_gate_recorded_before_deadlines_existed_decodes_and_encodes_the_same() -> None:
    recorded = {
        "type": "open_gate",
        "gate": "g",
        "kind": "k",
        "question": "q?",
        "answers": ["a"],
        "schema": {},
        "context": {},
        "evidence": {},
    }
    gate = decode_command(recorded)
    assert gate == OpenGate("g", "k", "q?", ("a",))
    assert encode_command(gate) == recorded  # the golden histories stay byte for byte


def test_a_gate_with_a_deadline_needs_its_default_and_a_known_action() -> None:
    with pytest.raises(ValueError, match="default"):
        OpenGate("g", "k", "q?", deadline=timedelta(seconds=2))
    with pytest.raises(ValueError, match="on_deadline"):
        OpenGate("g", "k", "q?", deadline=timedelta(seconds=2), on_deadline="shrug")
    expired = engine_rule(Header("p"), GateExpired("g"))
    assert expired is not None and expired.status is Status.FAILED
    assert expired.reason is not None and "deadline" in expired.reason


def test_a_schedule_step_refuses_a_malformed_kind_on_decode() -> None:
    data = encode_command(ScheduleStep("s", "a.b"))
    with pytest.raises(CodecError, match="not a kind name"):
        decode_command({**data, "kind": "Not A Kind"})


def test_the_engines_rules_cancel_and_absorb() -> None:
    running = Header("p")
    cancelled = engine_rule(running, CancelRequested("me", "why"))
    assert cancelled is not None and cancelled.status is Status.CANCELLED
    assert cancelled.reason == "cancelled by me: why"
    assert engine_rule(cancelled, Started()) == cancelled  # a finished workflow absorbs
    assert engine_rule(running, TimerFired("t")) is None
    done = follow(running, (TransitionPhase("q", 2), Complete("local")))
    assert (done.phase, done.cycle, done.status, done.completion_mode) == (
        "q",
        2,
        Status.COMPLETED,
        "local",
    )
    assert follow(running, (Fail("x"),)).status is Status.FAILED


def test_not_json_is_refused() -> None:
    with pytest.raises(CodecError, match="JSON"):
        encode_event(Started({"when": datetime(2026, 1, 1, tzinfo=UTC)}))
