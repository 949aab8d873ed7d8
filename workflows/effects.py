"""What a decision implies, as values: the store only writes them.

:func:`effects` turns a decision's commands into the rows the store writes in the event's
transaction — the jobs to enqueue (with the lane-independent facts their kinds declare), the
gates to open, and the wind-down of a workflow that just finished (cancel its unfinished steps
unless it completed; close its open gates). :func:`settled_event` is the event a step's settle
records, with the dependents a step that failed for good cancels. :func:`blocked` is the one
way a workflow blocks — a raising or drifted definition, a replay divergence found by verify,
an event that fails again on retry — and :func:`unblocked` the way back.

Nothing here reads a clock or makes an id: the store passes ``nonce`` where a name must be new.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from workflows.engine import (
    Command,
    Event,
    Header,
    OpenGate,
    ScheduleStep,
    StartTimer,
    Status,
    StepFailed,
    StepSucceeded,
    TimerFired,
)
from workflows.gates import RETRY_OR_CANCEL, WORKFLOW_ERROR
from workflows.job import TIMER_KIND, FailureClass, JobState
from workflows.kinds import DEFAULT_MAX_ATTEMPTS, StepKinds

ERROR_LIMIT = 2000
JsonObject = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class StepToRun:
    """A job for one step (or timer) of a workflow. ``after`` names the steps it waits on."""

    name: str
    kind: str
    subject: str
    cycle: int
    payload: JsonObject
    delay: timedelta = timedelta(0)
    after: tuple[str, ...] = ()
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    lease: timedelta | None = None


@dataclass(frozen=True, slots=True)
class WindDown:
    """A workflow that just finished: ``cancel_steps`` (unless it completed) and close its open
    gates with ``closing`` as their answer."""

    cancel_steps: bool
    why: str

    @property
    def closing(self) -> str:
        return f"(closed: {self.why})"


@dataclass(frozen=True, slots=True)
class Effects:
    steps: tuple[StepToRun, ...] = ()
    gates: tuple[OpenGate, ...] = ()
    wind_down: WindDown | None = None


def step_name(command: ScheduleStep | StartTimer) -> str:
    return command.step if isinstance(command, ScheduleStep) else f"timer:{command.timer}"


def effects(
    workflow_id: str,
    before: Header,
    after: Header,
    commands: Iterable[Command],
    kinds: StepKinds,
) -> Effects:
    """The rows a decision's ``commands`` imply, for a workflow whose header went from
    ``before`` to ``after``."""
    listed = tuple(commands)
    steps = tuple(
        _step(workflow_id, before.cycle, c, kinds)
        for c in listed
        if isinstance(c, ScheduleStep | StartTimer)
    )
    gates = tuple(c for c in listed if isinstance(c, OpenGate))
    wind_down = None
    if after.status.finished and not before.status.finished:
        why = f"workflow {after.status.value}" + (f": {after.reason}" if after.reason else "")
        wind_down = WindDown(cancel_steps=after.status is not Status.COMPLETED, why=why)
    return Effects(steps, gates, wind_down)


def _step(
    workflow_id: str, cycle: int, command: ScheduleStep | StartTimer, kinds: StepKinds
) -> StepToRun:
    name = step_name(command)
    payload: dict[str, Any] = {"workflow_id": workflow_id, "step": name}
    subject = f"{workflow_id}/{name}"
    if isinstance(command, StartTimer):
        payload["timer"] = command.timer
        return StepToRun(name, TIMER_KIND, subject, cycle, payload, delay=command.delay)
    payload |= {"subject": command.subject, "input": dict(command.input)}
    declared = kinds.get(command.kind)
    return StepToRun(
        name,
        command.kind,
        subject,
        command.cycle,
        payload,
        delay=command.delay,
        after=command.after,
        max_attempts=command.max_attempts,
        lease=None if declared is None else declared.lease,
    )


@dataclass(frozen=True, slots=True)
class Settlement:
    """What a step's applied settle records: ``event`` (None: nothing to decide) and, for a
    step that failed for good, why its dependents are cancelled."""

    event: Event | None = None
    cancel_dependents: str | None = None


def settled_event(
    kind: str,
    step: str,
    payload: JsonObject,
    state: JobState | None,
    *,
    result: JsonObject | None = None,
    failure: tuple[FailureClass, str] | None = None,
) -> Settlement:
    if state is JobState.SUCCEEDED:
        if kind == TIMER_KIND:
            return Settlement(TimerFired(timer=str(payload.get("timer", step))))
        return Settlement(StepSucceeded(step=step, result=dict(result or {})))
    if state is JobState.FAILED and failure is not None:
        event = StepFailed(step=step, failure_class=failure[0], detail=failure[1])
        return Settlement(event, cancel_dependents=f"cancelled: step {step} failed for good")
    return Settlement()


@dataclass(frozen=True, slots=True)
class Block:
    header: Header
    gate: OpenGate = field(compare=False)


def blocked(header: Header, seq: int, error: str, *, nonce: str) -> Block:
    """The one way a workflow blocks: its header ``blocked`` with ``error``, and the
    ``workflow_error`` gate whose answer retries the waiting events or cancels."""
    error = error[:ERROR_LIMIT]
    gate = OpenGate(
        gate=f"{WORKFLOW_ERROR.name}.{seq}.{nonce}",
        kind=WORKFLOW_ERROR.name,
        question=(
            f"Event #{seq} could not be applied ({error}). Fix or deploy the definition, "
            "then answer retry to apply the waiting events, or cancel the workflow."
        ),
        answers=RETRY_OR_CANCEL,
        context={"seq": seq, "error": error},
    )
    return Block(replace(header, status=Status.BLOCKED, completion_mode=None, reason=error), gate)


def unblocked(header: Header) -> Header:
    """A blocked workflow's header once its error gate is answered ``retry``."""
    return replace(header, status=Status.RUNNING, completion_mode=None, reason=None)


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_LIMIT]
