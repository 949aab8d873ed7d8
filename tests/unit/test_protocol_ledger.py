"""The ledger events the protocol's workflow events produce (workflows/protocol/ledger.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.engine import (
    CancelRequested,
    Complete,
    GateAnswered,
    OpenGate,
    Started,
    StepFailed,
    StepSucceeded,
    TransitionPhase,
)
from workflows.job import FailureClass
from workflows.ledger import EventKind, UnwritableEvent, engine_events, open_finding_ids
from workflows.protocol.ledger import events_for, step_kind

K = EventKind


def kinds(events: list) -> list[EventKind]:
    return [e.kind for e in events]


@pytest.mark.parametrize(
    ("gate", "answer", "extra"),
    [
        ("visual.opt_in", "yes", K.VisualDesignOptedIn),
        ("visual.opt_in", "no", K.VisualDesignDeclined),
        ("visual.accept.0", "accept", K.VisualDesignAccepted),
        ("visual.accept.2", "waive", K.VisualDesignWaived),
        ("deployment.opt_in", "yes", K.DeploymentOptedIn),
        ("deployment.opt_in", "no", K.DeploymentDeclined),
        ("design.accept.0.1", "accept", K.DecisionRecorded),
        ("step.failed.build.verify.0", "retry", K.DecisionRecorded),
    ],
)
def test_an_answer_closes_its_question_and_records_the_opt_in_or_decision(
    gate: str, answer: str, extra: EventKind
) -> None:
    produced = events_for(GateAnswered(gate=gate, answer=answer, by="ann"), ())
    assert kinds(produced) == [K.AnswerGiven, extra]
    assert produced[0].payload["closes"] == gate


def test_a_free_question_is_asked_and_answered_with_the_gate_name_as_its_id() -> None:
    asked = events_for(
        StepSucceeded(step="design.interview.0.0.0", result={}),
        (OpenGate("design.q.0.who", "question", "Who is it for?"),),
    )
    assert kinds(asked) == [K.QuestionAsked]
    assert asked[0].payload["id"] == "design.q.0.who"
    answered = events_for(GateAnswered("design.q.0.who", "teams", "ann"), ())
    assert kinds(answered) == [K.AnswerGiven]


def test_a_triage_raises_new_findings_and_resolves_those_no_longer_reported() -> None:
    result = {"findings": [{"id": "f2", "text": "Rename", "ambiguous": False}]}
    produced = events_for(
        StepSucceeded(step="review.triage.1", result=result),
        (),
        lambda: frozenset({"finding:f1"}),
    )
    assert kinds(produced) == [K.FindingResolved, K.FindingRaised]
    assert produced[0].payload["closes"] == ["finding:f1"]
    assert produced[1].payload == {"id": "finding:f2", "text": "Rename", "ambiguous": False}
    # A finding still open and reported again is not raised twice.
    again = events_for(
        StepSucceeded(step="review.triage.2", result=result),
        (),
        lambda: frozenset({"finding:f2"}),
    )
    assert again == []


def test_the_end_resolves_every_open_finding_and_records_the_completion() -> None:
    produced = events_for(
        GateAnswered("deployment.opt_in", "no", "ann"),
        (TransitionPhase("done", 1), Complete("local")),
        lambda: frozenset({"finding:f9"}),
    )
    assert kinds(produced) == [
        K.AnswerGiven,
        K.DeploymentDeclined,
        K.PhaseTransitioned,
        K.FindingResolved,
        K.DecisionRecorded,
    ]


def test_open_findings_are_asked_for_only_when_needed() -> None:
    def refuse() -> frozenset[str]:
        raise AssertionError("the ledger was read for an event that needs no findings")

    events_for(StepSucceeded(step="design.spec.0.0", result={"spec": "x"}), (), refuse)
    events_for(Started(input={"engine": {"name": "scripted"}}), (), refuse)


def test_verdicts_artifacts_and_cancels() -> None:
    verify = events_for(StepSucceeded(step="build.verify.0.retry1", result={}), ())
    assert kinds(verify) == [K.VerdictRendered] and verify[0].payload["verdict"] == "pass"
    failed = events_for(StepFailed("build.verify.0", FailureClass.WORK, "red"), ())
    assert failed[0].payload["verdict"] == "fail"
    integrate = events_for(
        StepSucceeded(step="build.integrate.0", result={"branch": "b", "commit": "c"}), ()
    )
    assert kinds(integrate) == [K.ArtifactProduced]
    assert kinds(events_for(CancelRequested(by="ann"), ())) == [K.DecisionRecorded]


def test_an_engine_may_report_only_engine_level_kinds() -> None:
    ok = engine_events({"ledger": [{"kind": "TurnCompleted", "payload": {"n": 1}}]})
    assert kinds(ok) == [K.TurnCompleted]
    with pytest.raises(UnwritableEvent, match="may not write ledger kind 'AnswerGiven'"):
        engine_events({"ledger": [{"kind": "AnswerGiven", "payload": {}}]})
    with pytest.raises(UnwritableEvent, match="may not write"):
        engine_events({"ledger": [{"kind": "SomethingNew", "payload": {}}]})
    with pytest.raises(UnwritableEvent, match="must be a list"):
        engine_events({"ledger": {"kind": "TurnCompleted"}})
    assert engine_events({}) == []


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "b", "c", "d"])), max_size=30))
def test_open_findings_follow_raises_and_resolutions_in_order(
    steps: list[tuple[bool, str]],
) -> None:
    expected: set[str] = set()
    events = []
    for raise_it, name in steps:
        if raise_it:
            events.append(("FindingRaised", {"id": name}))
            expected.add(name)
        else:
            events.append(("FindingResolved", {"closes": [name]}))  # type: ignore[dict-item]
            expected.discard(name)
    assert open_finding_ids(events) == expected


def test_step_kind_is_the_first_two_parts_of_a_step_name() -> None:
    assert step_kind("build.implement.0.1") == "build.implement"
    assert step_kind("build.verify.2.retry3") == "build.verify"
