"""The vibey protocol's step kinds and gate kinds, each declared once (seed 004).

23 kinds plus 3 aliases (``build.plan`` for ``build.decompose``, ``deploy.accept`` for
``deploy.spec``, ``deploy.graph`` for ``deploy.execute``). Every kind but ``build.integrate``
(a git merge vibey runs itself) is driven by an engine, at its phase's effort ladder: BUILD and
DEPLOY_EXECUTE climb LOW → STANDARD → HIGH after failures, the rest run at HIGH.

* lanes: the long unattended kinds (BUILD's five and ``deploy.execute``) run in the build lane,
  everything a person waits on in the interactive lane;
* leases: 2 h for ``build.implement``, ``build.verify`` and ``build.resolve``, 15 min for
  ``build.decompose`` and ``build.integrate``, 2 min for the rest;
* attempts: 3 for ``build.verify`` and ``deploy.execute`` (their failures are usually real), 2
  for ``build.resolve`` (the merge queue bounds its steps, then parks the item), 5 for the rest;
  the failures of those three are the work's (``work``), every other kind's the engine's;
* bounded ladders: ``build.implement`` (grants ``max_attempts``) and ``build.verify`` (grants
  ``max_rounds``) park behind a ``ladder_exhausted`` gate once BUILD's ladder is spent;
* results: the shape of each, declared in ``workflows/protocol/results.py`` beside its reader.

Gate kinds: ``question`` (a free-text answer, or one of the offered answers), ``approval``,
``opt_in``, ``step_failed`` and ``merge_conflict`` (``workflows/merge_queue.py``), beside the
engine's own (:data:`workflows.gates.ENGINE_GATES`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from workflows.dispatch import Lane
from workflows.effort import ladder
from workflows.gates import ENGINE_GATES, GateKind
from workflows.job import FailureClass
from workflows.kinds import TIMER, StepKind, StepKinds
from workflows.merge_queue import ANSWERS as MERGE_ANSWERS
from workflows.phases import Phase
from workflows.protocol import results as r

# The step kinds' names: every module that schedules, handles or reads a kind names it by these.
DESIGN_INTERVIEW = "design.interview"
DESIGN_RESEARCH = "design.research"
DESIGN_SYNTHESIZE = "design.synthesize"
DESIGN_SPEC = "design.spec"
VISUAL_INVENTORY = "visual.inventory"
VISUAL_PLAN = "visual.plan"
BUILD_DECOMPOSE = "build.decompose"
BUILD_IMPLEMENT = "build.implement"
BUILD_VERIFY = "build.verify"
BUILD_RESOLVE = "build.resolve"
BUILD_INTEGRATE = "build.integrate"
REVIEW_DEMO = "review.demo"
REVIEW_COLLECT = "review.collect"
REVIEW_TRIAGE = "review.triage"
REVIEW_DEPLOYMENT_CHOICE = "review.deployment_choice"
DEPLOY_DESIGN = "deploy.design"
DEPLOY_INTERVIEW = "deploy.interview"
DEPLOY_SYNTHESIZE = "deploy.synthesize"
DEPLOY_SPEC = "deploy.spec"
DEPLOY_EXECUTE = "deploy.execute"
DEPLOY_DEMO = "deploy.demo"
DEPLOY_TRIAGE = "deploy.triage"
DEPLOY_ROUTE = "deploy.route"

# The gate kinds' names (the engine's own are :data:`workflows.gates.ENGINE_GATES`).
QUESTION_GATE = "question"
APPROVAL_GATE = "approval"
OPT_IN_GATE = "opt_in"
REVIEW_FEEDBACK_GATE = "review_feedback"
STEP_FAILED_GATE = "step_failed"
MERGE_CONFLICT_GATE = "merge_conflict"


def _kind(
    name: str,
    phase: Phase,
    result: dict[str, Any],
    *,
    lane: Lane = Lane.INTERACTIVE,
    lease: timedelta = timedelta(minutes=2),
    attempts: int = 5,
    failure: FailureClass = FailureClass.ENGINE,
    engine: bool = True,
    bounded: str | None = None,
    aliases: tuple[str, ...] = (),
) -> StepKind:
    return StepKind(
        name,
        lane=lane,
        lease=lease,
        max_attempts=attempts,
        failure_class=failure,
        engine=engine,
        phase=phase.value,
        effort=ladder(phase),
        bounded=bounded,
        result=result,
        aliases=aliases,
    )


_LONG = timedelta(hours=2)
_MEDIUM = timedelta(minutes=15)

STEP_KINDS = StepKinds(
    [
        _kind(DESIGN_INTERVIEW, Phase.DESIGN, r.QUESTIONS),
        _kind(DESIGN_RESEARCH, Phase.DESIGN, r.NOTES),
        _kind(DESIGN_SYNTHESIZE, Phase.DESIGN, r.SUMMARY),
        _kind(DESIGN_SPEC, Phase.DESIGN, r.SPEC),
        _kind(VISUAL_INVENTORY, Phase.VISUAL_DESIGN, r.NOTHING),
        _kind(VISUAL_PLAN, Phase.VISUAL_DESIGN, r.PLAN),
        _kind(
            BUILD_DECOMPOSE,
            Phase.BUILD,
            r.WORK_ITEMS,
            lease=_MEDIUM,
            aliases=("build.plan",),
            lane=Lane.BUILD,
        ),
        _kind(
            BUILD_IMPLEMENT,
            Phase.BUILD,
            r.IMPLEMENTED,
            lease=_LONG,
            bounded="max_attempts",
            lane=Lane.BUILD,
        ),
        _kind(
            BUILD_VERIFY,
            Phase.BUILD,
            r.VERIFIED,
            lease=_LONG,
            bounded="max_rounds",
            attempts=3,
            failure=FailureClass.WORK,
            lane=Lane.BUILD,
        ),
        _kind(
            BUILD_RESOLVE,
            Phase.BUILD,
            r.RESOLVED,
            lease=_LONG,
            attempts=2,
            failure=FailureClass.WORK,
            lane=Lane.BUILD,
        ),
        _kind(
            BUILD_INTEGRATE,
            Phase.BUILD,
            r.INTEGRATED,
            lease=_MEDIUM,
            engine=False,
            lane=Lane.BUILD,
        ),
        _kind(REVIEW_DEMO, Phase.REVIEW, r.NOTHING),
        _kind(REVIEW_COLLECT, Phase.REVIEW, r.FEEDBACK),
        _kind(REVIEW_TRIAGE, Phase.REVIEW, r.FINDINGS),
        _kind(REVIEW_DEPLOYMENT_CHOICE, Phase.REVIEW, r.CHOICE),
        _kind(DEPLOY_DESIGN, Phase.DEPLOY_DESIGN, r.NOTHING),
        _kind(DEPLOY_INTERVIEW, Phase.DEPLOY_DESIGN, r.QUESTIONS),
        _kind(DEPLOY_SYNTHESIZE, Phase.DEPLOY_DESIGN, r.NOTHING),
        _kind(DEPLOY_SPEC, Phase.DEPLOY_DESIGN, r.SPEC, aliases=("deploy.accept",)),
        _kind(
            DEPLOY_EXECUTE,
            Phase.DEPLOY_EXECUTE,
            r.DEPLOYED,
            aliases=("deploy.graph",),
            attempts=3,
            failure=FailureClass.WORK,
            lane=Lane.BUILD,
        ),
        _kind(DEPLOY_DEMO, Phase.DEPLOY_REVIEW, r.NOTHING),
        _kind(DEPLOY_TRIAGE, Phase.DEPLOY_REVIEW, r.TRIAGED),
        _kind(DEPLOY_ROUTE, Phase.DEPLOY_REVIEW, r.ROUTED),
        TIMER,
    ]
)

GATE_KINDS = ENGINE_GATES.merged(
    [
        GateKind(QUESTION_GATE, title="a question from the design interview"),
        GateKind(APPROVAL_GATE, title="an approval"),
        GateKind(OPT_IN_GATE, answers=("yes", "no"), title="an opt-in"),
        GateKind(
            REVIEW_FEEDBACK_GATE,
            title="what was built, for the user to review",
            hint="answer accept, or write your findings as text",
        ),
        GateKind(
            STEP_FAILED_GATE,
            answers=("retry", "abandon"),
            title="a step failed for good",
            hint="retry runs it again; abandon fails the workflow",
        ),
        GateKind(
            MERGE_CONFLICT_GATE,
            answers=MERGE_ANSWERS,
            title="a work item's merge conflict the engine did not resolve",
            hint="resolved: you merged it by hand in its worktree and it re-enters the merge "
            "queue; drop: the item leaves the cycle; abandon fails the workflow",
        ),
    ]
)
