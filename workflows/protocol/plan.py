"""The protocol's primitives: schedule steps, open gates, change phase, finish.

Each returns a :class:`~workflows.engine.Decision` (the new state and the commands that go with
it); :func:`then` runs a second primitive on the first one's state and joins the commands, so
a handler reads as a sequence: transition, then schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from workflows.engine import (
    Command,
    Complete,
    Decision,
    Fail,
    OpenGate,
    ScheduleStep,
    TransitionPhase,
)
from workflows.phases import Phase
from workflows.protocol.kinds import STEP_KINDS
from workflows.protocol.state import Gate, Pending, ProtocolState

Out: TypeAlias = Decision[ProtocolState]
JsonObject: TypeAlias = Mapping[str, Any]


APPROVE = ("accept", "revise")
OPT_IN = ("yes", "no")


@dataclass(frozen=True, slots=True)
class Plan:
    """A step to schedule: its name, kind, kind-specific input, subject and dependencies."""

    name: str
    kind: str
    input: JsonObject = field(default_factory=dict)
    subject: str = ""
    after: tuple[str, ...] = ()


def unchanged(state: ProtocolState) -> Out:
    return Decision(state)


def then(first: Out, step: Callable[[ProtocolState], Out]) -> Out:
    second = step(first.state)
    return Decision(second.state, first.commands + second.commands)


def schedule(state: ProtocolState, *plans: Plan) -> Out:
    """Schedule ``plans`` in order; every input gets the engine, the cycle and the phase."""
    added = tuple(
        Pending(
            step=plan.name,
            kind=plan.kind,
            subject=plan.subject,
            cycle=state.cycle,
            input={"cycle": state.cycle, "phase": STEP_KINDS[plan.kind].phase, **plan.input},
            after=plan.after,
            origin=plan.name,
            max_attempts=STEP_KINDS[plan.kind].max_attempts,
        )
        for plan in plans
    )
    commands = tuple(step_command(state, pending) for pending in added)
    return Decision(replace(state, pending=state.pending + added), commands)


def step_command(state: ProtocolState, pending: Pending) -> ScheduleStep:
    return ScheduleStep(
        step=pending.step,
        kind=pending.kind,
        subject=pending.subject,
        input={"engine": state.engine, **pending.input},
        after=pending.after,
        cycle=pending.cycle,
        max_attempts=pending.max_attempts,
    )


def open_gate(
    state: ProtocolState, gate: Gate, kind: str, question: str, context: JsonObject | None = None
) -> Out:
    command = OpenGate(
        gate=gate.name, kind=kind, question=question, answers=gate.answers, context=context or {}
    )
    return Decision(replace(state, gates=(*state.gates, gate)), (command,))


def transition(state: ProtocolState, phase: Phase, cycle: int) -> Out:
    """Move to ``phase`` in ``cycle``; no command when that is where the workflow already is.
    A move ends the BUILD cycle's plan and merge queue (a new cycle starts its own)."""
    if state.phase == phase.value and state.cycle == cycle:
        return Decision(state)
    moved = replace(state, phase=phase.value, cycle=cycle, plan=(), merge=None)
    return Decision(moved, (TransitionPhase(phase.value, cycle),))


def finish(state: ProtocolState, mode: str) -> Out:
    done = transition(state, Phase.DONE, state.cycle)
    ended = replace(done.state, pending=(), gates=(), timer=None, ended=f"completed {mode}")
    return Decision(ended, (*done.commands, Complete(mode)))


def fail(state: ProtocolState, reason: str) -> Out:
    ended = replace(state, pending=(), gates=(), timer=None, ended=f"failed: {reason}")
    commands: tuple[Command, ...] = (Fail(reason),)
    return Decision(ended, commands)
