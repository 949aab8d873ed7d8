"""The ledger events a workflow's events produce: what the store appends, in the same
transaction, beside each history entry (seed 004 "Ledger").

Pure: the events follow from the workflow event, the commands ``decide`` gave for it and, for
a review's triage, the findings still open in the ledger. Ids join the closable events:

* every gate opened is a ``QuestionAsked`` with ``id`` = the gate's name, and its answer an
  ``AnswerGiven`` that ``closes`` it; the opt-in gates add the ADR-0014 events
  (VisualDesignOptedIn/Declined, VisualDesignAccepted/Waived, DeploymentOptedIn/Declined);
  an approval, a retry-or-abandon answer and the end of the workflow are ``DecisionRecorded``;
* a triage's findings are ``FindingRaised`` (``id`` = ``finding:<id>``); a later triage that
  no longer reports an open finding resolves it (``FindingResolved``), as does the end of the
  workflow for every finding still open;
* specs, implemented items, integrations and deployments are ``ArtifactProduced``; a verify
  or a failed step is a ``VerdictRendered``; a phase change is a ``PhaseTransitioned``;
* the merge queue's conflicts (``workflows.protocol.merging``) are findings: a conflict is a
  ``FindingRaised`` (``id`` = ``conflict:<cycle>.<item>.<n>``, with the item and the files)
  when a ``build.resolve`` is scheduled for it or its gate opens without one, and its
  resolution a ``FindingResolved`` that ``closes`` it with ``resolution`` ``engine`` (the
  resolve step's success, with its ``round`` and ``attempt``), ``hand`` (the gate's
  ``resolved``), ``dropped`` or ``abandoned``; a pass that met conflicts is a
  ``VerdictRendered`` with ``verdict`` ``conflict``.

Engine-level events (turns, tools, files, transcripts, budget, capacity, and the handoffs
between engines inside a job) are the engines' to report: a step's ``evidence["ledger"]``
(see :func:`engine_events`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from workflows.engine import (
    CancelRequested,
    Command,
    Complete,
    Event,
    Fail,
    GateAnswered,
    OpenGate,
    ScheduleStep,
    Started,
    StepFailed,
    StepSucceeded,
    TransitionPhase,
)
from workflows.ledger import EventKind, NewEvent
from workflows.protocol import kinds

K = EventKind

OPT_INS: Mapping[tuple[str, str], EventKind] = {
    ("visual.opt_in", "yes"): K.VisualDesignOptedIn,
    ("visual.opt_in", "no"): K.VisualDesignDeclined,
    ("visual.accept", "accept"): K.VisualDesignAccepted,
    ("visual.accept", "waive"): K.VisualDesignWaived,
    ("deployment.opt_in", "yes"): K.DeploymentOptedIn,
    ("deployment.opt_in", "no"): K.DeploymentDeclined,
}
DECISION_GATES = (
    "design.accept",
    "deploy.accept",
    "deploy.signoff",
    "step.failed",
    "build.merge_conflict",
)
RESOLUTIONS: Mapping[str, str] = {"resolved": "hand", "drop": "dropped", "abandon": "abandoned"}


def step_kind(step: str) -> str:
    """``design.spec.0.1`` → ``design.spec``: a protocol step's name starts with its kind."""
    return ".".join(step.split(".")[:2])


def gate_family(gate: str) -> str:
    """``visual.accept.0`` → ``visual.accept``; ``step.failed.<step>`` → ``step.failed``."""
    return ".".join(gate.split(".")[:2])


OpenFindings = Callable[[], Iterable[str]]


def events_for(
    event: Event, commands: Sequence[Command], open_findings: OpenFindings = frozenset
) -> list[NewEvent]:
    """The protocol's own ledger events for one applied workflow event, in order.
    ``open_findings`` (asked only at a triage and at the end) names the findings still open
    in the ledger."""
    produced = _from_event(event, open_findings)
    for command in commands:
        produced.extend(_from_command(command, open_findings))
    return produced


def _from_event(event: Event, open_findings: OpenFindings) -> list[NewEvent]:
    match event:
        case Started(input=given):
            engine = given.get("engine")
            name = engine.get("name") if isinstance(engine, Mapping) else None
            return [NewEvent(K.SessionSeeded, {"engine": name})]
        case GateAnswered(gate=gate, answer=answer, by=by):
            return _answered(gate, answer, by)
        case StepSucceeded(step=step, result=result):
            return _succeeded(step, result, open_findings)
        case StepFailed(step=step, failure_class=cls, detail=detail):
            payload = {"step": step, "verdict": "fail", "failure_class": cls.value}
            return [NewEvent(K.VerdictRendered, payload | {"detail": detail[:500]})]
        case CancelRequested(by=by, reason=reason):
            return [NewEvent(K.DecisionRecorded, {"id": "cancel", "by": by, "reason": reason})]
    return []


def _answered(gate: str, answer: str, by: str) -> list[NewEvent]:
    family = gate_family(gate)
    out = [NewEvent(K.AnswerGiven, {"closes": gate, "answer": answer, "by": by})]
    opt_in = OPT_INS.get((family, answer))
    if opt_in is not None:
        out.append(NewEvent(opt_in, {"gate": gate, "by": by}))
    if family in DECISION_GATES:
        out.append(NewEvent(K.DecisionRecorded, {"id": gate, "decision": answer, "by": by}))
    if family == "build.merge_conflict" and answer in RESOLUTIONS:
        closes = _conflict_of(gate, family)
        resolution = {"closes": closes, "resolution": RESOLUTIONS[answer], "by": by}
        out.append(NewEvent(K.FindingResolved, resolution))
    return out


