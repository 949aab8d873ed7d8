"""The golden histories (tests/golden/*.json, written by tests/golden/record.py) replay through
``PROTOCOL`` unchanged: same commands at every event, same final state and header. A change
to the definition that breaks one needs a new definition version, not a re-recording."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.golden.record import SCENARIOS, encode_header, record
from workflows.engine import (
    Decision,
    Event,
    NonDeterminismError,
    OpenGate,
    Recorded,
    ScheduleStep,
    decode_commands,
    decode_event,
    replay,
)
from workflows.protocol import PROTOCOL, ProtocolDefinition, ProtocolState

GOLDEN = Path(__file__).parent.parent / "golden"
NAMES = sorted(path.stem for path in GOLDEN.glob("*.json"))


def load(name: str) -> tuple[dict[str, Any], list[Recorded]]:
    data = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    history = [
        Recorded(
            seq=entry["seq"],
            event=decode_event(entry["event"]),
            at=datetime.fromisoformat(entry["at"]),
            commands=decode_commands(entry["commands"]),
        )
        for entry in data["history"]
    ]
    return data, history


def first_seq(history: list[Recorded], match: Any) -> int:
    return next(e.seq for e in history if any(match(c) for c in e.commands or ()))


def test_every_scenario_has_a_golden_history() -> None:
    assert sorted(SCENARIOS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_a_golden_history_replays_unchanged(name: str) -> None:
    data, history = load(name)
    assert data["definition"] == {"name": PROTOCOL.name, "version": PROTOCOL.version}
    replayed = replay(PROTOCOL, history, upto=len(history))
    assert replayed.applied == len(history)
    assert encode_header(replayed.header) == data["final"]["header"]
    assert PROTOCOL.encode_state(replayed.state) == data["final"]["state"]
    assert PROTOCOL.decode_state(data["final"]["state"]) == replayed.state
    assert replayed.header.status.value == "completed"


@pytest.mark.parametrize("name", NAMES)
def test_recording_again_gives_the_same_history(name: str) -> None:
    """The scenarios are deterministic: the driver and definition agree with the files."""
    data, _ = load(name)
    assert json.loads(json.dumps(record(name, SCENARIOS[name]))) == data


class RenamedAcceptGate(ProtocolDefinition):
    """A definition that names the design approval gate differently."""

    def decide(self, state: ProtocolState, event: Event, now: datetime) -> Decision[ProtocolState]:
        decision = super().decide(state, event, now)
        commands = tuple(
            replace(c, gate=c.gate.replace("design.accept", "design.approve"))
            if isinstance(c, OpenGate)
            else c
            for c in decision.commands
        )
        return Decision(decision.state, commands)


class FewerVerifyAttempts(ProtocolDefinition):
    """A definition that gives build.verify one attempt fewer."""

    def decide(self, state: ProtocolState, event: Event, now: datetime) -> Decision[ProtocolState]:
        decision = super().decide(state, event, now)
        commands = tuple(
            replace(c, max_attempts=c.max_attempts - 1)
            if isinstance(c, ScheduleStep) and c.kind == "build.verify"
            else c
            for c in decision.commands
        )
        return Decision(decision.state, commands)


@pytest.mark.parametrize("name", NAMES)
def test_a_renamed_gate_diverges_where_the_gate_was_opened(name: str) -> None:
    _, history = load(name)
    seq = first_seq(history, lambda c: isinstance(c, OpenGate) and "design.accept" in c.gate)
    with pytest.raises(NonDeterminismError) as caught:
        replay(RenamedAcceptGate(), history, upto=len(history))
    assert caught.value.seq == seq
    assert "design.approve" in caught.value.detail
    assert replay(RenamedAcceptGate(), history, upto=seq - 1).applied == seq - 1


@pytest.mark.parametrize("name", NAMES)
def test_a_changed_step_diverges_where_it_was_scheduled(name: str) -> None:
    _, history = load(name)
    seq = first_seq(history, lambda c: isinstance(c, ScheduleStep) and c.kind == "build.verify")
    with pytest.raises(NonDeterminismError) as caught:
        replay(FewerVerifyAttempts(), history, upto=len(history))
    assert caught.value.seq == seq


def test_a_history_with_a_dropped_event_diverges() -> None:
    _, history = load("demo_local")
    shifted = [replace(e, seq=e.seq - 1) if e.seq > 3 else e for e in history if e.seq != 3]
    with pytest.raises(NonDeterminismError) as caught:
        replay(PROTOCOL, shifted, upto=len(shifted))
    assert caught.value.seq == 3
