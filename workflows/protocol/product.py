"""DESIGN, VISUAL_DESIGN, BUILD and REVIEW: what a step's success or a gate's answer does.

Handlers are looked up by the step's kind (:data:`ON_SUCCESS`) or the gate's role
(:data:`ON_ANSWER`); the step or gate has already been taken off the state's open list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any, TypeAlias

from workflows.protocol import merging, results
from workflows.protocol.enter import (
    after_review,
    collect,
    design_chain,
    design_round,
    enter_build,
    enter_design,
    enter_review,
    enter_visual,
    interview,
    verify_chain,
)
from workflows.protocol.kinds import (
    APPROVAL_GATE,
    BUILD_DECOMPOSE,
    BUILD_IMPLEMENT,
    BUILD_INTEGRATE,
    BUILD_RESOLVE,
    BUILD_VERIFY,
    DESIGN_INTERVIEW,
    DESIGN_RESEARCH,
    DESIGN_SPEC,
    DESIGN_SYNTHESIZE,
    OPT_IN_GATE,
    QUESTION_GATE,
    REVIEW_COLLECT,
    REVIEW_DEMO,
    REVIEW_FEEDBACK_GATE,
    REVIEW_TRIAGE,
    VISUAL_INVENTORY,
    VISUAL_PLAN,
)
from workflows.protocol.plan import APPROVE, OPT_IN, Out, Plan, open_gate, schedule, unchanged
from workflows.protocol.state import Gate, Pending, ProtocolState

JsonObject: TypeAlias = Mapping[str, Any]
OnSuccess: TypeAlias = Callable[[ProtocolState, Pending, JsonObject], Out]
OnAnswer: TypeAlias = Callable[[ProtocolState, Gate, str], Out]


def ask(state: ProtocolState, prefix: str, key: str, question: results.Question) -> Out:
    """Open the gate for one interview question (``<prefix>.q.<key>.<id>``)."""
    gate = Gate(
        name=f"{prefix}.q.{key}.{question.id}",
        role=f"{prefix}.q",
        answers=question.answers,
        ref=question.id,
    )
    return open_gate(state, gate, QUESTION_GATE, question.question, {"id": question.id})


# --- DESIGN and VISUAL_DESIGN --------------------------------------------------------------


def _interviewed(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    asked = dict(state.answers)
    todo = [q for q in results.questions(pending.step, result) if q.id not in asked]
    if todo:
        return ask(state, "design", str(state.cycle), todo[0])
    return design_chain(state)


def _question_answered(state: ProtocolState, gate: Gate, answer: str) -> Out:
    return interview(replace(state, answers=(*state.answers, (gate.ref, answer))))


def _specified(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    spec = results.text(pending.step, result, "spec")
    name = f"design.accept.{state.cycle}.{state.design_round}"
    return open_gate(
        replace(state, spec=spec),
        Gate(name=name, role="design.accept", answers=APPROVE),
        APPROVAL_GATE,
        f"Accept the spec of cycle {state.cycle}, or revise it?",
        {"spec": spec},
    )


def _design_decided(state: ProtocolState, gate: Gate, answer: str) -> Out:
    if answer == "revise":
        return design_round(state, state.design_round + 1)
    if state.visual_asked:
        return enter_build(state, state.cycle, [])
    return open_gate(
        replace(state, visual_asked=True),
        Gate(name="visual.opt_in", role="visual.opt_in", answers=OPT_IN),
        OPT_IN_GATE,
        "Work out the visual design before building?",
    )


def _visual_chosen(state: ProtocolState, gate: Gate, answer: str) -> Out:
    if answer == "yes":
        return enter_visual(state)
    return enter_build(state, state.cycle, [])


def _visual_planned(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    plan = results.text(pending.step, result, "plan")
    return open_gate(
        state,
        Gate(
            name=f"visual.accept.{state.cycle}", role="visual.accept", answers=("accept", "waive")
        ),
        APPROVAL_GATE,
        "Accept the visual design plan, or waive it?",
        {"plan": plan},
    )


def _visual_decided(state: ProtocolState, gate: Gate, answer: str) -> Out:
    return enter_build(state, state.cycle, [])


# --- BUILD -------------------------------------------------------------------------------


def _decomposed(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    items = results.work_items(pending.step, result)
    plan = tuple((item["id"], item["title"]) for item in items)
    state = replace(state, items=tuple(item["id"] for item in items), plan=plan)
    if not items:
        return verify_chain(state)
    plans = (
        Plan(f"{BUILD_IMPLEMENT}.{state.cycle}.{i}", BUILD_IMPLEMENT, {"item": item}, item["id"])
        for i, item in enumerate(items)
    )
    return schedule(state, *plans)


def _implemented(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    question = results.ambiguity(pending.step, result)
    if question is not None:
        state = replace(state, ambiguities=(*state.ambiguities, question))
    unsettled = any(p.kind == BUILD_IMPLEMENT for p in state.pending) or any(
        g.failed is not None and g.failed.kind == BUILD_IMPLEMENT for g in state.gates
    )
    if unsettled:
        return unchanged(state)
    if state.ambiguities:
        return enter_design(state, state.cycle + 1, "\n".join(state.ambiguities))
    return verify_chain(state)


def _verified(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    """A pass of the merge queue: with ``conflicts`` its items go to build.resolve (or their
    gate) and the tests wait for the next pass; without, the tests passed."""
    conflicts = results.conflicts(pending.step, result)
    if conflicts:
        return merging.on_conflicts(state, conflicts)
    results.passed(pending.step, result)
    return unchanged(state)


def _integrated(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    """REVIEW follows, unless the cycle's merge queue still has items to merge."""
    branch = results.text(pending.step, result, "branch")
    conflicts = results.conflicts(pending.step, result)
    state = replace(state, branch=branch)
    if state.merge is None and not conflicts:
        return enter_review(state, state.cycle)
    return merging.pass_done(state, conflicts)


