"""A tiny workflow definition for the CLI tests: one step and two questions at the start.

``DEFINITIONS`` is what ``VIBEY_WORKFLOW_DEFINITIONS=tests.acceptance.tiny_definition:DEFINITIONS``
loads; ``DRIFTED`` is the same name and version deciding differently (a replay diverges).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from workflows.engine import (
    Command,
    Complete,
    Decision,
    Event,
    GateAnswered,
    OpenGate,
    ScheduleStep,
    Started,
    TransitionPhase,
)
from workflows.protocol.kinds import GATE_KINDS, STEP_KINDS

NAME = "tiny"
APPROVE = OpenGate(
    gate="approve",
    kind="approval",
    question="Ship the tiny thing?",
    answers=("yes", "no"),
    context={"why": "a test"},
)
RATING = OpenGate(
    gate="rating",
    kind="question",
    question="How good is it, 1 to 5?",
    schema={"type": "integer", "minimum": 1, "maximum": 5},
)


class Tiny:
    # The protocol's kinds, declared alike: a test may register both definitions.
    kinds = STEP_KINDS
    gates = GATE_KINDS
    first_phase = "intake"

    def __init__(self, *, drifted: bool = False) -> None:
        self._drifted = drifted

    @property
    def name(self) -> str:
        return NAME

    @property
    def version(self) -> int:
        return 1

    def initial(self) -> dict[str, Any]:
        return {"answers": {}}

    def decide(self, state: dict[str, Any], event: Event, now: datetime) -> Decision[Any]:
        commands: tuple[Command, ...] = ()
        if isinstance(event, Started):
            first = "first.v2" if self._drifted else "first"
            commands = (
                TransitionPhase("design", 0),
                ScheduleStep(step=first, kind="design.interview", subject="s1"),
                APPROVE,
                RATING,
            )
        elif isinstance(event, GateAnswered):
            state = {"answers": {**state["answers"], event.gate: event.answer}}
            if event.gate == "approve" and event.answer == "yes":
                commands = (
                    TransitionPhase("build", 0),
                    ScheduleStep(step="second", kind="design.spec", after=("first",)),
                )
            elif event.gate == "approve":
                commands = (Complete("declined"),)
        return Decision(state, commands)

    def encode_state(self, state: dict[str, Any]) -> Mapping[str, Any]:
        return state

    def decode_state(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return dict(data)

    def describe(self, state: dict[str, Any]) -> str:
        return f"tiny: answers so far {sorted(state['answers'])}"


DEFINITIONS = (Tiny(),)
DRIFTED = (Tiny(drifted=True),)
