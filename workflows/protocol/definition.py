"""The ``vibey-protocol`` workflow definition: events in, the phase handlers, decisions out.

An event about a step that is not in flight or a gate that is not open (a late result from an
earlier cycle, a second answer, an answer that is not one of the gate's) changes nothing and
makes no command. Only a result without the keys the protocol reads raises (a
:class:`~workflows.protocol.results.ResultError`, a ``ValueError``), as does a workflow input
without an engine object; the store turns a raise into a blocked workflow.

A build.resolve that fails for good parks its item at the merge queue's gate
(:mod:`workflows.protocol.merging`). Any other step that fails for good opens
``step.failed.<step>``: ``retry`` schedules it again as
``<origin>.retry<k>`` (and, again, every step in flight that waits on it, since a failed
dependency never releases them); its success counts as the original's. ``abandon`` fails the
workflow.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from workflows.engine import (
    Command,
    Decision,
    Definition,
    Event,
    GateAnswered,
    ScheduleStep,
    Started,
    StepFailed,
    StepSucceeded,
    TimerFired,
)
from workflows.gates import GateKinds
from workflows.kinds import StepKinds
from workflows.ledger import NewEvent
from workflows.phases import Phase
from workflows.protocol import deploy, merging, product
from workflows.protocol.enter import enter_design
from workflows.protocol.kinds import BUILD_RESOLVE, GATE_KINDS, STEP_FAILED_GATE, STEP_KINDS
from workflows.protocol.ledger import OpenFindings, events_for
from workflows.protocol.plan import Out, fail, open_gate, step_command, unchanged
from workflows.protocol.state import (
    Gate,
    Pending,
    ProtocolState,
    decode_state,
    encode_state,
    plain_json,
)

NAME = "vibey-protocol"
VERSION = 1
DEFAULT_SOAK_SECONDS = 1
_NOTE_CHARS = 500

_ON_SUCCESS = {**product.ON_SUCCESS, **deploy.ON_SUCCESS}
_ON_ANSWER = {**product.ON_ANSWER, **deploy.ON_ANSWER}


class ProtocolDefinition:
    """INTAKE → DESIGN → [VISUAL_DESIGN] → BUILD ⇄ REVIEW → DONE (local), or on through
    DEPLOY_DESIGN → DEPLOY_EXECUTE → DEPLOY_REVIEW → DONE (deployed). See docs/protocol.md."""

    @property
    def name(self) -> str:
        return NAME

    @property
    def version(self) -> int:
        return VERSION

    @property
    def kinds(self) -> StepKinds:
        return STEP_KINDS

    @property
    def gates(self) -> GateKinds:
        return GATE_KINDS

    @property
    def first_phase(self) -> str:
        return Phase.INTAKE.value

    def initial(self) -> ProtocolState:
        return ProtocolState()

    def decide(self, state: ProtocolState, event: Event, now: datetime) -> Decision[ProtocolState]:
        if state.ended is not None:
            return unchanged(state)
        match event:
            case Started(input=given):
                return unchanged(state) if state.started else _start(state, given)
            case StepSucceeded(step=step, result=result):
                return _succeeded(state, step, result)
            case StepFailed():
                return _failed(state, event)
            case GateAnswered(gate=name, answer=answer, by=by):
                return _answered(state, name, answer, by)
            case TimerFired(timer=timer) if timer == state.timer:
                return deploy.soaked(state)
            case _:
                return unchanged(state)

    def ledger_events(
        self, event: Event, commands: Sequence[Command], open_findings: OpenFindings
    ) -> list[NewEvent]:
        """The ledger events this event and its commands produce (``workflows.protocol.ledger``),
        appended by the store in the same transaction."""
        return events_for(event, commands, open_findings)

    def encode_state(self, state: ProtocolState) -> Mapping[str, Any]:
        return encode_state(state)

    def decode_state(self, data: Mapping[str, Any]) -> ProtocolState:
        return decode_state(data)

    def describe(self, state: ProtocolState) -> str:
        return describe(state)


def _start(state: ProtocolState, given: Mapping[str, Any]) -> Out:
    engine = given.get("engine")
    if not isinstance(engine, Mapping):
        raise ValueError(
            'the workflow input needs an \'engine\' object, e.g. {"engine": {"name": '
            '"command"}}; see docs/protocol.md, "Workflow input"'
        )
    soak = given.get("deploy_soak_seconds", DEFAULT_SOAK_SECONDS)
    if type(soak) is not int or soak < 0:
        raise ValueError(f"deploy_soak_seconds must be a whole number >= 0, got {soak!r}")
    feedback = given.get("review_feedback", False)
    if type(feedback) is not bool:
        raise ValueError(f"review_feedback must be true or false, got {feedback!r}")
    started = replace(
        state,
        started=True,
        engine=plain_json(engine),
        soak_seconds=soak,
        review_feedback=feedback,
    )
    return enter_design(started, 0, None)


def _take_step(state: ProtocolState, step: str) -> tuple[ProtocolState, Pending | None]:
    for pending in state.pending:
        if pending.step == step:
            rest = tuple(p for p in state.pending if p.step != step)
            return replace(state, pending=rest), pending
    return state, None


def _succeeded(state: ProtocolState, step: str, result: Mapping[str, Any]) -> Out:
    rest, pending = _take_step(state, step)
    if pending is None:
        return unchanged(state)
    return _ON_SUCCESS[pending.kind](rest, pending, result)


def _failed(state: ProtocolState, event: StepFailed) -> Out:
    rest, pending = _take_step(state, event.step)
    if pending is None:
        return unchanged(state)
    detail = event.detail[:_NOTE_CHARS]
    if pending.kind == BUILD_RESOLVE:
        return merging.resolve_failed(rest, pending, detail)
    gate = Gate(
        name=f"step.failed.{event.step}",
        role="step.failed",
        answers=("retry", "abandon"),
        failed=pending,
        note=f"{event.failure_class.value}: {detail}",
    )
    context = {
        "step": event.step,
        "kind": pending.kind,
        "subject": pending.subject,
        "failure_class": event.failure_class.value,
        "detail": detail,
    }
    question = f"Step {event.step} ({pending.kind}) failed for good: retry it, or abandon?"
    return open_gate(rest, gate, STEP_FAILED_GATE, question, context)


def _answered(state: ProtocolState, name: str, answer: str, by: str) -> Out:
    gate = next((g for g in state.gates if g.name == name), None)
    if gate is None or not _allowed(gate, answer):
        return unchanged(state)
    rest = replace(state, gates=tuple(g for g in state.gates if g.name != name))
    if gate.role != "step.failed":
        return _ON_ANSWER[gate.role](rest, gate, answer)
    if answer == "retry":
        return _retry(rest, gate)
    return fail(
        rest,
        f"{gate.name.removeprefix('step.failed.')} failed for good ({gate.note}); "
        f"abandoned by {by}",
    )


def _allowed(gate: Gate, answer: str) -> bool:
    return answer in gate.answers if gate.answers else bool(answer.strip())


def _retry(state: ProtocolState, gate: Gate) -> Out:
    """Schedule the failed step again, and every step in flight that waits on it."""
    failed = gate.failed
    if failed is None:  # pragma: no cover - a step.failed gate always names its step
        raise ValueError(f"gate {gate.name} names no failed step")
    renamed: dict[str, str] = {}
    again: list[Pending] = []
    kept: list[Pending] = []
    for pending in (failed, *state.pending):
        if pending is failed or any(a in renamed for a in pending.after):
            fresh = replace(
                pending,
                step=f"{pending.origin}.retry{pending.retries + 1}",
                retries=pending.retries + 1,
                after=tuple(renamed.get(a, a) for a in pending.after),
            )
            renamed[pending.step] = fresh.step
            again.append(fresh)
        else:
            kept.append(pending)
    rescheduled = replace(state, pending=(*kept, *again))
    commands: tuple[ScheduleStep, ...] = tuple(step_command(state, p) for p in again)
    return Decision(rescheduled, commands)


def describe(state: ProtocolState) -> str:
    """One line: the phase, the cycle and what the workflow waits on."""
    if not state.started:
        return "not started"
    where = f"{state.phase} cycle {state.cycle}"
    if state.ended is not None:
        return f"{where}: {state.ended}"
    waits = [f"gate {g.name}" for g in state.gates]
    if state.timer is not None:
        waits.append(f"timer {state.timer}")
    kinds = Counter(p.kind for p in state.pending)
    running = [kind if n == 1 else f"{kind} ×{n}" for kind, n in kinds.items()]
    parts = []
    if waits:
        parts.append("waiting on " + ", ".join(waits))
    if running:
        parts.append("running " + ", ".join(running))
    return f"{where}: " + ("; ".join(parts) if parts else "idle")


PROTOCOL: Definition[ProtocolState] = ProtocolDefinition()
DEFINITIONS: tuple[Definition[ProtocolState], ...] = (PROTOCOL,)
