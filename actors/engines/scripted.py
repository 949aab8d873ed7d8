"""The deterministic engine: every answer is a function of (script, kind, cycle, attempt,
subject, input), so a workflow run on it replays the same way every time.

The script travels in the step input (``input["engine"]["script"]``, docs/protocol.md). The
one side effect is build.implement's: given a worktree, it writes ``src/<item>.txt`` (the
item's title and the cycle) and commits it, so BUILD has real branches to integrate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from actors.engines.base import EngineTask, EngineVerdict, ScriptError
from actors.engines.script import DEPLOY_FAILURES, Script
from actors.worktrees import commit_all, current_branch

ROUTES: Mapping[str | None, str] = {
    None: "done",
    "infra": "deploy_execute",
    "config": "deploy_execute",
    "design": "deploy_design",
    "product": "design",
    "code": "build",
    "review": "review",
}

Answer = Callable[[Script, EngineTask], EngineVerdict]


class ScriptedEngine:
    def run(self, task: EngineTask) -> EngineVerdict:
        answer = ANSWERS.get(task.kind)
        if answer is None:
            raise ScriptError(f"the scripted engine has no answer for kind {task.kind!r}")
        script = script_of(task)
        pause = script.step_seconds.get(task.kind, 0.0)
        if pause:
            time.sleep(pause)
        verdict = answer(script, task)
        return replace(verdict, evidence={**verdict.evidence, "ledger": _turn(task, verdict)})


def _turn(task: EngineTask, verdict: EngineVerdict) -> list[dict[str, Any]]:
    """The ledger events of one scripted turn: requested, completed, and what it cost."""
    turn = {"kind": task.kind, "subject": task.subject, "attempt": task.attempt}
    return [
        {"kind": "TurnRequested", "payload": {"engine": "scripted", **turn}},
        {
            "kind": "TurnCompleted",
            "payload": {"engine": "scripted", "status": verdict.status, **turn},
        },
        {"kind": "BudgetSpent", "payload": {"engine": "scripted", "turns": 1, "dollars": 0}},
    ]


def script_of(task: EngineTask) -> Script:
    engine = task.input.get("engine") or {}
    if not isinstance(engine, Mapping):
        raise ScriptError(f"input.engine must be an object, got {type(engine).__name__}")
    return Script.parse(engine.get("script"))


def ok(**result: Any) -> EngineVerdict:
    return EngineVerdict("ok", result=result)


def _answers(task: EngineTask) -> Mapping[str, Any]:
    answers = task.input.get("answers") or {}
    if not isinstance(answers, Mapping):
        raise ScriptError(f"input.answers must be an object, got {type(answers).__name__}")
    return answers


def _round(task: EngineTask, default: int = 0) -> int:
    value = task.input.get("round", default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScriptError(f"input.round must be a whole number >= 0, got {value!r}")
    return value


def _digest(answers: Mapping[str, Any]) -> str:
    return "; ".join(f"{key}: {answers[key]}" for key in sorted(answers)) or "no answers"


def _unanswered(task: EngineTask, questions: list[dict[str, Any]]) -> EngineVerdict:
    answered = _answers(task)
    return ok(questions=[q for q in questions if q["id"] not in answered])


def _ambiguity(task: EngineTask) -> list[dict[str, Any]]:
    ambiguity = task.input.get("ambiguity")
    if not ambiguity:
        return []
    return [{"id": f"ambiguity-{task.cycle}", "question": str(ambiguity), "answers": []}]


def design_interview(script: Script, task: EngineTask) -> EngineVerdict:
    """Cycle 0 asks the script's questions; a later cycle asks only its BUILD ambiguity."""
    questions = _ambiguity(task)
    if not questions and task.cycle == 0:
        questions = [dict(q) for q in script.design_questions]
    return _unanswered(task, questions)


def deploy_interview(script: Script, task: EngineTask) -> EngineVerdict:
    """The script's ``deploy.questions`` (or an ambiguity, when one is given)."""
    questions = _ambiguity(task) or [dict(q) for q in script.deploy_questions]
    return _unanswered(task, questions)


def _text(key: str, template: str) -> Answer:
    def answer(script: Script, task: EngineTask) -> EngineVerdict:
        return ok(**{key: template.format(cycle=task.cycle, answers=_digest(_answers(task)))})

    return answer


def visual_inventory(script: Script, task: EngineTask) -> EngineVerdict:
    return ok(screens=["home"])


def build_decompose(script: Script, task: EngineTask) -> EngineVerdict:
    """The script's work items; on the fast path, one item per finding to fix."""
    findings = task.input.get("findings") or []
    if findings:
        return ok(work_items=[_fix_item(finding) for finding in findings])
    return ok(work_items=[dict(item) for item in script.work_items])


def _fix_item(finding: Any) -> dict[str, str]:
    if not isinstance(finding, Mapping) or not isinstance(finding.get("id"), str):
        raise ScriptError(f"input.findings holds {finding!r}; a finding needs an id")
    return {"id": f"fix-{finding['id']}", "title": str(finding.get("text", finding["id"]))}


