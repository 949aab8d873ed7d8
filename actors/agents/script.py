"""The scripted engine's script, parsed and checked (format: docs/protocol.md).

Every section is optional; a missing one means "nothing to report": no questions, one work
item ``main``, no failures, no findings, one engine ``scripted`` that never runs out of
capacity, and briefs that pass the no-loss gate. Two forms beyond the documented ones are accepted:
``verify_failures`` and ``execute_failures`` may be a list (failures per cycle, resp. per
DEPLOY round; past the list: 0), and a ``triage`` entry may be ``"none"`` or ``""`` (TOML has
no null) for a round without a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.agents.base import ScriptError
from workflows.protocol.kinds import BUILD_IMPLEMENT
from workflows.protocol.results import DEPLOY_FAILURES

DEFAULT_ITEM: dict[str, str] = {"id": "main", "title": "main"}
DEFAULT_ENGINE = "scripted"
Failures = int | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RosterEngine:
    """One engine of ``[engines] roster``: rotation picks among them by weight."""

    id: str
    weight: int = 1


@dataclass(frozen=True, slots=True)
class CreditsExhaustion:
    """``[capacity] credits_exhausted``: ``engine`` reports CreditsExhausted for a step of
    ``kind`` (on ``item`` and at ``attempt``, when given; any, when not)."""

    engine: str
    kind: str = BUILD_IMPLEMENT
    item: str | None = None
    attempt: int | None = None

    def matches(self, engine: str, kind: str, item: str | None, attempt: int) -> bool:
        return (
            (self.engine, self.kind) == (engine, kind)
            and self.item in (None, item)
            and self.attempt in (None, attempt)
        )


@dataclass(frozen=True, slots=True)
class Script:
    design_questions: tuple[dict[str, Any], ...] = ()
    deploy_questions: tuple[dict[str, Any], ...] = ()
    work_items: tuple[dict[str, str], ...] = (DEFAULT_ITEM,)
    verify_failures: Failures = 0
    ambiguous: frozenset[str] = frozenset()
    findings: tuple[tuple[dict[str, Any], ...], ...] = ()
    execute_failures: Failures = 0
    triage: tuple[str | None, ...] = ()
    has_deploy: bool = False
    step_seconds: Mapping[str, float] = field(default_factory=dict)  # how long a kind works
    dollars_per_turn: float = 0.0  # what each scripted turn reports it cost ([budget])
    roster: tuple[RosterEngine, ...] = (RosterEngine(DEFAULT_ENGINE),)
    credits_exhausted: tuple[CreditsExhaustion, ...] = ()
    failing_briefs: int = 0  # the first N handoff briefs leave out something the gate needs

    @classmethod
    def parse(cls, raw: Any) -> Script:
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ScriptError(f"the script must be a table/object, got {type(raw).__name__}")
        design, build = _section(raw, "design"), _section(raw, "build")
        review, deploy = _section(raw, "review"), _section(raw, "deploy")
        roster = _roster(_section(raw, "engines").get("roster"))
        return cls(
            design_questions=_questions(design.get("questions", []), "design.questions"),
            deploy_questions=_questions(deploy.get("questions", []), "deploy.questions"),
            work_items=_work_items(build.get("work_items")),
            verify_failures=_failures(build.get("verify_failures", 0), "build.verify_failures"),
            ambiguous=frozenset(_strings(build.get("ambiguous", []), "build.ambiguous")),
            findings=_findings(review.get("findings", [])),
            execute_failures=_failures(
                deploy.get("execute_failures", 0), "deploy.execute_failures"
            ),
            triage=_triage(deploy.get("triage", [])),
            has_deploy="deploy" in raw,
            step_seconds=_seconds(_section(raw, "timing").get("step_seconds", {})),
            dollars_per_turn=_dollars(_section(raw, "budget").get("dollars_per_turn", 0)),
            roster=roster,
            credits_exhausted=_exhaustions(
                _section(raw, "capacity").get("credits_exhausted", []), roster
            ),
            failing_briefs=_count(
                _section(raw, "handoff").get("failing_briefs", 0), "handoff.failing_briefs"
            ),
        )

    def credits_exhausted_for(self, engine: str, kind: str, item: str | None, attempt: int) -> bool:
        return any(e.matches(engine, kind, item, attempt) for e in self.credits_exhausted)

    def verify_failures_in(self, cycle: int) -> int:
        return _per_index(self.verify_failures, cycle)

    def execute_failures_in(self, round_: int) -> int:
        return _per_index(self.execute_failures, round_)

    def findings_in(self, round_: int) -> list[dict[str, Any]]:
        return [dict(f) for f in self.findings[round_]] if round_ < len(self.findings) else []

    def triage_in(self, round_: int) -> str | None:
        return self.triage[round_] if round_ < len(self.triage) else None


def _per_index(failures: Failures, index: int) -> int:
    if isinstance(failures, int):
        return failures
    return failures[index] if index < len(failures) else 0


def _section(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    section = raw.get(name, {})
    if not isinstance(section, Mapping):
        raise ScriptError(f"[{name}] must be a table, got {type(section).__name__}")
    return section


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ScriptError(f"{where} must be a list, got {type(value).__name__}")
    return list(value)


def _strings(value: Any, where: str) -> list[str]:
    items = _list(value, where)
    if not all(isinstance(item, str) for item in items):
        raise ScriptError(f"{where} must be a list of strings, got {items!r}")
    return items


def _questions(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    questions = []
    for n, question in enumerate(_list(value, where)):
        if not isinstance(question, Mapping) or not isinstance(question.get("id"), str):
            raise ScriptError(f"{where}[{n}] needs an id and a question, got {question!r}")
        answers = _strings(question.get("answers", []), f"{where}[{n}].answers")
        text = question.get("question", question["id"])
        questions.append({"id": question["id"], "question": str(text), "answers": answers})
    return tuple(questions)


def _work_items(value: Any) -> tuple[dict[str, str], ...]:
    if value is None:
        return (DEFAULT_ITEM,)
    items = []
    for n, item in enumerate(_list(value, "build.work_items")):
        if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
            raise ScriptError(f"build.work_items[{n}] needs an id and a title, got {item!r}")
        items.append({"id": item["id"], "title": str(item.get("title", item["id"]))})
    return tuple(items)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScriptError(f"{where} must be a whole number >= 0, got {value!r}")
    return value


def _failures(value: Any, where: str) -> Failures:
    if isinstance(value, list | tuple):
        return tuple(_count(v, f"{where}[{n}]") for n, v in enumerate(value))
    return _count(value, where)


def _findings(value: Any) -> tuple[tuple[dict[str, Any], ...], ...]:
    rounds = []
    for r, findings in enumerate(_list(value, "review.findings")):
        round_ = []
        for n, finding in enumerate(_list(findings, f"review.findings[{r}]")):
            if not isinstance(finding, Mapping) or not isinstance(finding.get("id"), str):
                raise ScriptError(f"review.findings[{r}][{n}] needs an id, got {finding!r}")
            round_.append(
                {
                    "id": finding["id"],
                    "text": str(finding.get("text", finding["id"])),
                    "ambiguous": bool(finding.get("ambiguous", False)),
                }
            )
        rounds.append(tuple(round_))
    return tuple(rounds)


def _triage(value: Any) -> tuple[str | None, ...]:
    rounds: list[str | None] = []
    for n, failure in enumerate(_list(value, "deploy.triage")):
        if failure in (None, "", "none"):
            rounds.append(None)
        elif failure in DEPLOY_FAILURES:
            rounds.append(failure)
        else:
            known = ", ".join(sorted(DEPLOY_FAILURES))
            raise ScriptError(f"deploy.triage[{n}] is {failure!r}; use one of {known} or none")
    return tuple(rounds)


def _seconds(value: Any) -> dict[str, float]:
    """``[timing] step_seconds = { "build.implement" = 2 }``: each step of that kind takes
    that long, as real engine work does (the chaos tests kill workers mid-step with it)."""
    if not isinstance(value, Mapping):
        raise ScriptError("timing.step_seconds must be a table of kind = seconds")
    seconds: dict[str, float] = {}
    for kind, amount in value.items():
        if (
            isinstance(amount, bool)
            or not isinstance(amount, int | float)
            or not 0 <= amount <= 600
        ):
            raise ScriptError(f"timing.step_seconds.{kind} must be between 0 and 600 seconds")
        seconds[str(kind)] = float(amount)
    return seconds


def _roster(value: Any) -> tuple[RosterEngine, ...]:
    """``[engines] roster = [{ id = "alpha", weight = 2 }, { id = "beta" }]`` (weight: 1)."""
    if value is None:
        return (RosterEngine(DEFAULT_ENGINE),)
    engines = []
    for n, entry in enumerate(_list(value, "engines.roster")):
        if (
            not isinstance(entry, Mapping)
            or not isinstance(entry.get("id"), str)
            or not entry["id"]
        ):
            raise ScriptError(f"engines.roster[{n}] needs an id, got {entry!r}")
        weight = _count(entry.get("weight", 1), f"engines.roster[{n}].weight")
        engines.append(RosterEngine(entry["id"], weight))
    ids = [e.id for e in engines]
    if not engines or len(ids) != len(set(ids)):
        raise ScriptError(f"engines.roster must name one engine or more, each once, got {ids}")
    return tuple(engines)


def _exhaustions(value: Any, roster: tuple[RosterEngine, ...]) -> tuple[CreditsExhaustion, ...]:
    known = {e.id for e in roster}
    out = []
    for n, entry in enumerate(_list(value, "capacity.credits_exhausted")):
        where = f"capacity.credits_exhausted[{n}]"
        if not isinstance(entry, Mapping) or entry.get("engine") not in known:
            names = ", ".join(sorted(known))
            raise ScriptError(f"{where} needs an engine of the roster ({names}), got {entry!r}")
        kind, item = entry.get("kind", BUILD_IMPLEMENT), entry.get("item")
        if not isinstance(kind, str) or not (item is None or isinstance(item, str)):
            raise ScriptError(f"{where}: kind and item must be strings, got {entry!r}")
        attempt = entry.get("attempt")
        if attempt is not None and _count(attempt, f"{where}.attempt") < 1:
            raise ScriptError(f"{where}.attempt counts from 1, got {attempt}")
        out.append(CreditsExhaustion(entry["engine"], kind, item, attempt))
    return tuple(out)


def _dollars(value: Any) -> float:
    """``[budget] dollars_per_turn = 0.5``: what each scripted turn says it cost."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not 0 <= value <= 1000:
        raise ScriptError("budget.dollars_per_turn must be a number between 0 and 1000")
    return float(value)
