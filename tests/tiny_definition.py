"""Small workflow definitions for the engine's own tests.

``Tiny``: one step, one gate, one timer.
Started → step ``a`` (design.research) → gate ``g`` [yes, no, boom]
yes → timer ``t`` → Complete("local");  no → Fail;  boom → decide raises (while BROKEN)

``ThreeSteps``: three steps in a row and nothing else, for load and chaos tests.
Started → ``a`` (design.research) → ``b`` (design.synthesize) → ``c`` (design.spec) → Complete
(``THREE_STEP_HANDLERS`` succeed at once, so a worker fleet runs it with no engine).
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
from workflows.queue import Job
from workflows.steps import Outcome, Success

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


class ThreeSteps:
    kinds = STEP_KINDS
    gates = GATE_KINDS
    first_phase = "design"

    name = "three-steps"
    version = 1

    def initial(self) -> TinyState:
        return TinyState()

    def decide(self, state: TinyState, event: Event, now: datetime) -> Decision[TinyState]:
        match event:
            case Started():
                steps = (
                    ScheduleStep(step="a", kind="design.research"),
                    ScheduleStep(step="b", kind="design.synthesize", after=("a",)),
                    ScheduleStep(step="c", kind="design.spec", after=("b",)),
                )
                return Decision(replace(state, stage="a"), (TransitionPhase("design", 0), *steps))
            case StepSucceeded(step="a" | "b" as step):
                return Decision(replace(state, stage="b" if step == "a" else "c"))
            case StepSucceeded(step="c"):
                return Decision(replace(state, stage="done"), (Complete("local"),))
            case StepFailed(step=step):
                return Decision(replace(state, stage="failed"), (Fail(f"step {step} failed"),))
        return Decision(state)

    def encode_state(self, state: TinyState) -> JsonObject:
        return {"stage": state.stage, "answers": list(state.answers)}

    def decode_state(self, data: JsonObject) -> TinyState:
        return TinyState(stage=data["stage"], answers=tuple(data["answers"]))

    def describe(self, state: TinyState) -> str:
        return f"three-steps at {state.stage}"


class OneByOne(ThreeSteps):
    """The three steps of :class:`ThreeSteps`, each scheduled when the one before succeeded
    (no dependencies): a step's settle inserts the next job, dispatched at once."""

    name = "one-by-one"

    def decide(self, state: TinyState, event: Event, now: datetime) -> Decision[TinyState]:
        match event:
            case Started():
                first = ScheduleStep(step="a", kind="design.research")
                return Decision(replace(state, stage="a"), (TransitionPhase("design", 0), first))
            case StepSucceeded(step="a"):
                step = ScheduleStep(step="b", kind="design.synthesize")
                return Decision(replace(state, stage="b"), (step,))
            case StepSucceeded(step="b"):
                return Decision(
                    replace(state, stage="c"), (ScheduleStep(step="c", kind="design.spec"),)
                )
        return super().decide(state, event, now)


def _done(job: Job) -> Outcome:
    return Success({"step": job.step})


DEFINITIONS: tuple[Any, ...] = (Tiny(),)
THREE_STEPS: tuple[Any, ...] = (ThreeSteps(), OneByOne())
THREE_STEP_HANDLERS = {
    kind: _done for kind in ("design.research", "design.synthesize", "design.spec")
}
