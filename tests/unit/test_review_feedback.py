"""REVIEW talks to the user (seed 004's interactive phases): with ``review_feedback`` the demo's
success opens a ``review.feedback`` gate showing what was built, and its answer (``accept``, or
findings as text) feeds the triage. Without it (unattended runs, older workflows) REVIEW runs
as before, and a stored state without the field still decodes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.golden.record import COOPERATIVE, ENGINE, Run, Script, drive, next_event, start
from workflows.engine import GateAnswered, OpenGate, Started, StepSucceeded
from workflows.protocol import PROTOCOL, ProtocolState, decode_state
from workflows.protocol.kinds import GATE_KINDS
from workflows.protocol.state import encode_state

FEEDBACK = {"project": "demo", "engine": ENGINE, "review_feedback": True}
NOW = datetime(2026, 1, 1, tzinfo=UTC)
DEMO = {"summary": "an HTTP API", "diff_stat": "2 files changed", "how_to_run": "just run"}


def at_feedback(script: Script = COOPERATIVE) -> tuple[Run, OpenGate]:
    run = start(FEEDBACK)
    for _ in range(200):
        gate = next((g for n, g in run.gates.items() if n.startswith("review.feedback.")), None)
        if gate is not None:
            return run, gate
        event = next_event(run, script)
        assert event is not None, PROTOCOL.describe(run.state)
        run.send(event)
    raise AssertionError("no review.feedback gate")


def test_the_demo_opens_a_feedback_gate_showing_what_was_built_before_collect() -> None:
    run, gate = at_feedback(Script(results={"review.demo.0": DEMO}))
    assert gate.kind == "review_feedback"
    assert gate.answers == ()  # accept, or any findings as text
    assert "review.collect.0" not in run.steps
    for value in DEMO.values():
        assert value in gate.question
    assert dict(gate.context) == {"cycle": 0, **DEMO}
    assert GATE_KINDS.problem("review_feedback", "the login page 500s") is None


def test_accept_goes_on_to_collect_and_triage_with_no_user_finding() -> None:
    run, gate = at_feedback()
    run.send(GateAnswered(gate.gate, "accept", "ann"))
    assert "user" not in run.steps["review.collect.0"].input
    finished = drive(run)
    assert finished.header.completion_mode == "local"
    assert finished.steps["review.triage.0"].input["feedback"] == []


def test_findings_as_text_reach_the_triage() -> None:
    run, gate = at_feedback()
    run.send(GateAnswered(gate.gate, "the button does nothing", "ann"))
    assert run.steps["review.collect.0"].input["user"] == "the button does nothing"
    run.send(StepSucceeded("review.collect.0", {"feedback": ["from the collector"]}))
    triage = run.steps["review.triage.0"].input
    assert triage["feedback"] == ["from the collector", "the button does nothing"]


def test_each_review_round_asks_again_under_its_own_name() -> None:
    finding = {"id": "f1", "text": "typo", "ambiguous": False}
    run = drive(start(FEEDBACK), Script(results={"review.triage.0": {"findings": [finding]}}))
    assert {"review.feedback.0.0", "review.feedback.1.1"} <= run.gate_names


def test_unattended_runs_have_no_feedback_gate() -> None:
    run = drive(start({"project": "demo", "engine": ENGINE, "review_feedback": False}))
    assert not any(name.startswith("review.feedback") for name in run.gate_names)
    assert run.header.completion_mode == "local"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_review_feedback_must_be_a_boolean(value: Any) -> None:
    run = Run()
    with pytest.raises(ValueError, match="review_feedback must be true or false"):
        PROTOCOL.decide(run.state, Started({**FEEDBACK, "review_feedback": value}), NOW)


def test_a_state_stored_before_the_field_decodes_and_encodes_as_it_was() -> None:
    old = encode_state(ProtocolState(started=True))
    assert "review_feedback" not in old
    assert decode_state(old) == ProtocolState(started=True)
    on = ProtocolState(started=True, review_feedback=True)
    assert decode_state(encode_state(on)) == on
