"""Entering a phase (or a new round of one): the transition and the first steps it schedules.

Names carry the cycle, the round or a counter, so no step or gate name ever repeats within a
workflow (see docs/protocol.md, "Names").
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from workflows.engine import Decision, StartTimer
from workflows.phases import Phase
from workflows.protocol.kinds import (
    BUILD_DECOMPOSE,
    BUILD_INTEGRATE,
    BUILD_VERIFY,
    DEPLOY_DEMO,
    DEPLOY_DESIGN,
    DEPLOY_EXECUTE,
    DEPLOY_INTERVIEW,
    DEPLOY_SPEC,
    DEPLOY_SYNTHESIZE,
    DEPLOY_TRIAGE,
    DESIGN_INTERVIEW,
    DESIGN_RESEARCH,
    DESIGN_SPEC,
    DESIGN_SYNTHESIZE,
    REVIEW_COLLECT,
    REVIEW_DEMO,
    REVIEW_DEPLOYMENT_CHOICE,
    VISUAL_INVENTORY,
    VISUAL_PLAN,
)
from workflows.protocol.plan import Out, Plan, schedule, then, transition
from workflows.protocol.state import ProtocolState

# --- DESIGN ------------------------------------------------------------------------------


def enter_design(state: ProtocolState, cycle: int, ambiguity: str | None) -> Out:
    moved = transition(state, Phase.DESIGN, cycle)
    return then(moved, lambda s: design_round(replace(s, ambiguity=ambiguity), 0))


def design_round(state: ProtocolState, round_: int) -> Out:
    return interview(replace(state, design_round=round_, interviews=0))


def interview(state: ProtocolState) -> Out:
    c, r, n = state.cycle, state.design_round, state.interviews
    plan = Plan(
        f"{DESIGN_INTERVIEW}.{c}.{r}.{n}",
        DESIGN_INTERVIEW,
        {"answers": dict(state.answers), "ambiguity": state.ambiguity},
    )
    return schedule(replace(state, interviews=n + 1), plan)


def design_chain(state: ProtocolState) -> Out:
    """design.research → design.synthesize → design.spec, one decision, chained by ``after``."""
    c, r = state.cycle, state.design_round
    given = {"answers": dict(state.answers)}
    research, synthesize = f"{DESIGN_RESEARCH}.{c}.{r}", f"{DESIGN_SYNTHESIZE}.{c}.{r}"
    return schedule(
        state,
        Plan(research, DESIGN_RESEARCH, given),
        Plan(synthesize, DESIGN_SYNTHESIZE, given, after=(research,)),
        Plan(f"{DESIGN_SPEC}.{c}.{r}", DESIGN_SPEC, given, after=(synthesize,)),
    )


def enter_visual(state: ProtocolState) -> Out:
    c, given = state.cycle, {"spec": state.spec}
    inventory = f"{VISUAL_INVENTORY}.{c}"
    moved = transition(state, Phase.VISUAL_DESIGN, c)
    return then(
        moved,
        lambda s: schedule(
            s,
            Plan(inventory, VISUAL_INVENTORY, given),
            Plan(f"{VISUAL_PLAN}.{c}", VISUAL_PLAN, given, after=(inventory,)),
        ),
    )


# --- BUILD and REVIEW --------------------------------------------------------------------


def enter_build(state: ProtocolState, cycle: int, findings: list[dict[str, Any]]) -> Out:
    moved = transition(state, Phase.BUILD, cycle)
    plan = Plan(
        f"{BUILD_DECOMPOSE}.{cycle}", BUILD_DECOMPOSE, {"spec": state.spec, "findings": findings}
    )
    return then(moved, lambda s: schedule(replace(s, items=(), ambiguities=()), plan))


def verify_chain(state: ProtocolState) -> Out:
    """build.verify → build.integrate, once every implement of the cycle succeeded."""
    c, given = state.cycle, {"items": list(state.items)}
    verify = f"{BUILD_VERIFY}.{c}"
    return schedule(
        state,
        Plan(verify, BUILD_VERIFY, given),
        Plan(f"{BUILD_INTEGRATE}.{c}", BUILD_INTEGRATE, given, after=(verify,)),
    )


def enter_review(state: ProtocolState, cycle: int) -> Out:
    """review.demo → review.collect; review.triage follows collect (it reads the feedback).
    With ``review_feedback`` the demo's success opens the ``review.feedback`` gate first, and
    its answer schedules collect (:func:`workflows.protocol.product`)."""
    demo = f"{REVIEW_DEMO}.{cycle}"
    moved = transition(state, Phase.REVIEW, cycle)
    if state.review_feedback:
        return then(moved, lambda s: schedule(s, Plan(demo, REVIEW_DEMO, {"branch": s.branch})))
    return then(
        moved,
        lambda s: schedule(
            s,
            Plan(demo, REVIEW_DEMO, {"branch": s.branch}),
            Plan(
                f"{REVIEW_COLLECT}.{cycle}",
                REVIEW_COLLECT,
                {"round": s.review_rounds},
                after=(demo,),
            ),
        ),
    )


def collect(state: ProtocolState, user: str | None, after: tuple[str, ...] = ()) -> Out:
    """review.collect of this round; ``user``: the findings the user gave at the feedback gate
    (``None``: they accepted), handed on to the triage."""
    given: dict[str, Any] = {"round": state.review_rounds}
    if user is not None:
        given["user"] = user
    return schedule(
        state, Plan(f"{REVIEW_COLLECT}.{state.cycle}", REVIEW_COLLECT, given, after=after)
    )


def after_review(state: ProtocolState) -> Out:
    """REVIEW without findings: ask about deployment once; once opted in, deploy again."""
    if state.deployment_asked:
        return enter_deploy_execute(state, state.deploy_round + 1)
    return schedule(
        state, Plan(f"{REVIEW_DEPLOYMENT_CHOICE}.{state.cycle}", REVIEW_DEPLOYMENT_CHOICE)
    )


# --- DEPLOY_* ----------------------------------------------------------------------------


def enter_deploy_design(state: ProtocolState) -> Out:
    """A new deploy round: deploy.design → deploy.interview."""
    r = state.deploy_round + 1
    moved = transition(state, Phase.DEPLOY_DESIGN, state.cycle)
    design = f"{DEPLOY_DESIGN}.{r}"

    def start(s: ProtocolState) -> Out:
        first = schedule(
            replace(s, deploy_round=r, interviews=0),
            Plan(design, DEPLOY_DESIGN, {"spec": s.spec}),
        )
        return then(first, lambda t: deploy_interview(t, after=(design,)))

    return then(moved, start)


def deploy_interview(state: ProtocolState, after: tuple[str, ...] = ()) -> Out:
    r, n = state.deploy_round, state.interviews
    plan = Plan(
        f"{DEPLOY_INTERVIEW}.{r}.{n}",
        DEPLOY_INTERVIEW,
        {"answers": dict(state.deploy_answers)},
        after=after,
    )
    return schedule(replace(state, interviews=n + 1), plan)


def deploy_chain(state: ProtocolState) -> Out:
    r, given = state.deploy_round, {"answers": dict(state.deploy_answers)}
    synthesize = f"{DEPLOY_SYNTHESIZE}.{r}"
    return schedule(
        state,
        Plan(synthesize, DEPLOY_SYNTHESIZE, given),
        Plan(f"{DEPLOY_SPEC}.{r}", DEPLOY_SPEC, given, after=(synthesize,)),
    )


def enter_deploy_execute(state: ProtocolState, round_: int) -> Out:
    moved = transition(state, Phase.DEPLOY_EXECUTE, state.cycle)
    plan = Plan(f"{DEPLOY_EXECUTE}.{round_}", DEPLOY_EXECUTE, {"round": round_})
    return then(moved, lambda s: schedule(replace(s, deploy_round=round_), plan))


def start_soak(state: ProtocolState) -> Out:
    timer = f"deploy.soak.{state.deploy_round}"
    command = StartTimer(timer, timedelta(seconds=state.soak_seconds))
    return Decision(replace(state, timer=timer), (command,))


def enter_deploy_review(state: ProtocolState) -> Out:
    """deploy.demo → deploy.triage; deploy.route follows triage (it reads the failure)."""
    r, given = state.deploy_round, {"round": state.deploy_round}
    demo = f"{DEPLOY_DEMO}.{r}"
    moved = transition(replace(state, timer=None), Phase.DEPLOY_REVIEW, state.cycle)
    return then(
        moved,
        lambda s: schedule(
            s,
            Plan(demo, DEPLOY_DEMO, given),
            Plan(f"{DEPLOY_TRIAGE}.{r}", DEPLOY_TRIAGE, given, after=(demo,)),
        ),
    )
