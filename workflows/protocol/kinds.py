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
* results: the keys the protocol reads from each (``workflows/protocol/results.py``).

Gate kinds: ``question`` (a free-text answer, or one of the offered answers), ``approval``,
``opt_in``, ``step_failed`` and ``merge_conflict`` (``workflows/merge_queue.py``), beside the
engine's own (:data:`workflows.gates.ENGINE_GATES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from workflows.dispatch import Lane
from workflows.effort import ladder
from workflows.gates import ENGINE_GATES, GateKind
from workflows.job import FailureClass
from workflows.kinds import TIMER, StepKind, StepKinds
from workflows.merge_queue import ANSWERS as MERGE_ANSWERS
from workflows.phases import Phase

_TEXT: Mapping[str, Any] = {"type": "string"}


def _result(**keys: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": sorted(keys), "properties": dict(keys)}


def _questions() -> dict[str, Any]:
    item = _result(id=_TEXT, question=_TEXT, answers={"type": "array", "items": _TEXT})
    return _result(questions={"type": "array", "items": item})


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
        _kind("design.interview", Phase.DESIGN, _questions()),
        _kind("design.research", Phase.DESIGN, _result(notes=_TEXT)),
        _kind("design.synthesize", Phase.DESIGN, _result(summary=_TEXT)),
        _kind("design.spec", Phase.DESIGN, _result(spec=_TEXT)),
        _kind("visual.inventory", Phase.VISUAL_DESIGN, _result()),
        _kind("visual.plan", Phase.VISUAL_DESIGN, _result(plan=_TEXT)),
        _kind(
            "build.decompose",
            Phase.BUILD,
            _result(work_items={"type": "array", "items": _result(id=_TEXT, title=_TEXT)}),
            lease=_MEDIUM,
            aliases=("build.plan",),
            lane=Lane.BUILD,
        ),
        _kind(
            "build.implement",
            Phase.BUILD,
            _result(status={"enum": ["done", "ambiguous"]}),
            lease=_LONG,
            bounded="max_attempts",
            lane=Lane.BUILD,
        ),
        _kind(
            "build.verify",
            Phase.BUILD,
            _result(passed={"type": "boolean"}),
            lease=_LONG,
            bounded="max_rounds",
            attempts=3,
            failure=FailureClass.WORK,
            lane=Lane.BUILD,
        ),
        _kind(
            "build.resolve",
            Phase.BUILD,
            _result(resolved={"type": "boolean"}),
            lease=_LONG,
            attempts=2,
            failure=FailureClass.WORK,
            lane=Lane.BUILD,
        ),
        _kind(
            "build.integrate",
            Phase.BUILD,
            _result(branch=_TEXT),
            lease=_MEDIUM,
            engine=False,
            lane=Lane.BUILD,
        ),
        _kind("review.demo", Phase.REVIEW, _result()),
        _kind("review.collect", Phase.REVIEW, _result(feedback={"type": "array", "items": _TEXT})),
        _kind(
            "review.triage",
            Phase.REVIEW,
            _result(
                findings={
                    "type": "array",
                    "items": _result(id=_TEXT, text=_TEXT, ambiguous={"type": "boolean"}),
                }
            ),
        ),
        _kind(
            "review.deployment_choice",
            Phase.REVIEW,
            _result(question=_TEXT, recommendation=_TEXT),
        ),
        _kind("deploy.design", Phase.DEPLOY_DESIGN, _result()),
        _kind("deploy.interview", Phase.DEPLOY_DESIGN, _questions()),
        _kind("deploy.synthesize", Phase.DEPLOY_DESIGN, _result()),
        _kind("deploy.spec", Phase.DEPLOY_DESIGN, _result(spec=_TEXT), aliases=("deploy.accept",)),
        _kind(
            "deploy.execute",
            Phase.DEPLOY_EXECUTE,
            _result(deployed={"type": "boolean"}, url=_TEXT),
            aliases=("deploy.graph",),
            attempts=3,
            failure=FailureClass.WORK,
            lane=Lane.BUILD,
        ),
        _kind("deploy.demo", Phase.DEPLOY_REVIEW, _result()),
        _kind("deploy.triage", Phase.DEPLOY_REVIEW, _result(failure={"type": ["string", "null"]})),
        _kind("deploy.route", Phase.DEPLOY_REVIEW, _result(route=_TEXT)),
        TIMER,
    ]
)

GATE_KINDS = ENGINE_GATES.merged(
    [
        GateKind("question", title="a question from the design interview"),
        GateKind("approval", title="an approval"),
        GateKind("opt_in", answers=("yes", "no"), title="an opt-in"),
        GateKind(
            "review_feedback",
            title="what was built, for the user to review",
            hint="answer accept, or write your findings as text",
        ),
        GateKind(
            "step_failed",
            answers=("retry", "abandon"),
            title="a step failed for good",
            hint="retry runs it again; abandon fails the workflow",
        ),
        GateKind(
            "merge_conflict",
            answers=MERGE_ANSWERS,
            title="a work item's merge conflict the engine did not resolve",
            hint="resolved: you merged it by hand in its worktree and it re-enters the merge "
            "queue; drop: the item leaves the cycle; abandon fails the workflow",
        ),
    ]
)

__all__ = ["GATE_KINDS", "STEP_KINDS"]
