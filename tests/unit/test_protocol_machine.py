"""The protocol as a state machine: hypothesis drives apply()/decide() with contract-valid but
arbitrary results, failures, answers, timers and cancels, and after every event checks that

(a) a finished workflow absorbs everything (no command, no state change);
(b) DONE is still reachable: a cooperative driver completes it within a bounded number of
    events (unless it was cancelled or failed);
(c) no step (and no gate) name is ever used twice (the driver raises on it);
(d) replaying the recorded history reproduces the state and the header exactly;
(e) the state survives its JSON codec unchanged;

and that an event about a step or gate that is not in flight changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.golden.record import Script, drive, next_event, start
from workflows.engine import (
    CancelRequested,
    Event,
    GateAnswered,
    ScheduleStep,
    StepFailed,
    StepSucceeded,
    TimerFired,
    replay,
)
from workflows.job import FailureClass
from workflows.protocol import PROTOCOL
from workflows.protocol.results import DEPLOY_FAILURES, ROUTES

COOPERATIVE_LIMIT = 150
# Where a run may begin (reached cooperatively, opting in), so 40 steps reach every phase.
STARTS = ["design", "build", "review", "deploy_design", "deploy_execute", "deploy_review"]
OPTING_IN = Script(answers={"visual.opt_in": "yes", "deployment.opt_in": "yes"})

ids = st.sampled_from(["a", "b", "c", "d"])
texts = st.text(alphabet="abcxyz ?", min_size=1, max_size=8)
choices = st.lists(st.sampled_from(["yes", "no", "maybe"]), max_size=3, unique=True)


def rarely(strategy: st.SearchStrategy[Any], otherwise: Any) -> st.SearchStrategy[Any]:
    """``strategy`` one time in four, else ``otherwise``: runs make progress and go deep."""
    return st.integers(0, 3).flatmap(lambda n: strategy if n == 1 else st.just(otherwise))


@st.composite
def questions(draw: st.DrawFn) -> dict[str, Any]:
    picked = draw(rarely(st.lists(ids, min_size=1, max_size=3, unique=True), []))
    asked = [{"id": i, "question": f"{i}?", "answers": draw(choices)} for i in picked]
    return {"questions": asked}


@st.composite
def work_items(draw: st.DrawFn) -> dict[str, Any]:
    picked = draw(st.lists(ids, min_size=1, max_size=3, unique=True))
    return {"work_items": [{"id": i, "title": i.upper()} for i in picked]}


@st.composite
def implemented(draw: st.DrawFn, item: str) -> dict[str, Any]:
    if draw(rarely(st.booleans(), False)):
        return {"item": item, "status": "ambiguous", "question": draw(texts)}
    return {"item": item, "status": "done", "branch": "b", "commit": "c"}


@st.composite
def findings(draw: st.DrawFn) -> dict[str, Any]:
    found = draw(rarely(st.lists(st.tuples(ids, texts, st.booleans()), min_size=1, max_size=2), []))
    return {"findings": [{"id": i, "text": t, "ambiguous": a} for i, t, a in found]}


def result_for(step: ScheduleStep) -> st.SearchStrategy[dict[str, Any]]:
    """Contract-valid results for ``step``'s kind (docs/protocol.md, "Results by kind")."""
    fixed: dict[str, dict[str, Any]] = {
        "design.spec": {"spec": "s"},
        "deploy.spec": {"spec": "d"},
        "visual.plan": {"plan": "p"},
        "build.verify": {"passed": True},
        "build.integrate": {"branch": "main", "merged": [], "commit": "c"},
        "review.deployment_choice": {"question": "Deploy?", "recommendation": "deploy"},
        "deploy.execute": {"deployed": True, "url": "https://x.example"},
    }
    match step.kind:
        case "design.interview" | "deploy.interview":
            return questions()
        case "build.decompose":
            return work_items()
        case "build.implement":
            return implemented(step.subject)
        case "review.collect":
            return st.builds(lambda f: {"feedback": f}, st.lists(texts, max_size=2))
        case "review.triage":
            return findings()
        case "deploy.triage":
            failures = st.sampled_from(sorted(DEPLOY_FAILURES))
            return rarely(failures, None).map(lambda f: {"failure": f})
        case "deploy.route":
            return rarely(st.sampled_from(ROUTES), "done").map(lambda r: {"route": r})
        case kind:
            return st.just(fixed.get(kind, {"note": "ok"}))


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.run = start()
        self.cancelled = False

    @initialize(phase=st.sampled_from(STARTS))
    def begin_in(self, phase: str) -> None:
        while self.run.state.phase != phase:
            event = next_event(self.run, OPTING_IN)
            assert event is not None, PROTOCOL.describe(self.run.state)
            self.send(event)

    # -- rules: what the store and the people may do next ---------------------------------

    @precondition(lambda self: bool(self.run.runnable()))
    @rule(data=st.data())
    def succeed_a_step(self, data: st.DataObject) -> None:
        step = data.draw(st.sampled_from(self.run.runnable()), label="step")
        self.send(StepSucceeded(step.step, data.draw(result_for(step), label="result")))

    @precondition(lambda self: bool(self.run.runnable()))
    @rule(data=st.data(), failure=rarely(st.sampled_from(list(FailureClass)), None))
    def fail_a_step(self, data: st.DataObject, failure: FailureClass | None) -> None:
        """Fail a step for good (one time in four; else, succeed one)."""
        if failure is None:
            return self.succeed_a_step(data)
        step = data.draw(st.sampled_from(self.run.runnable()), label="step")
        self.send(StepFailed(step.step, failure, "attempts spent"))

    @precondition(lambda self: bool(self.run.gates))
    @rule(data=st.data())
    def answer_a_gate(self, data: st.DataObject) -> None:
        gate = data.draw(st.sampled_from(list(self.run.gates.values())), label="gate")
        answer = data.draw(
            rarely(st.sampled_from(gate.answers), gate.answers[0]) if gate.answers else texts
        )
        self.send(GateAnswered(gate.gate, answer, "someone"))

    @precondition(lambda self: bool(self.run.timers))
    @rule()
    def fire_a_timer(self) -> None:
        self.send(TimerFired(next(iter(self.run.timers))))

    @rule(dice=st.integers(0, 99))
    def cancel(self, dice: int) -> None:
        """Cancel (one time in a hundred; else nothing happens)."""
        if dice != 37:  # hypothesis favours the bounds: a middle value is the rare one
            return
        self.cancelled = self.cancelled or not self.run.finished
        self.send(CancelRequested("someone", "changed their mind"))

    @precondition(lambda self: bool(self.run.succeeded or self.run.gate_names))
    @rule(data=st.data())
    def send_a_stale_event(self, data: st.DataObject) -> None:
        """A duplicate success, a late answer or a wrong one, an unknown timer: no effect."""
        closed = sorted(self.run.gate_names - set(self.run.gates))
        events: list[Event] = [StepSucceeded(s, {}) for s in sorted(self.run.succeeded)]
        events += [GateAnswered(g, "accept", "late") for g in closed]
        wrong = [g for g in self.run.gates.values() if g.answers]
        events += [GateAnswered(g.gate, "not-an-answer", "x") for g in wrong]
        events += [TimerFired("deploy.soak.99"), StepSucceeded("no.such.step", {})]
        before = self.run.state
        commands = self.send(data.draw(st.sampled_from(events), label="stale"))
        assert commands == ()
        assert self.run.state == before

    def send(self, event: Any) -> tuple[Any, ...]:
        was_finished, before = self.run.finished, self.run.state
        commands = self.run.send(event)  # (c): raises when a step or gate name repeats
        if was_finished:  # (a)
            assert commands == ()
            assert self.run.state == before
        return commands

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def replay_reproduces_the_run(self) -> None:  # (d)
        replayed = replay(PROTOCOL, self.run.history, upto=len(self.run.history))
        assert replayed.state == self.run.state
        assert replayed.header == self.run.header

    @invariant()
    def the_state_round_trips(self) -> None:  # (e)
        encoded = json.loads(json.dumps(PROTOCOL.encode_state(self.run.state)))
        assert PROTOCOL.decode_state(encoded) == self.run.state

    @invariant()
    def done_is_reachable(self) -> None:  # (b)
        if self.run.finished:
            assert self.cancelled or self.run.header.status.value in ("completed", "failed")
            return
        finished = drive(self.run.copy(), limit=COOPERATIVE_LIMIT)
        assert finished.header.status.value == "completed", PROTOCOL.describe(finished.state)


ProtocolMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestProtocolMachine = ProtocolMachine.TestCase
