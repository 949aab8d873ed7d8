"""The no-loss gate (workflows/noloss.py): a brief missing anything live fails exactly the rule
for it; any tampered range fails R6; full_transcript mode waives R1-R5, R7 and R9 only.

The scenarios are built from their parts, and the brief a scenario needs is worked out from
those parts directly (not with the gate's own projection)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.ledger import (
    EventKind,
    LedgerEvent,
    NewEvent,
    UnrecognizedEventKind,
    digest,
    digest_range,
)
from workflows.noloss import (
    RULE_TITLES,
    WAIVED_IN_FULL_TRANSCRIPT,
    BriefItem,
    Budget,
    HandoffBrief,
    Rule,
    Spec,
    SpecClause,
    verify,
)

ids = st.lists(st.integers(0, 99), unique=True, max_size=5)


@dataclass(frozen=True)
class Scenario:
    events: tuple[LedgerEvent, ...]
    spec: Spec
    brief: HandoffBrief  # the complete brief


def event(seq: int, kind: EventKind | str, payload: dict[str, Any]) -> LedgerEvent:
    if isinstance(kind, str):  # a kind a newer vibey wrote
        return LedgerEvent("p", seq, UnrecognizedEventKind(kind), payload, digest(kind, payload))
    new = NewEvent(kind, payload)
    return LedgerEvent("p", seq, kind, new.payload, new.digest)


def items(names: list[str]) -> tuple[BriefItem, ...]:
    return tuple(BriefItem(n, f"about {n}") for n in names)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    questions, answered = draw(ids), draw(ids)
    decisions, superseded = draw(ids), draw(ids)
    assumptions, settled = draw(ids), draw(ids)
    findings, resolved = draw(ids), draw(ids)
    artifacts = draw(ids)
    spends = draw(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 9)), max_size=4))
    work, passed = draw(ids), draw(ids)
    constraints = draw(ids)
    start = draw(st.integers(1, 1000))

    raw: list[tuple[EventKind | str, dict[str, Any]]] = []
    raw += [(EventKind.QuestionAsked, {"id": f"q{i}"}) for i in questions]
    raw += [(EventKind.DecisionRecorded, {"id": f"d{i}"}) for i in decisions]
    raw += [(EventKind.AssumptionStated, {"id": f"a{i}"}) for i in assumptions]
    raw += [(EventKind.FindingRaised, {"id": f"f{i}"}) for i in findings]
    raw += [("FutureKind", {"id": "q-ghost"}), (EventKind.TurnCompleted, {"turn": 1})]
    raw += [(EventKind.AnswerGiven, {"closes": f"q{i}"}) for i in questions if i in answered]
    raw += [
        (EventKind.DecisionRecorded, {"id": f"d{i}s", "closes": f"d{i}"})
        for i in decisions
        if i in superseded
    ]
    raw += [(EventKind.AnswerGiven, {"closes": f"a{i}"}) for i in assumptions if i in settled]
    raw += [(EventKind.FindingResolved, {"closes": f"f{i}"}) for i in findings if i in resolved]
    raw += [(EventKind.ArtifactProduced, {"id": f"art{i}"}) for i in artifacts]
    raw += [(EventKind.BudgetSpent, {"dollars": c / 100, "turns": t}) for c, t in spends]
    raw += [
        (EventKind.VerdictRendered, {"work_item": f"w{i}", "verdict": "pass"})
        for i in work
        if i in passed
    ]
    events = tuple(event(start + n, kind, payload) for n, (kind, payload) in enumerate(raw))

    spec = Spec(
        clauses=(
            *(SpecClause(f"c{i}", f"constraint {i}", constraint=True) for i in constraints),
            SpecClause("goal", "what to build"),
        ),
        work_items=tuple(f"w{i}" for i in work),
    )
    brief = HandoffBrief(
        remaining_work=items([f"w{i}" for i in work if i not in passed]),
        open_questions=items([f"q{i}" for i in questions if i not in answered]),
        decisions=items(
            [f"d{i}" for i in decisions if i not in superseded]
            + [f"d{i}s" for i in decisions if i in superseded]
        ),
        assumptions=items([f"a{i}" for i in assumptions if i not in settled]),
        findings=items([f"f{i}" for i in findings if i not in resolved]),
        artifacts=items([f"art{i}" for i in artifacts]),
        budget=Budget(
            dollars=sum((Decimal(c) / 100 for c, _ in spends), Decimal(0)),
            turns=sum(t for _, t in spends),
        ),
        constraints=items([f"c{i}" for i in constraints]),
        range_digest=digest_range(events),
    )
    return Scenario(events, spec, brief)


CLOSURE_FIELDS = {
    "remaining_work": Rule.R1,
    "open_questions": Rule.R2,
    "decisions": Rule.R3,
    "assumptions": Rule.R4,
    "findings": Rule.R5,
    "artifacts": Rule.R7,
    "constraints": Rule.R9,
}


@given(scenario=scenarios())
def test_a_complete_brief_passes_in_either_mode(scenario: Scenario) -> None:
    report = verify(scenario.brief, scenario.events, scenario.spec)
    assert report.passed, report.failures
    assert report.waived == frozenset()
    full = verify(replace(scenario.brief, mode="full_transcript"), scenario.events, scenario.spec)
    assert full.passed and full.waived == WAIVED_IN_FULL_TRANSCRIPT


@given(scenario=scenarios(), data=st.data())
def test_a_brief_missing_anything_fails_exactly_the_rule_for_it(
    scenario: Scenario, data: st.DataObject
) -> None:
    carried = {f: getattr(scenario.brief, f) for f in CLOSURE_FIELDS if getattr(scenario.brief, f)}
    if not carried:
        return
    field = data.draw(st.sampled_from(sorted(carried)))
    dropped = data.draw(st.sampled_from(carried[field]))
    brief = replace(scenario.brief, **{field: tuple(i for i in carried[field] if i != dropped)})  # type: ignore[arg-type]
    report = verify(brief, scenario.events, scenario.spec)
    assert report.failed_rules == {CLOSURE_FIELDS[field]}
    (failure,) = report.failures
    assert dropped.id in failure.detail


@given(scenario=scenarios(), data=st.data())
def test_full_transcript_mode_waives_only_the_closure_rules(
    scenario: Scenario, data: st.DataObject
) -> None:
    emptied = {field: () for field in CLOSURE_FIELDS}
    brief = replace(scenario.brief, mode="full_transcript", **emptied)  # type: ignore[arg-type]
    assert verify(brief, scenario.events, scenario.spec).passed
    broken = data.draw(st.sampled_from(["digest", "budget", "negation"]))
    if broken == "digest":
        brief = replace(brief, range_digest="0" * 64)
    elif broken == "budget":
        brief = replace(brief, budget=Budget(brief.budget.dollars + 1, brief.budget.turns))
    else:
        brief = replace(brief, decisions=(BriefItem("d-new", negates=("goal",)),))
    expected = {"digest": Rule.R6, "budget": Rule.R8, "negation": Rule.R10}[broken]
    assert verify(brief, scenario.events, scenario.spec).failed_rules == {expected}


# -- R6: range integrity -------------------------------------------------------------------


def tamper(events: tuple[LedgerEvent, ...], how: str, at: int) -> tuple[LedgerEvent, ...]:
    target = events[at]
    changed = {**target.payload, "tampered": True}
    if how == "payload":  # the row changed, its stored digest did not
        return (*events[:at], replace(target, payload=changed), *events[at + 1 :])
    if how == "payload-and-digest":  # a forger recomputed the event's own digest
        forged = replace(target, payload=changed, digest=digest(target.kind_name, changed))
        return (*events[:at], forged, *events[at + 1 :])
    if how == "drop":
        return events[:at] + events[at + 1 :]
    if how == "drop-and-renumber":
        return (*events[:at], *(replace(e, seq=e.seq - 1) for e in events[at + 1 :]))
    if how == "swap":
        other = (at + 1) % len(events)
        swapped = list(events)
        swapped[at], swapped[other] = swapped[other], swapped[at]
        return tuple(swapped)
    if how == "swap-and-renumber":
        other = (at + 1) % len(events)
        swapped = list(events)
        swapped[at], swapped[other] = swapped[other], swapped[at]
        return tuple(replace(e, seq=events[0].seq + n) for n, e in enumerate(swapped))
    if how == "duplicate":
        return (*events[: at + 1], events[at], *events[at + 1 :])
    assert how == "append"
    return (*events, event(events[-1].seq + 1, EventKind.TurnCompleted, {"turn": 99}))


@given(
    scenario=scenarios(),
    how=st.sampled_from(
        [
            "payload",
            "payload-and-digest",
            "drop",
            "drop-and-renumber",
            "swap",
            "swap-and-renumber",
            "duplicate",
            "append",
        ]
    ),
    data=st.data(),
)
def test_any_tampered_range_fails_r6(scenario: Scenario, how: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(scenario.events) - 1))
    tampered = tamper(scenario.events, how, at)
    if [(e.seq, e.kind_name, dict(e.payload)) for e in tampered] == [
        (e.seq, e.kind_name, dict(e.payload)) for e in scenario.events
    ]:
        return  # a swap of two identical events changes nothing
    for mode in ("brief", "full_transcript"):
        report = verify(replace(scenario.brief, mode=mode), tampered, scenario.spec)
        assert Rule.R6 in report.failed_rules, (how, mode)


def test_r6_names_what_is_wrong() -> None:
    events = (
        event(1, EventKind.QuestionAsked, {"id": "q1"}),
        event(2, EventKind.TurnCompleted, {}),
    )
    brief = HandoffBrief(open_questions=items(["q1"]), range_digest=digest_range(events))
    assert verify(brief, events, Spec()).passed

    def r6(brief: HandoffBrief, events: tuple[LedgerEvent, ...]) -> str:
        return {f.rule: f.detail for f in verify(brief, events, Spec()).failures}[Rule.R6]

    assert "seq 3 follows seq 1" in r6(brief, (events[0], replace(events[1], seq=3)))
    edited = (replace(events[0], payload={"id": "q2"}), events[1])
    assert "seq 1: its QuestionAsked payload does not match its digest" in r6(brief, edited)
    assert "the range folds to" in r6(replace(brief, range_digest="ab" * 32), events)


# -- the other rules, one at a time --------------------------------------------------------


def test_r8_the_budget_must_match_what_the_range_spent() -> None:
    events = (
        event(1, EventKind.BudgetSpent, {"dollars": 0.1, "turns": 2}),
        event(2, EventKind.BudgetSpent, {"engine": "codex", "dollars": 0.2, "turns": 3}),
    )
    brief = HandoffBrief(budget=Budget(Decimal("0.3"), 5), range_digest=digest_range(events))
    assert verify(brief, events, Spec()).passed  # 0.1 + 0.2 is exactly 0.3 here
    for budget in (Budget(Decimal("0.3"), 4), Budget(Decimal("0.31"), 5), Budget()):
        report = verify(replace(brief, budget=budget), events, Spec())
        assert report.failed_rules == {Rule.R8}
    bad = (event(1, EventKind.BudgetSpent, {"dollars": "lots", "turns": 1}),)
    report = verify(replace(brief, range_digest=digest_range(bad)), bad, Spec())
    assert report.failed_rules == {Rule.R8}


def test_r1_work_with_a_passing_verdict_need_not_be_carried() -> None:
    events = (
        event(1, EventKind.VerdictRendered, {"work_item": "api", "verdict": "pass"}),
        event(2, EventKind.VerdictRendered, {"work_item": "ui", "verdict": "fail"}),
        event(3, EventKind.VerdictRendered, {"work_item": "cli", "passed": True}),
        event(4, EventKind.VerdictRendered, {"step": "build.verify.0", "verdict": "pass"}),
    )
    spec = Spec(work_items=("api", "ui", "docs", "cli"))
    brief = HandoffBrief(remaining_work=items(["ui", "docs"]), range_digest=digest_range(events))
    assert verify(brief, events, spec).passed
    report = verify(replace(brief, remaining_work=items(["docs"])), events, spec)
    assert report.failed_rules == {Rule.R1}
    assert "ui" in report.failures[0].detail


def test_r10_containment() -> None:
    spec = Spec(clauses=(SpecClause("c1", "no network", constraint=True), SpecClause("goal")))
    brief = HandoffBrief(constraints=items(["c1"]), range_digest=digest_range(()))
    assert verify(brief, (), spec).passed
    negating = replace(brief, decisions=(BriefItem("d1", "call the API", negates=("c1",)),))
    report = verify(negating, (), spec)
    assert report.failed_rules == {Rule.R10}
    assert "d1 negates spec clause c1" in report.failures[0].detail
    invented = replace(brief, constraints=items(["c1", "c9"]))
    assert verify(invented, (), spec).failed_rules == {Rule.R10}
    # Negating something the spec does not hold contradicts nothing in it.
    harmless = replace(brief, assumptions=(BriefItem("a1", negates=("not-in-spec",)),))
    assert verify(harmless, (), spec).passed


def test_unrecognised_kinds_count_for_r6_and_nothing_else() -> None:
    events = (event(1, "FutureKind", {"id": "x"}), event(2, "FindingFiled", {"id": "f1"}))
    brief = HandoffBrief(range_digest=digest_range(events))
    assert verify(brief, events, Spec()).passed
    assert Rule.R6 in verify(brief, events[:1], Spec()).failed_rules


def test_every_failed_rule_is_named_once_in_rule_order() -> None:
    events = (
        event(1, EventKind.QuestionAsked, {"id": "q1"}),
        event(2, EventKind.FindingRaised, {"id": "f1"}),
        event(3, EventKind.BudgetSpent, {"dollars": 1, "turns": 1}),
    )
    report = verify(HandoffBrief(), events, Spec())
    assert [f.rule for f in report.failures] == [Rule.R2, Rule.R5, Rule.R6, Rule.R8]
    assert not report.passed


@pytest.mark.parametrize("rule", list(Rule))
def test_every_rule_has_its_seed_title(rule: Rule) -> None:
    assert rule.summary == RULE_TITLES[rule]
    assert rule.value == f"R{list(Rule).index(rule) + 1}"
