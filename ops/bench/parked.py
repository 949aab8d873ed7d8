"""A workflow that parks at once, for ``ops/bench/inbox.py``: nothing runs until it is answered.

Started → gate ``go`` [yes] (no step, no message, no lease) → yes → step ``work``
(``parked.work``, its own kind) → Complete("local").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from workflows.engine import (
    Complete,
    Decision,
    Event,
    GateAnswered,
    JsonObject,
    OpenGate,
    ScheduleStep,
    Started,
    StepSucceeded,
)
from workflows.gates import GateKind, GateKinds
from workflows.kinds import StepKind, StepKinds

STEP_KIND = "parked.work"


@dataclass(frozen=True, slots=True)
class ParkedState:
    stage: str = "new"


class Parked:
    name = "parked"
    version = 1
    kinds = StepKinds([StepKind(STEP_KIND)])
    gates = GateKinds([GateKind("approval", answers=("yes",))])
    first_phase = "parked"

    def initial(self) -> ParkedState:
        return ParkedState()

    def decide(self, state: ParkedState, event: Event, now: datetime) -> Decision[ParkedState]:
        match event:
            case Started():
                gate = OpenGate("go", "approval", "Go on?", ("yes",))
                return Decision(ParkedState("parked"), (gate,))
            case GateAnswered():
                return Decision(ParkedState("working"), (ScheduleStep("work", STEP_KIND),))
            case StepSucceeded():
                return Decision(ParkedState("done"), (Complete("local"),))
        return Decision(state)

    def encode_state(self, state: ParkedState) -> JsonObject:
        return {"stage": state.stage}

    def decode_state(self, data: JsonObject) -> ParkedState:
        return ParkedState(data["stage"])

    def describe(self, state: ParkedState) -> str:
        return f"parked workflow at {state.stage}"


DEFINITIONS: tuple[Any, ...] = (Parked(),)
