"""The no-loss gate: a handoff brief must carry everything the ledger range says is still live.

:func:`verify` is pure and deterministic; no model is called, which is what makes rotating
engines mid-work safe. It checks ten rules and names every one that fails::

    R1  remaining-work closure   every spec work item without a passing verdict is in the brief
    R2  open-question closure    every question still open in the range is in the brief
    R3  decision closure         every decision still standing (not superseded) is in the brief
    R4  assumption closure       every assumption still open is in the brief
    R5  finding closure          every finding not resolved is in the brief
    R6  range integrity          every event matches its digest, seqs are consecutive, and the
                                 brief's range_digest equals digest_range(range)
    R7  artifact closure         every artifact produced in the range is in the brief
    R8  budget carry             the brief's budget equals what the range spent
    R9  constraint closure       every constraint clause of the spec is in the brief
    R10 containment              nothing in the brief contradicts the spec: every constraint
                                 it states is a spec clause, and no item negates one

In ``full_transcript`` mode the incoming engine reads the whole range (the ``ledger.jsonl``
file written into the worktree and named in its seed prompt), so the closure rules R1–R5, R7
and R9 are waived; R6, R8 and R10 still hold.

What the gate reads from the range (``workflows.ledger``): open questions, decisions,
assumptions and findings come from :func:`workflows.ledger.open_items` (payload ``"id"``,
closed by a later payload's ``"closes"``); an ``ArtifactProduced`` is named by its
:func:`~workflows.ledger.item_id`; a ``VerdictRendered`` that names a ``"work_item"`` and says
``"verdict": "pass"`` (or ``"passed": true``) finishes that work item; a ``BudgetSpent`` adds
its ``"dollars"`` and ``"turns"`` (absent: 0; anything but a number fails R8).
Events of kinds this vibey does not know count for R6 and nothing else.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal, TypeAlias

from workflows.ledger import (
    EventKind,
    LedgerEvent,
    UnwritableEvent,
    digest_range,
    item_id,
    open_items,
)

BriefMode: TypeAlias = Literal["brief", "full_transcript"]


class Rule(enum.StrEnum):
    R1 = "R1"
    R2 = "R2"
    R3 = "R3"
    R4 = "R4"
    R5 = "R5"
    R6 = "R6"
    R7 = "R7"
    R8 = "R8"
    R9 = "R9"
    R10 = "R10"

    @property
    def summary(self) -> str:
        return RULE_TITLES[self]


RULE_TITLES = {
    Rule.R1: "remaining-work closure",
    Rule.R2: "open-question closure",
    Rule.R3: "decision closure",
    Rule.R4: "assumption closure",
    Rule.R5: "finding closure",
    Rule.R6: "range integrity",
    Rule.R7: "artifact closure",
    Rule.R8: "budget carry",
    Rule.R9: "constraint closure",
    Rule.R10: "containment",
}

WAIVED_IN_FULL_TRANSCRIPT: frozenset[Rule] = frozenset(
    {Rule.R1, Rule.R2, Rule.R3, Rule.R4, Rule.R5, Rule.R7, Rule.R9}
)


# -- inputs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BriefItem:
    """One thing the brief carries: the id the ledger or spec knows it by, what it says, and
    the spec clauses it sets aside (``negates``; any such clause fails R10)."""

    id: str
    text: str = ""
    negates: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Budget:
    dollars: Decimal = Decimal(0)
    turns: int = 0


@dataclass(frozen=True, slots=True)
class HandoffBrief:
    remaining_work: tuple[BriefItem, ...] = ()
    open_questions: tuple[BriefItem, ...] = ()
    decisions: tuple[BriefItem, ...] = ()
    assumptions: tuple[BriefItem, ...] = ()
    findings: tuple[BriefItem, ...] = ()
    artifacts: tuple[BriefItem, ...] = ()
    budget: Budget = Budget()
    constraints: tuple[BriefItem, ...] = ()
    range_digest: str = ""
    mode: BriefMode = "brief"

    def items(self) -> tuple[BriefItem, ...]:
        return (
            *self.remaining_work,
            *self.open_questions,
            *self.decisions,
            *self.assumptions,
            *self.findings,
            *self.artifacts,
            *self.constraints,
        )


@dataclass(frozen=True, slots=True)
class SpecClause:
    id: str
    text: str = ""
    constraint: bool = False
    """A constraint clause must be carried by every brief (R9)."""


@dataclass(frozen=True, slots=True)
class Spec:
    clauses: tuple[SpecClause, ...] = ()
    work_items: tuple[str, ...] = ()

    @property
    def clause_ids(self) -> frozenset[str]:
        return frozenset(c.id for c in self.clauses)

    @property
    def constraints(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.clauses if c.constraint)


# -- outputs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuleFailure:
    rule: Rule
    detail: str


@dataclass(frozen=True, slots=True)
class NoLossReport:
    failures: tuple[RuleFailure, ...]
    waived: frozenset[Rule] = frozenset()

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def failed_rules(self) -> frozenset[Rule]:
        return frozenset(f.rule for f in self.failures)


@dataclass(frozen=True, slots=True)
class Obligations:
    """What a complete brief must carry for a range and a spec (the closure rules' sets)."""

    remaining_work: frozenset[str]
    open_questions: frozenset[str]
    decisions: frozenset[str]
    assumptions: frozenset[str]
    findings: frozenset[str]
    artifacts: frozenset[str]
    constraints: frozenset[str]
    budget: Budget | None
    """``None`` when a ``BudgetSpent`` payload in the range is not a number."""


# -- the gate ------------------------------------------------------------------------------


def obligations(ledger_range: Sequence[LedgerEvent], spec: Spec) -> Obligations:
    opened = open_items(ledger_range)

    def still_open(kind: EventKind) -> frozenset[str]:
        return frozenset(item.id for item in opened if item.kind is kind)

    return Obligations(
        remaining_work=frozenset(spec.work_items) - _passed_work(ledger_range),
        open_questions=still_open(EventKind.QuestionAsked),
        decisions=still_open(EventKind.DecisionRecorded),
        assumptions=still_open(EventKind.AssumptionStated),
        findings=still_open(EventKind.FindingRaised),
        artifacts=frozenset(
            item_id(e) for e in ledger_range if e.kind is EventKind.ArtifactProduced
        ),
        constraints=frozenset(spec.constraints),
        budget=_spent(ledger_range),
    )


def verify(brief: HandoffBrief, ledger_range: Sequence[LedgerEvent], spec: Spec) -> NoLossReport:
    """Check ``brief`` against the range it hands off and the spec; every failed rule is named
    once, in rule order, with what is missing or wrong."""
    owed = obligations(ledger_range, spec)
    waived = WAIVED_IN_FULL_TRANSCRIPT if brief.mode == "full_transcript" else frozenset()
    found = {
        Rule.R1: _closure("remaining work", owed.remaining_work, brief.remaining_work),
        Rule.R2: _closure("open questions", owed.open_questions, brief.open_questions),
        Rule.R3: _closure("decisions", owed.decisions, brief.decisions),
        Rule.R4: _closure("assumptions", owed.assumptions, brief.assumptions),
        Rule.R5: _closure("findings", owed.findings, brief.findings),
        Rule.R6: _range_integrity(brief, ledger_range),
        Rule.R7: _closure("artifacts", owed.artifacts, brief.artifacts),
        Rule.R8: _budget_carry(owed.budget, brief.budget),
        Rule.R9: _closure("constraints", owed.constraints, brief.constraints),
        Rule.R10: _containment(brief, spec),
    }
    failures = tuple(
        RuleFailure(rule, detail)
        for rule, detail in found.items()
        if detail is not None and rule not in waived
    )
    return NoLossReport(failures=failures, waived=waived)


def _closure(what: str, owed: frozenset[str], carried: Iterable[BriefItem]) -> str | None:
    missing = owed - {item.id for item in carried}
    if not missing:
        return None
    return f"the brief leaves out {what}: {', '.join(sorted(missing))}"


def _passed_work(ledger_range: Iterable[LedgerEvent]) -> frozenset[str]:
    done: set[str] = set()
    for event in ledger_range:
        item, payload = event.payload.get("work_item"), event.payload
        passed = payload.get("verdict") == "pass" or payload.get("passed") is True
        if event.kind is EventKind.VerdictRendered and isinstance(item, str) and passed:
            done.add(item)
    return frozenset(done)


def _spent(ledger_range: Iterable[LedgerEvent]) -> Budget | None:
    dollars, turns = Decimal(0), 0
    for event in ledger_range:
        if event.kind is not EventKind.BudgetSpent:
            continue
        cost, count = event.payload.get("dollars", 0), event.payload.get("turns", 0)
        if isinstance(cost, bool) or not isinstance(cost, int | float | str):
            return None
        if isinstance(count, bool) or not isinstance(count, int):
            return None
        try:
            dollars += Decimal(str(cost))
        except InvalidOperation:
            return None
        turns += count
    return Budget(dollars=dollars, turns=turns)


def _budget_carry(spent: Budget | None, carried: Budget) -> str | None:
    if spent is None:
        return "a BudgetSpent event in the range is not a number, so no budget can be carried"
    if (spent.dollars, spent.turns) == (carried.dollars, carried.turns):
        return None
    return (
        f"the brief carries ${carried.dollars} and {carried.turns} turns spent; "
        f"the range spent ${spent.dollars} and {spent.turns} turns"
    )


def _range_integrity(brief: HandoffBrief, ledger_range: Sequence[LedgerEvent]) -> str | None:
    previous: int | None = None
    for event in ledger_range:
        if previous is not None and event.seq != previous + 1:
            return f"seq {event.seq} follows seq {previous}: the range is not contiguous"
        previous = event.seq
        try:
            recomputed = event.recomputed_digest()
        except UnwritableEvent:
            return f"seq {event.seq}: its payload cannot be hashed"
        if recomputed != event.digest:
            return f"seq {event.seq}: its {event.kind_name} payload does not match its digest"
    try:
        actual = digest_range(ledger_range)
    except (UnwritableEvent, ValueError) as exc:
        return f"the range cannot be folded: {exc}"
    if actual != brief.range_digest:
        return (
            f"the brief names range digest {brief.range_digest[:12] or '(none)'}…; "
            f"the range folds to {actual[:12]}…"
        )
    return None


def _containment(brief: HandoffBrief, spec: Spec) -> str | None:
    clauses = spec.clause_ids
    problems = [
        f"{item.id} negates spec clause {negated}"
        for item in brief.items()
        for negated in item.negates
        if negated in clauses
    ]
    problems += [
        f"constraint {item.id} is not a spec clause"
        for item in brief.constraints
        if item.id not in clauses
    ]
    return "; ".join(problems) or None
