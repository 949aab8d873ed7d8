"""The merge queue (workflows/merge_queue.py) as a pure model, and in the protocol.

Properties: a pass tries the items in their order and merges every clean one whatever conflicts
before it; the passes keep the plan's order; an item gets at most ``max_resolves`` resolve
steps; once nothing is in flight every item is merged, dropped or parked at the gate, and the
queue settles exactly when none is parked. Then the protocol: the steps, gates and ledger
events a conflict makes, and each answer of the gate.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.golden.record import ENGINE, Run
from workflows import merge_queue as mq
from workflows.engine import (
    Fail,
    GateAnswered,
    OpenGate,
    ScheduleStep,
    Started,
    StepFailed,
    StepSucceeded,
    TransitionPhase,
)
from workflows.job import FailureClass
from workflows.ledger import EventKind
from workflows.merge_queue import Conflict, MergeQueue, ParkItem, Resolve, RunPass, Settled
from workflows.protocol import PROTOCOL, ProtocolState, decode_state, encode_state
from workflows.protocol.ledger import events_for

ITEMS = st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True)


@given(ITEMS, st.data())
def test_a_pass_merges_every_clean_item_in_order_whatever_conflicts(
    order: list[str], data: st.DataObject
) -> None:
    bad = data.draw(st.sets(st.sampled_from(order)))
    tried: list[str] = []

    def merge(item: str) -> Conflict | None:
        tried.append(item)
        return Conflict(item, (f"{item}.txt",)) if item in bad else None

    done = mq.merge_pass(order, merge)
    assert tried == order  # one at a time, in order, each once
    assert done.merged == tuple(i for i in order if i not in bad)
    assert tuple(c.item for c in done.conflicts) == tuple(i for i in order if i in bad)


def _subsequence(part: tuple[str, ...], whole: list[str]) -> bool:
    it = iter(whole)
    return all(item in it for item in part)


class World:
    """The queue driven as the protocol drives it, against an adversary that decides which
    merges conflict, which resolves succeed and what the person answers."""

    def __init__(self, data: st.DataObject, order: list[str], max_resolves: int) -> None:
        self.data, self.order, self.max_resolves = data, order, max_resolves
        self.queue: MergeQueue | None = None
        self.merged: set[str] = set()
        self.dropped: set[str] = set()
        self.resolving: set[str] = set()
        self.gates: set[str] = set()
        self.resolves: Counter[str] = Counter()
        self.in_pass: tuple[str, ...] | None = tuple(order)  # the cycle's first pass
        self.verified = False
        self.held: set[str] = set()
        self.settled = False
        self.answers_left = data.draw(st.integers(0, 4), label="answers")

    def merge(self, item: str) -> Conflict | None:
        if item in self.merged or not self.data.draw(st.booleans(), label=f"conflict {item}"):
            self.merged.add(item)
            return None
        return Conflict(item, ("shared.txt",))

    def act(self, actions: tuple[mq.Action, ...]) -> None:
        for action in actions:
            match action:
                case Resolve(item=item):
                    assert item not in self.resolving | self.gates | self.dropped
                    self.resolving.add(item)
                    self.resolves[item] += 1
                    assert self.resolves[item] <= self.max_resolves
                case ParkItem(item=item):
                    assert item not in self.gates | self.dropped
                    self.gates.add(item)
                case RunPass(items=items):
                    assert self.in_pass is None, "one pass at a time"
                    assert _subsequence(items, self.order), "the plan's order"
                    assert not set(items) & (self.dropped | self.gates | self.resolving)
                    self.in_pass, self.verified = items, False
                case Settled():
                    assert self.in_pass is None and not self.resolving and not self.gates
                    self.settled = True

    def choices(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.in_pass is not None:
            out.append(("integrate" if self.verified else "verify", ""))
        out += [("resolve", item) for item in sorted(self.resolving)]
        if self.answers_left:
            out += [("gate", item) for item in sorted(self.gates)]
        return out

    def step(self, what: str, item: str) -> None:
        if what == "verify":
            assert self.in_pass is not None
            done = mq.merge_pass(self.in_pass, self.merge)
            self.verified, self.held = True, {c.item for c in done.conflicts}
            if done.conflicts:
                self.queue = self.queue or mq.start(self.order, self.max_resolves)
                self.queue, actions = mq.conflicted(self.queue, done.conflicts)
                self.act(actions)
        elif what == "integrate":
            assert self.in_pass is not None
            # integrate closes the pass: what verify held out stays out (actors/worktrees.py)
            done = mq.merge_pass(self.in_pass, lambda i: Conflict(i) if i in self.held else None)
            self.in_pass = None
            if self.queue is None and not done.conflicts:
                self.act((Settled(),))
                return
            queue = self.queue or mq.start(self.order, self.max_resolves)
            queue, first = mq.conflicted(queue, done.conflicts)
            self.queue, after = mq.pass_done(queue)
            self.act(first + after)
        elif what == "resolve":
            assert self.queue is not None
            self.resolving.discard(item)
            if self.data.draw(st.booleans(), label=f"resolve {item} succeeds"):
                idle = not self.queue.in_pass
                self.queue, actions = mq.resolved(self.queue, item)
                if idle:  # never held back by a gate or another resolve
                    assert any(isinstance(a, RunPass) for a in actions)
            else:
                self.queue, actions = mq.resolve_failed(self.queue, item, Conflict(item))
            self.act(actions)
        else:
            assert self.queue is not None
            answer = self.data.draw(st.sampled_from([mq.RESOLVED, mq.DROP]), label="answer")
            self.answers_left -= 1
            self.gates.discard(item)
            if answer == mq.DROP:
                self.dropped.add(item)
            self.queue, actions = mq.answered(self.queue, item, answer)
            self.act(actions)


@settings(max_examples=300, deadline=None)
@given(ITEMS, st.integers(0, 3), st.data())
def test_the_queue_keeps_order_is_fair_bounded_and_ends_every_item(
    order: list[str], max_resolves: int, data: st.DataObject
) -> None:
    world = World(data, order, max_resolves)
    for _ in range(1000):
        choices = world.choices()
        if not choices:
            break
        what, item = data.draw(st.sampled_from(choices), label="event")
        world.step(what, item)
    else:
        raise AssertionError("the queue never came to rest")
    assert set(order) == world.merged | world.dropped | world.gates  # merged, dropped, parked
    assert not (world.merged & world.dropped)
    assert all(n <= max_resolves for n in world.resolves.values())
    assert world.settled == (not world.gates)
    if world.queue is not None:
        assert set(world.queue.parked) == world.gates
        assert set(world.queue.dropped) == world.dropped


def test_a_resolved_item_is_not_held_back_by_a_parked_one() -> None:
    queue, actions = mq.conflicted(
        mq.start(["a", "b", "c"], max_resolves=1), [Conflict("a"), Conflict("b")]
    )
    assert [type(a) for a in actions] == [Resolve, Resolve]
    queue, _ = mq.pass_done(queue)
    queue, actions = mq.resolve_failed(queue, "a", Conflict("a"))
    assert actions == (ParkItem("a", 1, Conflict("a"), new=False),)
    queue, actions = mq.resolved(queue, "b")
    assert actions == (RunPass(1, ("b", "c")),)  # a is parked: the pass goes on without it


# --- in the protocol ------------------------------------------------------------------------

PLAN = [{"id": "a", "title": "alpha"}, {"id": "b", "title": "bravo"}, {"id": "c", "title": "cs"}]


def _build(run: Run) -> None:
    """Drive a workflow to the verify of BUILD cycle 0 with items a, b, c."""
    run.send(Started({"engine": dict(ENGINE)}))
    for _ in range(50):
        if "build.verify.0" in run.steps:
            return
        for gate, opened in list(run.gates.items()):
            answer = "accept" if "accept" in opened.answers else opened.answers[0]
            run.send(GateAnswered(gate, "no" if "no" in opened.answers else answer, "t"))
        for step in run.runnable():
            run.send(StepSucceeded(step.step, _result(step)))
    raise AssertionError("never reached build.verify.0")


def _result(step: ScheduleStep) -> dict[str, Any]:
    match step.kind:
        case "design.interview":
            return {"questions": []}
        case "design.spec":
            return {"spec": "the spec"}
        case "build.decompose":
            return {"work_items": PLAN}
        case "build.implement":
            return {"status": "done"}
    return {}


CONFLICT = {"item": "b", "files": ["app.txt"], "against": ["a"]}


def _conflict_pass(run: Run) -> tuple[Any, ...]:
    _build(run)
    verify = {"passed": False, "merged": ["a", "c"], "conflicts": [CONFLICT]}
    commands = run.send(StepSucceeded("build.verify.0", verify))
    integrate = {"branch": "vibey/integration", "merged": ["a", "c"], "conflicts": [CONFLICT]}
    assert run.send(StepSucceeded("build.integrate.0", integrate)) == ()  # holds: b is out
    return commands


def test_a_conflict_goes_to_build_resolve_with_both_sides_intent() -> None:
    run = Run()
    commands = _conflict_pass(run)
    [resolve] = [c for c in commands if isinstance(c, ScheduleStep)]
    assert (resolve.step, resolve.kind, resolve.subject) == (
        "build.resolve.0.b.1",
        "build.resolve",
        "b",
    )
    assert resolve.input["item"] == {"id": "b", "title": "bravo"}
    assert resolve.input["files"] == ["app.txt"]
    assert resolve.input["against"] == [{"id": "a", "title": "alpha"}]
    raised = events_for(StepSucceeded("build.verify.0", {}), commands)
    [finding] = [e for e in raised if e.kind is EventKind.FindingRaised]
    assert finding.payload["id"] == "conflict:0.b.1"
    assert (finding.payload["item"], finding.payload["files"]) == ("b", ["app.txt"])
    # resolved: b re-enters the queue, a pass merges it, its tests pass, REVIEW follows
    done = StepSucceeded("build.resolve.0.b.1", {"resolved": True, "attempt": 1, "commit": "x"})
    commands = run.send(done)
    assert [c.step for c in commands if isinstance(c, ScheduleStep)] == [
        "build.verify.0.q1",
        "build.integrate.0.q1",
    ]
    assert commands[0].input["items"] == ["a", "b", "c"]  # type: ignore[union-attr]
    closed = events_for(done, ())
    assert closed[0].kind is EventKind.FindingResolved
    assert closed[0].payload == {
        "closes": "conflict:0.b.1",
        "resolution": "engine",
        "round": 1,
        "attempt": 1,
    }
    assert run.send(StepSucceeded("build.verify.0.q1", {"passed": True})) == ()
    integrated = {"branch": "vibey/integration", "merged": ["a", "b", "c"]}
    commands = run.send(StepSucceeded("build.integrate.0.q1", integrated))
    assert TransitionPhase("review", 0) in commands
    assert run.state.merge is None and run.state.plan == ()


def _parked(run: Run) -> OpenGate:
    _conflict_pass(run)
    commands = run.send(StepFailed("build.resolve.0.b.1", FailureClass.WORK, "markers left"))
    [gate] = [c for c in commands if isinstance(c, OpenGate)]
    assert gate.gate == "build.merge_conflict.0.b.1" and gate.kind == "merge_conflict"
    assert gate.answers == ("resolved", "drop", "abandon")
    assert gate.context["files"] == ["app.txt"] and gate.context["new_conflict"] is False
    return gate


def test_answered_resolved_the_item_re_enters_the_queue() -> None:
    run = Run()
    gate = _parked(run)
    answer = GateAnswered(gate.gate, "resolved", "ann")
    commands = run.send(answer)
    assert next(c.step for c in commands if isinstance(c, ScheduleStep)) == "build.verify.0.q1"
    assert commands[0].input["items"] == ["a", "b", "c"]  # type: ignore[union-attr]
    resolved = [e.payload for e in events_for(answer, ()) if e.kind is EventKind.FindingResolved]
    assert resolved == [{"closes": "conflict:0.b.1", "resolution": "hand", "by": "ann"}]


def test_answered_drop_the_item_leaves_the_cycle() -> None:
    run = Run()
    gate = _parked(run)
    answer = GateAnswered(gate.gate, "drop", "ann")
    commands = run.send(answer)
    assert commands[0].input["items"] == ["a", "c"]  # type: ignore[union-attr]
    resolved = [e.payload for e in events_for(answer, ()) if e.kind is EventKind.FindingResolved]
    assert resolved == [{"closes": "conflict:0.b.1", "resolution": "dropped", "by": "ann"}]
    run.send(StepSucceeded("build.verify.0.q1", {"passed": True}))
    done = run.send(StepSucceeded("build.integrate.0.q1", {"branch": "vibey/integration"}))
    assert TransitionPhase("review", 0) in done


def test_answered_abandon_the_workflow_fails() -> None:
    run = Run()
    gate = _parked(run)
    commands = run.send(GateAnswered(gate.gate, "abandon", "ann"))
    assert len(commands) == 1 and isinstance(commands[0], Fail)
    assert run.header.status.value == "failed"


def test_spent_resolves_park_a_new_conflict_at_once() -> None:
    run = Run()
    _conflict_pass(run)
    for n in (1, 2):
        run.send(StepSucceeded(f"build.resolve.0.b.{n}", {"resolved": True}))
        verify = {"passed": False, "conflicts": [CONFLICT]}
        commands = run.send(StepSucceeded(f"build.verify.0.q{n}", verify))
        run.send(StepSucceeded(f"build.integrate.0.q{n}", {"branch": "vibey/integration"}))
        if n == 1:
            assert [c.step for c in commands] == ["build.resolve.0.b.2"]  # type: ignore[union-attr]
    [gate] = [c for c in commands if isinstance(c, OpenGate)]
    assert gate.gate == "build.merge_conflict.0.b.3" and gate.context["new_conflict"] is True
    raised = events_for(StepSucceeded("build.verify.0.q2", {}), commands)
    assert [e.kind for e in raised][-2:] == [EventKind.FindingRaised, EventKind.QuestionAsked]


def test_a_state_with_a_queue_round_trips_and_one_without_encodes_as_before() -> None:
    run = Run()
    _conflict_pass(run)
    state = run.state
    assert state.merge is not None and state.plan
    assert decode_state(encode_state(state)) == state
    assert "merge" not in encode_state(ProtocolState()) and "plan" not in encode_state(
        ProtocolState()
    )
    assert PROTOCOL.decode_state(PROTOCOL.encode_state(state)) == state
