"""One workflow of one long step, for the drain tests: ``drain.sleep`` sleeps
``VIBEY_TEST_STEP_SECONDS`` (``VIBEY_TEST_SHORT_STEP_SECONDS`` for a project whose id starts
with ``short``) after writing a line to ``started`` in the engines' workspace (so the test
knows when to send SIGTERM), then succeeds. Its lease is ``VIBEY_TEST_LEASE_SECONDS``.

``VIBEY_WORKFLOW_DEFINITIONS=tests.acceptance.drain_definition:DEFINITIONS`` and
``VIBEY_WORKER_HANDLERS=tests.acceptance.drain_definition:HANDLERS``."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from workflows.engine import (
    Complete,
    Decision,
    Event,
    Fail,
    JsonObject,
    ScheduleStep,
    Started,
    StepFailed,
    StepSucceeded,
)
from workflows.gates import ENGINE_GATES
from workflows.job import FailureClass
from workflows.kinds import StepKind, StepKinds
from workflows.queue import Job
from workflows.steps import Outcome, Success

NAME = "drain"
KIND = "drain.sleep"


def _seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


@dataclass(frozen=True, slots=True)
class DrainState:
    stage: str = "new"


class OneLongStep:
    kinds = StepKinds(
        [
            StepKind(
                KIND,
                lease=timedelta(seconds=_seconds("VIBEY_TEST_LEASE_SECONDS", 30)),
                max_attempts=5,
                failure_class=FailureClass.WORK,
            )
        ]
    )
    gates = ENGINE_GATES
    first_phase = "run"
    name = NAME
    version = 1

    def initial(self) -> DrainState:
        return DrainState()

    def decide(self, state: DrainState, event: Event, now: datetime) -> Decision[DrainState]:
        match event:
            case Started():
                return Decision(DrainState("running"), (ScheduleStep(step="a", kind=KIND),))
            case StepSucceeded(step="a"):
                return Decision(DrainState("done"), (Complete("slept"),))
            case StepFailed(step="a"):
                return Decision(DrainState("failed"), (Fail("the step failed"),))
        return Decision(state)

    def encode_state(self, state: DrainState) -> JsonObject:
        return {"stage": state.stage}

    def decode_state(self, data: JsonObject) -> DrainState:
        return DrainState(stage=data["stage"])

    def describe(self, state: DrainState) -> str:
        return f"drain at {state.stage}"


def _sleep(job: Job) -> Outcome:
    workspace = Path(os.environ["VIBEY_ENGINE_WORKSPACE"])
    with (workspace / "started").open("a", encoding="utf-8") as out:
        out.write(f"{job.id} {job.attempts} {time.time()}\n")
    short = job.project_id.startswith("short")  # a project named short* sleeps less
    time.sleep(
        _seconds("VIBEY_TEST_SHORT_STEP_SECONDS" if short else "VIBEY_TEST_STEP_SECONDS", 20)
    )
    with (workspace / "finished").open("a", encoding="utf-8") as out:
        out.write(f"{job.id} {job.attempts} {time.time()}\n")
    return Success({"slept": True})


DEFINITIONS: tuple[Any, ...] = (OneLongStep(),)
HANDLERS = {KIND: _sleep}
