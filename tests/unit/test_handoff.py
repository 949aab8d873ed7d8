"""The handoff flow (workflows/handoff.py): every path from CreditsExhausted to a seeded engine,
a full-transcript brief, a human gate, or an abandoned handoff."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.handoff import (
    FULL_TRANSCRIPT_ATTEMPTS,
    MAX_REGENERATIONS,
    Abandon,
    Handoff,
    HandoffError,
    OpenHumanGate,
    SeedIncoming,
    Stage,
    Step,
    WriteBrief,
    brief_missing,
    brief_written,
    gate_answered,
    ledger_file_in,
    start,
)
from workflows.ledger import EventKind, LedgerEvent, NewEvent, digest_range
from workflows.noloss import BriefItem, HandoffBrief, Rule, Spec


def event(seq: int, kind: EventKind, payload: dict[str, object]) -> LedgerEvent:
    new = NewEvent(kind, payload)
    return LedgerEvent("p", seq, kind, new.payload, new.digest)


RANGE = (
    event(1, EventKind.QuestionAsked, {"id": "q1"}),
    event(2, EventKind.CapacityRejected, {"state": "CreditsExhausted"}),
)
SPEC = Spec()
GOOD = HandoffBrief(
    open_questions=(BriefItem("q1", "which database?"),), range_digest=digest_range(RANGE)
)
LOSSY = replace(GOOD, open_questions=())  # fails R2 only
FORGED = replace(GOOD, range_digest="0" * 64)  # fails R6, in every mode


def begin(*, alive: bool = True) -> Step:
    return start(
        outgoing="claude", incoming="codex", worktree="/work/p/items/api", outgoing_alive=alive
    )


def test_the_range_file_lives_in_the_worktree() -> None:
    assert ledger_file_in("/w/api/") == "/w/api/.vibey/handoff/ledger.jsonl"
    handoff, action = begin()
    assert handoff.ledger_file == "/work/p/items/api/.vibey/handoff/ledger.jsonl"
    assert isinstance(action, WriteBrief) and action.ledger_file == handoff.ledger_file


def test_the_outgoing_engine_writes_the_first_brief() -> None:
    handoff, action = begin()
    assert action == WriteBrief(
        author="claude",
        synthesise=False,
        mode="brief",
        attempt=1,
        fix=(),
        ledger_file=handoff.ledger_file,
    )


def test_a_dead_outgoing_engine_means_the_incoming_one_synthesises() -> None:
    _, action = begin(alive=False)
    assert isinstance(action, WriteBrief)
    assert (action.author, action.synthesise) == ("codex", True)


def test_a_passing_brief_seeds_the_incoming_engine_with_the_range_file() -> None:
    handoff, _ = begin()
    done, action = brief_written(handoff, GOOD, RANGE, SPEC)
    assert done.stage is Stage.SEEDED
    assert action == SeedIncoming("codex", GOOD, "brief", handoff.ledger_file)


def test_a_failing_brief_is_regenerated_with_what_to_fix() -> None:
    handoff, _ = begin()
    handoff, action = brief_written(handoff, LOSSY, RANGE, SPEC)
    assert isinstance(action, WriteBrief)
    assert (action.attempt, action.mode, action.author) == (2, "brief", "claude")
    assert [f.rule for f in action.fix] == [Rule.R2]
    handoff, action = brief_written(handoff, GOOD, RANGE, SPEC)
    assert isinstance(action, SeedIncoming) and handoff.attempts == 2


def fail_brief_mode(handoff: Handoff) -> tuple[Handoff, list[WriteBrief]]:
    """Every brief-mode attempt fails the gate; the writes asked for on the way."""
    writes: list[WriteBrief] = []
    for _ in range(1 + MAX_REGENERATIONS):
        handoff, action = brief_written(handoff, LOSSY, RANGE, SPEC)
        assert isinstance(action, WriteBrief)
        writes.append(action)
    return handoff, writes


def test_after_three_regenerations_the_brief_is_written_in_full_transcript_mode() -> None:
    assert MAX_REGENERATIONS == 3
    handoff, writes = fail_brief_mode(begin()[0])
    assert [(w.mode, w.attempt) for w in writes] == [
        ("brief", 2),
        ("brief", 3),
        ("brief", 4),
        ("full_transcript", 1),
    ]
    assert handoff.mode == "full_transcript"
    # Waived in full_transcript mode: the brief that kept failing R2 now passes, and the
    # incoming engine works from the ledger.jsonl file named in its seed prompt.
    handoff, action = brief_written(handoff, LOSSY, RANGE, SPEC)
    assert handoff.stage is Stage.SEEDED
    assert action == SeedIncoming(
        "codex", replace(LOSSY, mode="full_transcript"), "full_transcript", handoff.ledger_file
    )


def test_a_failing_full_transcript_brief_raises_a_human_gate() -> None:
    assert FULL_TRANSCRIPT_ATTEMPTS == 1
    handoff, _ = fail_brief_mode(begin()[0])
    handoff, action = brief_written(handoff, FORGED, RANGE, SPEC)
    assert handoff.stage is Stage.AWAITING_HUMAN
    assert isinstance(action, OpenHumanGate)
    assert [f.rule for f in action.failures] == [Rule.R6]
    assert action.answers == ("retry", "cancel")
    assert "claude to codex" in action.prompt and "R6 range integrity" in action.prompt


def at_the_gate() -> Handoff:
    handoff, _ = fail_brief_mode(begin()[0])
    handoff, _ = brief_written(handoff, FORGED, RANGE, SPEC)
    return handoff


def test_retry_at_the_gate_starts_a_new_round_in_brief_mode() -> None:
    handoff, action = gate_answered(at_the_gate(), "retry")
    assert (handoff.stage, handoff.mode, handoff.rounds) == (Stage.WRITING, "brief", 2)
    assert isinstance(action, WriteBrief) and (action.mode, action.attempt) == ("brief", 1)
    assert [f.rule for f in action.fix] == [Rule.R6]
    _, seeded = brief_written(handoff, GOOD, RANGE, SPEC)
    assert isinstance(seeded, SeedIncoming)


def test_cancel_at_the_gate_abandons_the_handoff() -> None:
    handoff, action = gate_answered(at_the_gate(), "cancel")
    assert handoff.stage is Stage.ABANDONED
    assert isinstance(action, Abandon)


def test_an_unknown_answer_is_refused() -> None:
    with pytest.raises(HandoffError, match="retry, cancel"):
        gate_answered(at_the_gate(), "accept anyway")


def test_a_brief_cannot_waive_rules_by_claiming_full_transcript_mode() -> None:
    handoff, _ = begin()
    handoff, action = brief_written(handoff, replace(LOSSY, mode="full_transcript"), RANGE, SPEC)
    assert isinstance(action, WriteBrief)
    assert [f.rule for f in action.fix] == [Rule.R2]


def test_no_brief_from_a_dying_outgoing_engine_hands_authorship_to_the_incoming() -> None:
    handoff, _ = begin()
    handoff, action = brief_missing(handoff, "the engine exited 137", author_dead=True)
    assert isinstance(action, WriteBrief)
    assert (action.author, action.synthesise, action.attempt) == ("codex", True, 2)
    assert not handoff.outgoing_alive
    _, seeded = brief_written(handoff, GOOD, RANGE, SPEC)
    assert seeded == SeedIncoming("codex", GOOD, "brief", handoff.ledger_file)


def test_no_brief_at_all_still_reaches_the_human_gate() -> None:
    handoff, action = begin()
    for _ in range(1 + MAX_REGENERATIONS + FULL_TRANSCRIPT_ATTEMPTS):
        handoff, action = brief_missing(handoff, "no brief.json written")
    assert isinstance(action, OpenHumanGate)
    assert "no brief.json written" in action.prompt


def test_events_out_of_turn_are_refused() -> None:
    seeded, _ = brief_written(begin()[0], GOOD, RANGE, SPEC)
    with pytest.raises(HandoffError, match="seeded, not writing"):
        brief_written(seeded, GOOD, RANGE, SPEC)
    with pytest.raises(HandoffError, match="not awaiting_human"):
        gate_answered(seeded, "retry")
    with pytest.raises(HandoffError, match="two engines"):
        start(outgoing="codex", incoming="codex", worktree="/w")


@given(outcomes=st.lists(st.sampled_from(["good", "lossy", "forged", "missing"]), max_size=12))
def test_every_path_seeds_only_through_a_passing_gate_and_stops_at_most_at_the_human(
    outcomes: list[str],
) -> None:
    handoff, action = begin()
    briefs = {"good": GOOD, "lossy": LOSSY, "forged": FORGED}
    writes = 0
    for outcome in outcomes:
        if not isinstance(action, WriteBrief):
            break
        writes += 1
        if outcome == "missing":
            handoff, action = brief_missing(handoff, "nothing")
        else:
            handoff, action = brief_written(handoff, briefs[outcome], RANGE, SPEC)
        if isinstance(action, SeedIncoming):
            # Seeded: the brief passed in the mode the flow was in.
            assert outcome == "good" or (outcome == "lossy" and action.mode == "full_transcript")
    assert writes <= 1 + MAX_REGENERATIONS + FULL_TRANSCRIPT_ATTEMPTS
    if isinstance(action, OpenHumanGate):
        assert handoff.stage is Stage.AWAITING_HUMAN
        assert writes == 1 + MAX_REGENERATIONS + FULL_TRANSCRIPT_ATTEMPTS
