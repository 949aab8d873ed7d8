"""A three-step workflow for ``ops/bench/three_steps.py``: one → two → three → completed.

Its own step kinds (``bench.one``, ``bench.two``, ``bench.three``, interactive lane) with no-op
:class:`~workflows.steps.Short` handlers, so each step is claimed, run and settled in one
transaction. A worker loads ``bench_workflow:DEFINITIONS`` and ``bench_workflow:HANDLERS``
(``ops/bench`` on its ``PYTHONPATH``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from workflows.engine import (
    Complete,
    Decision,
    Event,
    JsonObject,
    ScheduleStep,
    Started,
    StepSucceeded,
)
from workflows.gates import GateKinds
from workflows.kinds import StepKind, StepKinds
from workflows.queue import Job
from workflows.steps import Handlers, Short, Success

NAME = "bench-three"
STEPS = ("one", "two", "three")
KINDS = StepKinds(StepKind(f"bench.{step}") for step in STEPS)


@dataclass(frozen=True, slots=True)
class State:
    done: int = 0


class ThreeSteps:
    name = NAME
    version = 1
    kinds = KINDS
    gates = GateKinds()
    first_phase = "run"

    def initial(self) -> State:
        return State()

    def decide(self, state: State, event: Event, now: datetime) -> Decision[State]:
        match event:
            case Started():
                return Decision(state, (ScheduleStep(step=STEPS[0], kind=f"bench.{STEPS[0]}"),))
            case StepSucceeded(step=step) if step in STEPS:
                done = STEPS.index(step) + 1
                if done == len(STEPS):
                    return Decision(State(done), (Complete("done"),))
                following = STEPS[done]
                return Decision(
                    State(done), (ScheduleStep(step=following, kind=f"bench.{following}"),)
                )
        return Decision(state)

    def encode_state(self, state: State) -> JsonObject:
        return {"done": state.done}

    def decode_state(self, data: JsonObject) -> State:
        return State(int(data.get("done", 0)))

    def describe(self, state: State) -> str:
        return f"{state.done} of {len(STEPS)} steps done"


def noop(job: Job) -> Success:
    return Success()


DEFINITIONS = (ThreeSteps(),)
HANDLERS: Handlers = {f"bench.{step}": Short(noop) for step in STEPS}