# --- REVIEW ------------------------------------------------------------------------------

FEEDBACK_ACCEPT = "accept"


def _demonstrated(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    """review.demo succeeded: with ``review_feedback`` the user sees what was built (its
    summary, diff stat and how to run it) and answers ``accept`` or with findings."""
    if not state.review_feedback:
        return unchanged(state)
    shown = {key: result[key] for key in results.DEMO_KEYS if isinstance(result.get(key), str)}
    lines = [f"{key.replace('_', ' ')}: {value}" for key, value in shown.items()]
    question = "\n".join(
        [
            f"Review cycle {state.cycle}: what was built is on branch {state.branch or '?'}.",
            *lines,
            f"Answer {FEEDBACK_ACCEPT!r} if it is right, or write what is wrong (your findings).",
        ]
    )
    gate = Gate(name=f"review.feedback.{state.cycle}.{state.review_rounds}", role="review.feedback")
    return open_gate(state, gate, REVIEW_FEEDBACK_GATE, question, {"cycle": state.cycle, **shown})


def _feedback_given(state: ProtocolState, gate: Gate, answer: str) -> Out:
    user = None if answer.strip().lower() == FEEDBACK_ACCEPT else answer
    return collect(state, user)


def _collected(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    feedback = results.feedback(pending.step, result)
    user = pending.input.get("user")
    if isinstance(user, str) and user.strip():
        feedback = [*feedback, user]
    given = {"feedback": feedback, "round": state.review_rounds}
    return schedule(state, Plan(f"{REVIEW_TRIAGE}.{state.cycle}", REVIEW_TRIAGE, given))


def _triaged(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    findings = results.findings(pending.step, result)
    state = replace(state, review_rounds=state.review_rounds + 1)
    if not findings:
        return after_review(state)
    if not any(f.ambiguous for f in findings):
        return enter_build(state, state.cycle + 1, [asdict(f) for f in findings])
    return enter_design(state, state.cycle + 1, "\n".join(f.text for f in findings))


def _noted(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    """A step whose result the protocol does not read (its successor already waits on it)."""
    return unchanged(state)


ON_SUCCESS: Mapping[str, OnSuccess] = {
    DESIGN_INTERVIEW: _interviewed,
    DESIGN_RESEARCH: _noted,
    DESIGN_SYNTHESIZE: _noted,
    DESIGN_SPEC: _specified,
    VISUAL_INVENTORY: _noted,
    VISUAL_PLAN: _visual_planned,
    BUILD_DECOMPOSE: _decomposed,
    BUILD_IMPLEMENT: _implemented,
    BUILD_VERIFY: _verified,
    BUILD_INTEGRATE: _integrated,
    BUILD_RESOLVE: merging.resolved,
    REVIEW_DEMO: _demonstrated,
    REVIEW_COLLECT: _collected,
    REVIEW_TRIAGE: _triaged,
}

ON_ANSWER: Mapping[str, OnAnswer] = {
    "design.q": _question_answered,
    "design.accept": _design_decided,
    "visual.opt_in": _visual_chosen,
    "visual.accept": _visual_decided,
    "review.feedback": _feedback_given,
    merging.GATE_ROLE: merging.answered,
}
