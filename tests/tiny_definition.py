"""A small workflow definition for the engine's own tests: one step, one gate, one timer.

Started → step ``a`` (design.research) → gate ``g`` [yes, no, boom]
yes → timer ``t`` → Complete("local");  no → Fail;  boom → decide raises (while BROKEN)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from workflows.engine import (
    Complete,
    Decision,
    Event,
    Fail,
    GateAnswered,
    JsonObject,
    OpenGate,
    ScheduleStep,
    Started,
    StartTimer,
    StepFailed,
    StepSucceeded,
    TimerFired,
    TransitionPhase,
)
from workflows.protocol.kinds import GATE_KINDS, STEP_KINDS

BROKEN = {"on": True}  # tests flip it to "deploy a fix"


@dataclass(frozen=True, slots=True)
class TinyState:
    stage: str = "new"
    answers: tuple[str, ...] = ()


class Tiny:
    # The protocol's kinds, declared alike: a test may register both definitions.
    kinds = STEP_KINDS
    gates = GATE_KINDS
    first_phase = "intake"

    name = "tiny"

    def __init__(self, version: int = 1, *, gate_name: str = "g", chain: bool = False) -> None:
        self.version = version
        self._gate = gate_name
        self._chain = chain  # also schedule ``b`` after ``a`` (and ``c`` after ``b``)

    def initial(self) -> TinyState:
        return TinyState()

    def decide(self, state: TinyState, event: Event, now: datetime) -> Decision[TinyState]:
        match event:
            case Started():
                step = ScheduleStep(step="a", kind="design.research", input={"x": 1})
                more: tuple[ScheduleStep, ...] = ()
                if self._chain:
                    more = (
                        ScheduleStep(step="b", kind="design.synthesize", after=("a",)),
                        ScheduleStep(step="c", kind="design.spec", after=("b",)),
                    )
                phase = TransitionPhase("design", 0)
                return Decision(replace(state, stage="a"), (phase, step, *more))
            case StepSucceeded(step="a"):
                gate = OpenGate(self._gate, "approval", "Go on?", ("yes", "no", "boom"))
                return Decision(replace(state, stage="gate"), (gate,))
            case StepFailed(step="a"):
                return Decision(replace(state, stage="failed"), (Fail("step a failed"),))
            case GateAnswered(answer="boom") if BROKEN["on"]:
                raise RuntimeError("boom")
            case GateAnswered(answer="yes" | "boom" as answer):
                timer = StartTimer("t", timedelta(0))
                return Decision(
                    replace(state, stage="timer", answers=(*state.answers, answer)), (timer,)
                )
            case GateAnswered(answer="no"):
                return Decision(replace(state, stage="done"), (Fail("declined"),))
            case TimerFired(timer="t"):
                return Decision(replace(state, stage="done"), (Complete("local"),))
        return Decision(state)

    def encode_state(self, state: TinyState) -> JsonObject:
        return {"stage": state.stage, "answers": list(state.answers)}

    def decode_state(self, data: JsonObject) -> TinyState:
        return TinyState(stage=data["stage"], answers=tuple(data["answers"]))

    def describe(self, state: TinyState) -> str:
        return f"tiny at {state.stage}"


DEFINITIONS: tuple[Any, ...] = (Tiny(),)
