"""The deterministic engine: every answer is a function of (script, kind, cycle, attempt,
subject, input), so a workflow run on it replays the same way every time.

The script travels in the step input (``input["engine"]["script"]``, docs/protocol.md). The
side effects are build.implement's: given a worktree, it writes ``src/<item>.txt`` (the
item's title and the cycle) and commits it, so BUILD has real branches to integrate; and
build.resolve's: in the item's worktree it resolves each file in conflict by keeping both
sides (the item's lines, then the integrated tree's), leaving vibey to commit the merge.

One scripted engine plays every engine of the script's ``[engines] roster``: the step input's
``engine_id`` (set by the handoff runner, :mod:`actors.handoff`) says which one it is this
time (default ``scripted``), and its ledger events name it. The roster's engines run out of
credits where ``[capacity] credits_exhausted`` says: the verdict is ``capacity`` with
``result["capacity"] = {"state": "CreditsExhausted", "detail": …}`` and a ``CapacityRejected``
ledger event. :meth:`ScriptedEngine.write_brief` writes a handoff brief from the ledger range:
everything the no-loss gate asks for, except in its first ``[handoff] failing_briefs`` briefs.
A seeded engine (``input["handoff"]``) reads the ledger file its seed prompt names, and says
so in its evidence (``seed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from actors.agents.base import EngineTask, EngineVerdict, ScriptError
from actors.agents.script import DEFAULT_ENGINE, Script
from actors.worktrees import commit_all, current_branch
from workflows.capacity import CreditsExhausted, encode_state
from workflows.ledger import (
    EventKind,
    LedgerEvent,
    UnwritableEvent,
    digest_range,
    open_items,
)
from workflows.ledger import (
    item_id as event_item_id,
)
from workflows.noloss import (
    BriefItem,
    BriefMode,
    Budget,
    HandoffBrief,
    RuleFailure,
    Spec,
    obligations,
)
from workflows.protocol.kinds import (
    BUILD_DECOMPOSE,
    BUILD_IMPLEMENT,
    BUILD_INTEGRATE,
    BUILD_RESOLVE,
    BUILD_VERIFY,
    DEPLOY_DEMO,
    DEPLOY_DESIGN,
    DEPLOY_EXECUTE,
    DEPLOY_INTERVIEW,
    DEPLOY_ROUTE,
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
    REVIEW_TRIAGE,
    VISUAL_INVENTORY,
    VISUAL_PLAN,
)
from workflows.protocol.results import DEPLOY_FAILURES

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
        engine = engine_id_of(task)
        pause = script.step_seconds.get(task.kind, 0.0)
        if pause:
            time.sleep(pause)
        if script.credits_exhausted_for(engine, task.kind, _item_of(task), task.attempt):
            verdict = credits_exhausted(engine, task)
        else:
            verdict = answer(script, task)
        turn = _turn(task, verdict, engine, script.dollars_per_turn)
        evidence = {**verdict.evidence, "ledger": turn}
        seed = _seed(task)
        return replace(verdict, evidence=evidence | ({"seed": seed} if seed else {}))

    def write_brief(
        self,
        task: EngineTask,
        ledger_range: Sequence[LedgerEvent],
        spec: Spec,
        *,
        mode: BriefMode,
        number: int,
        fix: tuple[RuleFailure, ...] = (),
    ) -> HandoffBrief:
        """The handoff brief this engine (``input["engine_id"]``) writes for ``ledger_range``
        and ``spec`` in ``mode``: :func:`complete_brief`, except that the script's first
        ``failing_briefs`` briefs (``number`` counts from 1) are flawed (:func:`flawed`).
        ``fix`` (what the last brief failed) changes nothing: a script is a script."""
        brief = complete_brief(ledger_range, spec, mode)
        if number <= script_of(task).failing_briefs:
            return flawed(brief, ledger_range)
        return brief


def engine_id_of(task: EngineTask) -> str:
    """Which roster engine runs ``task``: ``input["engine_id"]``, else ``scripted``."""
    engine = task.input.get("engine_id", DEFAULT_ENGINE)
    if not isinstance(engine, str) or not engine:
        raise ScriptError(f"input.engine_id must be an engine id, got {engine!r}")
    return engine


def _item_of(task: EngineTask) -> str | None:
    item = task.input.get("item")
    return item.get("id") if isinstance(item, Mapping) else None


def credits_exhausted(engine: str, task: EngineTask) -> EngineVerdict:
    """The verdict of an engine out of credits: no work done, and no time it comes back."""
    detail = f"engine {engine} ran out of credits ({task.kind} of {task.subject or 'its step'})"
    state = encode_state(CreditsExhausted(detail=detail))
    return EngineVerdict("capacity", result={"capacity": state}, detail=detail)


def _turn(
    task: EngineTask, verdict: EngineVerdict, engine: str, dollars: float = 0.0
) -> list[dict[str, Any]]:
    """The ledger events of one scripted turn: requested, completed, what it cost, and a
    capacity rejection when it reported one."""
    turn = {"kind": task.kind, "subject": task.subject, "attempt": task.attempt}
    events = [
        {"kind": "TurnRequested", "payload": {"engine": engine, **turn}},
        {
            "kind": "TurnCompleted",
            "payload": {"engine": engine, "status": verdict.status, **turn},
        },
        {"kind": "BudgetSpent", "payload": {"engine": engine, "turns": 1, "dollars": dollars}},
    ]
    capacity = verdict.result.get("capacity")
    if verdict.status == "capacity" and isinstance(capacity, Mapping):
        events.append({"kind": "CapacityRejected", "payload": {**capacity, "engine": engine}})
    return events


def _seed(task: EngineTask) -> dict[str, Any] | None:
    """A seeded engine reads the ledger file its seed names (it must exist): what it read."""
    seed = task.input.get("handoff")
    if seed is None:
        return None
    if not isinstance(seed, Mapping) or not isinstance(seed.get("ledger_file"), str):
        raise ScriptError(f"input.handoff must name a ledger_file, got {seed!r}")
    path = Path(seed["ledger_file"])
    if str(path) not in str(seed.get("prompt", "")) or not path.is_file():
        raise ScriptError(f"the seed names ledger file {path}, which is not there")
    lines = path.read_text(encoding="utf-8").splitlines()
    return {
        "from": seed.get("from"),
        "mode": seed.get("mode"),
        "ledger_file": str(path),
        "ledger_events": len(lines),
    }


# -- handoff briefs ----------------------------------------------------------------------


def complete_brief(
    ledger_range: Sequence[LedgerEvent], spec: Spec, mode: BriefMode = "brief"
) -> HandoffBrief:
    """The brief that carries everything the no-loss gate asks of ``ledger_range`` and
    ``spec`` (:func:`workflows.noloss.obligations`), each item with what it says."""
    owed = obligations(ledger_range, spec)
    texts = {(item.kind, item.id): _said(item.payload) for item in open_items(ledger_range)}
    artifacts = {
        event_item_id(e): _said(e.payload)
        for e in ledger_range
        if e.kind is EventKind.ArtifactProduced
    }
    clauses = {clause.id: clause.text for clause in spec.clauses}

    def carried(kind: EventKind, ids: frozenset[str]) -> tuple[BriefItem, ...]:
        return tuple(BriefItem(i, texts.get((kind, i), "")) for i in sorted(ids))

    return HandoffBrief(
        remaining_work=tuple(BriefItem(w) for w in sorted(owed.remaining_work)),
        open_questions=carried(EventKind.QuestionAsked, owed.open_questions),
        decisions=carried(EventKind.DecisionRecorded, owed.decisions),
        assumptions=carried(EventKind.AssumptionStated, owed.assumptions),
        findings=carried(EventKind.FindingRaised, owed.findings),
        artifacts=tuple(BriefItem(a, artifacts.get(a, "")) for a in sorted(owed.artifacts)),
        budget=owed.budget or Budget(),
        constraints=tuple(BriefItem(c, clauses.get(c, "")) for c in sorted(owed.constraints)),
        range_digest=_range_digest(ledger_range),
        mode=mode,
    )


def flawed(brief: HandoffBrief, ledger_range: Sequence[LedgerEvent]) -> HandoffBrief:
    """A brief that fails the gate: in ``brief`` mode it leaves out its first open question,
    finding, decision, assumption, artifact or work item (the first of those it carries);
    in ``full_transcript`` mode, where those rules are waived, or when it carries none of
    them, it names the digest of a stale range (the range without its last event: R6)."""
    if brief.mode == "brief":
        for name in ("open_questions", "findings", "decisions", "assumptions", "artifacts"):
            items: tuple[BriefItem, ...] = getattr(brief, name)
            if items:
                fewer: dict[str, Any] = {name: items[1:]}
                return replace(brief, **fewer)
        if brief.remaining_work:
            return replace(brief, remaining_work=brief.remaining_work[1:])
    stale = _range_digest(ledger_range[:-1]) if ledger_range else "0" * 64
    return replace(brief, range_digest=stale)


def _range_digest(ledger_range: Sequence[LedgerEvent]) -> str:
    try:
        return digest_range(ledger_range)
    except (UnwritableEvent, ValueError):
        return ""  # a range that cannot be folded: R6 names it


def _said(payload: Mapping[str, Any]) -> str:
    for key in ("question", "text", "decision", "artifact", "commit"):
        value = payload.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


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


def build_resolve(script: Script, task: EngineTask) -> EngineVerdict:
    """Keeps both sides of every conflict in ``input.files``: the deterministic resolution."""
    files = task.input.get("files") or []
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ScriptError(f"build.resolve needs input.files, a list of paths; got {files!r}")
    for name in files if task.worktree is not None else ():
        path = task.worktree / name
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            path.write_text(keep_both(text), encoding="utf-8")
    return ok(resolved=True, files=list(files))


def keep_both(text: str) -> str:
    """``text`` with each git conflict block replaced by its two sides, ours then theirs (the
    common ancestor's lines of a diff3 block dropped, a line both sides have kept once)."""
    out: list[str] = []
    ours: list[str] = []
    theirs: list[str] = []
    section = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("<<<<<<< "):
            section, ours, theirs = "ours", [], []
        elif section and line.startswith("||||||| "):
            section = "base"
        elif section and line.rstrip("\n") == "=======":
            section = "theirs"
        elif section and line.startswith(">>>>>>> "):
            out.extend(ours + [t for t in theirs if t not in ours])
            section = ""
        elif section == "ours":
            ours.append(line)
        elif section == "theirs":
            theirs.append(line)
        elif not section:
            out.append(line)
    return "".join(out)


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
    DESIGN_INTERVIEW: design_interview,
    DESIGN_RESEARCH: _text("notes", "research notes for cycle {cycle}: {answers}"),
    DESIGN_SYNTHESIZE: _text("summary", "summary of cycle {cycle}: {answers}"),
    DESIGN_SPEC: _text("spec", "spec for cycle {cycle}: {answers}"),
    VISUAL_INVENTORY: visual_inventory,
    VISUAL_PLAN: _text("plan", "visual plan for cycle {cycle}"),
    BUILD_DECOMPOSE: build_decompose,
    BUILD_IMPLEMENT: build_implement,
    BUILD_VERIFY: build_verify,
    BUILD_INTEGRATE: build_integrate,
    BUILD_RESOLVE: build_resolve,
    REVIEW_DEMO: review_demo,
    REVIEW_COLLECT: review_collect,
    REVIEW_TRIAGE: review_triage,
    REVIEW_DEPLOYMENT_CHOICE: deployment_choice,
    DEPLOY_DESIGN: _text("plan", "deployment plan for cycle {cycle}"),
    DEPLOY_INTERVIEW: deploy_interview,
    DEPLOY_SYNTHESIZE: _text("summary", "deployment summary: {answers}"),
    DEPLOY_SPEC: _text("spec", "deployment spec: {answers}"),
    DEPLOY_EXECUTE: deploy_execute,
    DEPLOY_DEMO: deploy_demo,
    DEPLOY_TRIAGE: deploy_triage,
    DEPLOY_ROUTE: deploy_route,
}
