"""What a decision implies (workflows/effects.py): pure values the store only writes."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from workflows.effects import blocked, effects, settled_event, unblocked
from workflows.engine import (
    Complete,
    Fail,
    Header,
    OpenGate,
    ScheduleStep,
    StartTimer,
    Status,
    StepFailed,
    StepSucceeded,
    TimerFired,
)
from workflows.job import TIMER_KIND, FailureClass, JobState
from workflows.kinds import StepKind, StepKinds

KINDS = StepKinds([StepKind("a.b", lease=timedelta(minutes=7))])
RUNNING = Header("p", 1)
statuses = st.sampled_from(list(Status))


def test_steps_timers_and_gates_become_rows() -> None:
    commands = (
        ScheduleStep("s1", "a.b", subject="x", input={"i": 1}, max_attempts=2),
        ScheduleStep("s2", "c.d", after=("s1",)),
        StartTimer("soak", timedelta(seconds=3)),
        OpenGate("g", "approval", "ok?"),
    )
    implied = effects("w1", RUNNING, RUNNING, commands, KINDS)
    s1, s2, timer = implied.steps
    assert (s1.name, s1.subject, s1.max_attempts, s1.lease) == (
        "s1",
        "w1/s1",
        2,
        timedelta(minutes=7),
    )
    assert s1.payload == {"workflow_id": "w1", "step": "s1", "subject": "x", "input": {"i": 1}}
    assert (s2.after, s2.lease) == (("s1",), None)  # a kind nobody declared: the default lease
    assert (timer.kind, timer.name, timer.delay) == (TIMER_KIND, "timer:soak", timedelta(seconds=3))
    assert timer.payload["timer"] == "soak" and timer.cycle == 1
    assert implied.gates == (commands[3],)
    assert implied.wind_down is None


@given(statuses, statuses)
def test_a_workflow_winds_down_once_on_finishing(before: Status, after: Status) -> None:
    implied = effects("w", Header("p", status=before), Header("p", status=after), (), KINDS)
    if after.finished and not before.finished:
        assert implied.wind_down is not None
        assert implied.wind_down.cancel_steps is (after is not Status.COMPLETED)
        assert implied.wind_down.why.startswith(f"workflow {after.value}")
    else:
        assert implied.wind_down is None


def test_wind_down_says_why() -> None:
    failed = Header("p", status=Status.FAILED, reason="boom")
    implied = effects("w", RUNNING, failed, (Fail("boom"),), KINDS)
    assert (
        implied.wind_down is not None
        and implied.wind_down.closing == "(closed: workflow failed: boom)"
    )
    done = effects("w", RUNNING, Header("p", status=Status.COMPLETED), (Complete("m"),), KINDS)
    assert done.wind_down is not None and not done.wind_down.cancel_steps


def test_what_a_settle_records() -> None:
    ok = settled_event("a.b", "s", {}, JobState.SUCCEEDED, result={"r": 1})
    assert ok.event == StepSucceeded("s", {"r": 1}) and ok.cancel_dependents is None
    fired = settled_event(TIMER_KIND, "timer:t", {"timer": "t"}, JobState.SUCCEEDED)
    assert fired.event == TimerFired("t")
    gone = settled_event("a.b", "s", {}, JobState.FAILED, failure=(FailureClass.WORK, "no"))
    assert gone.event == StepFailed("s", FailureClass.WORK, "no")
    assert gone.cancel_dependents == "cancelled: step s failed for good"
    for state in (JobState.READY, JobState.AWAITING_HUMAN, None):
        assert settled_event("a.b", "s", {}, state).event is None


@given(st.integers(1, 10**6), st.text(max_size=3000))
def test_the_one_block_path(seq: int, error: str) -> None:
    block = blocked(Header("p", 2, completion_mode=None), seq, error, nonce="n1")
    assert block.header.status is Status.BLOCKED and block.header.reason == error[:2000]
    assert (block.header.phase, block.header.cycle) == ("p", 2)
    assert block.gate.kind == "workflow_error" and block.gate.gate == f"workflow_error.{seq}.n1"
    assert block.gate.answers == ("retry", "cancel")
    assert unblocked(block.header) == Header("p", 2)