def build_implement(script: Script, task: EngineTask) -> EngineVerdict:
    item = task.input.get("item")
    if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
        raise ScriptError(f"build.implement needs input.item with an id, got {item!r}")
    item_id, title = item["id"], str(item.get("title", item["id"]))
    if task.cycle == 0 and item_id in script.ambiguous:
        question = f"How should {title!r} behave? The spec leaves it open."
        return ok(item=item_id, status="ambiguous", question=question)
    if task.worktree is None:
        return ok(item=item_id, status="done")
    commit = _write_item(task.worktree, item_id, title, task.cycle)
    branch = current_branch(task.worktree)
    return ok(item=item_id, status="done", branch=branch, commit=commit)


def _write_item(worktree: Path, item: str, title: str, cycle: int) -> str:
    path = worktree / "src" / f"{item}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{title}\ncycle {cycle}\n", encoding="utf-8")
    return commit_all(worktree, f"vibey: implement {item} (cycle {cycle})")


def build_verify(script: Script, task: EngineTask) -> EngineVerdict:
    failures = script.verify_failures_in(task.cycle)
    if task.attempt <= failures:
        detail = f"scripted verify failure {task.attempt} of {failures} in cycle {task.cycle}"
        return EngineVerdict("failed", evidence={"attempt": task.attempt}, detail=detail)
    return ok(passed=True)


def build_integrate(script: Script, task: EngineTask) -> EngineVerdict:
    """Only the shape: the integrate handler merges with git itself, asking no engine."""
    items = list(task.input.get("items") or [])
    return ok(branch="vibey/integration", merged=items, commit="")


def review_demo(script: Script, task: EngineTask) -> EngineVerdict:
    branch = task.input.get("branch", "vibey/integration")
    return ok(demo=f"demo of {branch} in cycle {task.cycle}")


def review_collect(script: Script, task: EngineTask) -> EngineVerdict:
    """The texts of the round's scripted findings (``round`` when given, else the cycle)."""
    findings = script.findings_in(_round(task, default=task.cycle))
    return ok(feedback=[f["text"] for f in findings])


def review_triage(script: Script, task: EngineTask) -> EngineVerdict:
    return ok(findings=script.findings_in(_round(task)))


def deployment_choice(script: Script, task: EngineTask) -> EngineVerdict:
    """Recommends deploying when the script has a [deploy] section."""
    recommendation = "deploy" if script.has_deploy else "local"
    return ok(question="Deploy the app, or keep it local?", recommendation=recommendation)


def deploy_execute(script: Script, task: EngineTask) -> EngineVerdict:
    round_ = _round(task)
    failures = script.execute_failures_in(round_)
    if task.attempt <= failures:
        detail = f"scripted deploy failure {task.attempt} of {failures} in round {round_}"
        return EngineVerdict("failed", evidence={"attempt": task.attempt}, detail=detail)
    return ok(deployed=True, url=f"https://{task.project_id}.vibey.invalid/round-{round_}")


def deploy_demo(script: Script, task: EngineTask) -> EngineVerdict:
    return ok(demo=f"demo of the deployment, round {_round(task)}")


def deploy_triage(script: Script, task: EngineTask) -> EngineVerdict:
    return ok(failure=script.triage_in(_round(task)))


def deploy_route(script: Script, task: EngineTask) -> EngineVerdict:
    failure = task.input.get("failure")
    if failure not in ROUTES:
        known = ", ".join(sorted(DEPLOY_FAILURES))
        raise ScriptError(f"deploy.route got failure {failure!r}; expected null or {known}")
    return ok(route=ROUTES[failure])


ANSWERS: Mapping[str, Answer] = {
    "design.interview": design_interview,
    "design.research": _text("notes", "research notes for cycle {cycle}: {answers}"),
    "design.synthesize": _text("summary", "summary of cycle {cycle}: {answers}"),
    "design.spec": _text("spec", "spec for cycle {cycle}: {answers}"),
    "visual.inventory": visual_inventory,
    "visual.plan": _text("plan", "visual plan for cycle {cycle}"),
    "build.decompose": build_decompose,
    "build.implement": build_implement,
    "build.verify": build_verify,
    "build.integrate": build_integrate,
    "review.demo": review_demo,
    "review.collect": review_collect,
    "review.triage": review_triage,
    "review.deployment_choice": deployment_choice,
    "deploy.design": _text("plan", "deployment plan for cycle {cycle}"),
    "deploy.interview": deploy_interview,
    "deploy.synthesize": _text("summary", "deployment summary: {answers}"),
    "deploy.spec": _text("spec", "deployment spec: {answers}"),
    "deploy.execute": deploy_execute,
    "deploy.demo": deploy_demo,
    "deploy.triage": deploy_triage,
    "deploy.route": deploy_route,
}