def _conflict_of(name: str, family: str) -> str:
    """``build.resolve.0.b.1`` / ``build.merge_conflict.0.b.1`` → ``conflict:0.b.1``."""
    return "conflict:" + name.removeprefix(f"{family}.")


def _conflict_raised(given: Mapping[str, Any]) -> NewEvent:
    item = given.get("item")
    item_id = item.get("id") if isinstance(item, Mapping) else item
    files = [f for f in given.get("files") or [] if isinstance(f, str)]
    payload = {
        "id": given.get("conflict"),
        "text": f"work item {item_id} does not merge into the integrated tree: "
        + (", ".join(files) or "no files named"),
        "ambiguous": False,
        "item": item_id,
        "files": files,
    }
    return NewEvent(K.FindingRaised, payload)


def _succeeded(step: str, result: Mapping[str, Any], open_findings: OpenFindings) -> list[NewEvent]:
    kind = step_kind(step)
    if kind == kinds.REVIEW_TRIAGE:
        return _triaged(result.get("findings") or [], frozenset(open_findings()))
    if kind in (kinds.DESIGN_SPEC, kinds.DEPLOY_SPEC):
        return [NewEvent(K.ArtifactProduced, {"id": step, "artifact": "spec"})]
    if kind == kinds.BUILD_RESOLVE:
        return _resolved(step, result)
    if kind in (kinds.BUILD_IMPLEMENT, kinds.BUILD_INTEGRATE) and result.get("commit"):
        payload = {"id": step, "branch": result.get("branch"), "commit": result.get("commit")}
        pushed = result.get("pushed")
        if not isinstance(pushed, Mapping):
            return [NewEvent(K.ArtifactProduced, payload)]
        push = {"id": f"{step}:push", "artifact": "push", **pushed}
        return [NewEvent(K.ArtifactProduced, payload), NewEvent(K.ArtifactProduced, push)]
    if kind == kinds.DEPLOY_EXECUTE:
        return [NewEvent(K.ArtifactProduced, {"id": step, "url": result.get("url")})]
    if kind == kinds.BUILD_VERIFY and result.get("conflicts"):
        payload = {"step": step, "verdict": "conflict", "conflicts": result["conflicts"]}
        return [NewEvent(K.VerdictRendered, payload)]
    if kind == kinds.BUILD_VERIFY:
        return [NewEvent(K.VerdictRendered, {"step": step, "verdict": "pass"})]
    return []


def _resolved(step: str, result: Mapping[str, Any]) -> list[NewEvent]:
    """The engine resolved the conflict: the finding closed, and the item's merge commit."""
    number = step.rsplit(".", 1)[-1]
    resolution = {
        "closes": _conflict_of(step, kinds.BUILD_RESOLVE),
        "resolution": "engine",
        "round": int(number) if number.isdigit() else None,
        "attempt": result.get("attempt"),
    }
    out = [NewEvent(K.FindingResolved, resolution)]
    if result.get("commit"):
        payload = {"id": step, "branch": result.get("branch"), "commit": result.get("commit")}
        out.append(NewEvent(K.ArtifactProduced, payload))
    return out


def _triaged(findings: Sequence[Any], open_findings: frozenset[str]) -> list[NewEvent]:
    raised: list[dict[str, Any]] = []
    for finding in findings:
        if isinstance(finding, Mapping) and isinstance(finding.get("id"), str):
            payload = {
                "id": f"finding:{finding['id']}",
                "text": str(finding.get("text", "")),
                "ambiguous": bool(finding.get("ambiguous", False)),
            }
            raised.append(payload)
    current = {p["id"] for p in raised}
    gone = sorted(set(open_findings) - current)
    out = [NewEvent(K.FindingResolved, {"closes": gone})] if gone else []
    return out + [NewEvent(K.FindingRaised, p) for p in raised if p["id"] not in open_findings]


def _from_command(command: Command, open_findings: OpenFindings) -> list[NewEvent]:
    match command:
        case ScheduleStep(kind=kinds.BUILD_RESOLVE, input=given):
            return [_conflict_raised(given)]
        case OpenGate(gate=gate, kind=kind, question=question, answers=answers, context=context):
            payload = {"id": gate, "kind": kind, "question": question, "answers": list(answers)}
            asked = NewEvent(K.QuestionAsked, payload)
            if kind == kinds.MERGE_CONFLICT_GATE and context.get("new_conflict") is True:
                return [_conflict_raised(context), asked]
            return [asked]
        case TransitionPhase(phase=phase, cycle=cycle):
            return [NewEvent(K.PhaseTransitioned, {"phase": phase, "cycle": cycle})]
        case Complete(mode=mode):
            done = NewEvent(K.DecisionRecorded, {"id": "completion", "completion_mode": mode})
            return [*_closing(open_findings()), done]
        case Fail(reason=reason):
            return [NewEvent(K.DecisionRecorded, {"id": "failure", "reason": reason})]
    return []


def _closing(open_findings: Iterable[str]) -> list[NewEvent]:
    still = sorted(open_findings)
    return [NewEvent(K.FindingResolved, {"closes": still})] if still else []
