"""The deployment choice and DEPLOY_DESIGN → DEPLOY_EXECUTE → DEPLOY_REVIEW.

Every deploy round has its own number (``state.deploy_round``, never reused): a revised
deploy spec, a rejected sign-off and every route back into a deploy phase start a new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from workflows.protocol import results
from workflows.protocol.enter import (
    deploy_chain,
    deploy_interview,
    enter_build,
    enter_deploy_design,
    enter_deploy_execute,
    enter_deploy_review,
    enter_design,
    enter_review,
    start_soak,
)
from workflows.protocol.kinds import (
    APPROVAL_GATE,
    DEPLOY_DEMO,
    DEPLOY_DESIGN,
    DEPLOY_EXECUTE,
    DEPLOY_INTERVIEW,
    DEPLOY_ROUTE,
    DEPLOY_SPEC,
    DEPLOY_SYNTHESIZE,
    DEPLOY_TRIAGE,
    OPT_IN_GATE,
    REVIEW_DEPLOYMENT_CHOICE,
)
from workflows.protocol.plan import (
    APPROVE,
    OPT_IN,
    Out,
    Plan,
    finish,
    open_gate,
    schedule,
    unchanged,
)
from workflows.protocol.product import JsonObject, OnAnswer, OnSuccess, ask
from workflows.protocol.state import Gate, Pending, ProtocolState


def _choice_made(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    question = results.text(pending.step, result, "question")
    recommendation = results.text(pending.step, result, "recommendation")
    return open_gate(
        replace(state, deployment_asked=True),
        Gate(name="deployment.opt_in", role="deployment.opt_in", answers=OPT_IN),
        OPT_IN_GATE,
        question,
        {"recommendation": recommendation},
    )


def _deployment_chosen(state: ProtocolState, gate: Gate, answer: str) -> Out:
    if answer == "yes":
        return enter_deploy_design(state)
    return finish(state, "local")


# --- DEPLOY_DESIGN -----------------------------------------------------------------------


def _interviewed(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    asked = dict(state.deploy_answers)
    todo = [q for q in results.questions(pending.step, result) if q.id not in asked]
    if todo:
        return ask(state, "deploy", str(state.deploy_round), todo[0])
    return deploy_chain(state)


def _question_answered(state: ProtocolState, gate: Gate, answer: str) -> Out:
    answered = replace(state, deploy_answers=(*state.deploy_answers, (gate.ref, answer)))
    return deploy_interview(answered)


def _specified(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    spec = results.text(pending.step, result, "spec")
    return open_gate(
        state,
        Gate(name=f"deploy.accept.{state.deploy_round}", role="deploy.accept", answers=APPROVE),
        APPROVAL_GATE,
        f"Accept the deployment spec of round {state.deploy_round}, or revise it?",
        {"spec": spec},
    )


def _spec_decided(state: ProtocolState, gate: Gate, answer: str) -> Out:
    if answer == "revise":
        return enter_deploy_design(state)
    return enter_deploy_execute(state, state.deploy_round)


# --- DEPLOY_EXECUTE and DEPLOY_REVIEW ----------------------------------------------------


def _executed(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    url = results.deployed_url(pending.step, result)
    return start_soak(replace(state, url=url))


def soaked(state: ProtocolState) -> Out:
    """The soak timer fired: review the deployment."""
    return enter_deploy_review(state)


def _triaged(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    failure = results.failure(pending.step, result)
    plan = Plan(f"{DEPLOY_ROUTE}.{state.deploy_round}", DEPLOY_ROUTE, {"failure": failure})
    return schedule(state, plan)


def _routed(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    route = results.route(pending.step, result)
    r, cycle = state.deploy_round, state.cycle + 1
    why = f"deploy round {r} routed back to {route} (deploy.triage: {pending.input.get('failure')})"
    if route == "done":
        return open_gate(
            state,
            Gate(name=f"deploy.signoff.{r}", role="deploy.signoff", answers=("accept", "reject")),
            APPROVAL_GATE,
            f"Sign off the deployment at {state.url}?",
            {"url": state.url},
        )
    if route == "deploy_execute":
        return enter_deploy_execute(state, r + 1)
    if route == "deploy_design":
        return enter_deploy_design(state)
    if route == "design":
        return enter_design(state, cycle, why)
    if route == "build":
        return enter_build(state, cycle, [{"id": f"deploy.{r}", "text": why, "ambiguous": False}])
    return enter_review(state, cycle)


def _signed_off(state: ProtocolState, gate: Gate, answer: str) -> Out:
    if answer == "accept":
        return finish(state, "deployed")
    return enter_deploy_design(state)


def _noted(state: ProtocolState, pending: Pending, result: JsonObject) -> Out:
    return unchanged(state)


ON_SUCCESS: Mapping[str, OnSuccess] = {
    REVIEW_DEPLOYMENT_CHOICE: _choice_made,
    DEPLOY_DESIGN: _noted,
    DEPLOY_INTERVIEW: _interviewed,
    DEPLOY_SYNTHESIZE: _noted,
    DEPLOY_SPEC: _specified,
    DEPLOY_EXECUTE: _executed,
    DEPLOY_DEMO: _noted,
    DEPLOY_TRIAGE: _triaged,
    DEPLOY_ROUTE: _routed,
}

ON_ANSWER: Mapping[str, OnAnswer] = {
    "deployment.opt_in": _deployment_chosen,
    "deploy.q": _question_answered,
    "deploy.accept": _spec_decided,
    "deploy.signoff": _signed_off,
}
