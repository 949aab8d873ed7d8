"""Fan-out / fan-in: N steps in parallel, then one that merges their results.

::

    Started(items=[…]) ─► fan.square × N (in parallel) ─► fan.merge(values) ─► Complete("merged")

The definition collects each ``fan.square`` result in its state as it arrives (in whatever
order the steps finish) and schedules ``fan.merge`` with all of them once the last is in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from workflows.dispatch import Lane
from workflows.engine import (
    Complete,
    Decision,
    Event,
    Fail,
    ScheduleStep,
    Started,
    StepFailed,
    StepSucceeded,
)
from workflows.gates import GateKinds
from workflows.kinds import StepKind, StepKinds
from workflows.queue import Job
from workflows.steps import Outcome, Success

SQUARE, MERGE = "fan.square", "fan.merge"
KINDS = StepKinds(
    [
        StepKind(SQUARE, lane=Lane.BUILD, result={"required": ["value"]}),
        StepKind(MERGE, result={"required": ["total"]}),
    ]
)


@dataclass(frozen=True, slots=True)
class Fan:
    count: int = 0
    values: tuple[tuple[str, int], ...] = ()  # (step, value) in arrival order
    total: int | None = None


class FanOut:
    name = "fanout"
    version = 1
    kinds = KINDS
    gates = GateKinds()
    first_phase = ""

    def initial(self) -> Fan:
        return Fan()

    def decide(self, state: Fan, event: Event, now: datetime) -> Decision[Fan]:
        match event:
            case Started(input=given) if state.count == 0:
                items = [int(x) for x in given["items"]]
                steps = tuple(
                    ScheduleStep(step=f"square.{i}", kind=SQUARE, input={"x": x})
                    for i, x in enumerate(items)
                )
                return Decision(Fan(count=len(items)), steps)
            case StepSucceeded(step=step, result=result) if step.startswith("square."):
                values = (*state.values, (step, int(result["value"])))
                more = replace(state, values=values)
                if len(values) < state.count:
                    return Decision(more)
                merge = ScheduleStep(
                    step="merge", kind=MERGE, input={"values": [v for _, v in sorted(values)]}
                )
                return Decision(more, (merge,))
            case StepSucceeded(step="merge", result=result):
                return Decision(replace(state, total=int(result["total"])), (Complete("merged"),))
            case StepFailed(step=step, detail=detail):
                return Decision(state, (Fail(f"{step}: {detail}"),))
        return Decision(state)

    def encode_state(self, state: Fan) -> dict[str, Any]:
        return {
            "count": state.count,
            "values": [list(v) for v in state.values],
            "total": state.total,
        }

    def decode_state(self, data: Mapping[str, Any]) -> Fan:
        values = tuple((str(s), int(v)) for s, v in data["values"])
        return Fan(count=data["count"], values=values, total=data["total"])

    def describe(self, state: Fan) -> str:
        if state.total is not None:
            return f"merged {state.count} values: total {state.total}"
        return f"{len(state.values)} of {state.count} squared"


FANOUT = FanOut()


def square(job: Job) -> Outcome:
    x = int(job.payload["input"]["x"])
    return Success({"value": x * x})


def merge(job: Job) -> Outcome:
    return Success({"total": sum(int(v) for v in job.payload["input"]["values"])})


HANDLERS = {SQUARE: square, MERGE: merge}
