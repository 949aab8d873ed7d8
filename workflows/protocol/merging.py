"""BUILD's merge queue in the protocol (:mod:`workflows.merge_queue` does the bookkeeping).

A cycle without conflicts never comes here: build.verify merges every item, build.integrate
follows and REVIEW starts, as it always did. Once a pass reports conflicts (its build.verify's
or build.integrate's result ``conflicts``), the cycle has a :class:`MergeQueue` in the state,
and its actions become commands:

* :class:`Resolve` → ``build.resolve.<cycle>.<item>.<n>`` in the item's worktree, with both
  sides' intent from the plan (the item's title, and the titles of the items already
  integrated that changed the conflicting files);
* :class:`ParkItem` → the ``build.merge_conflict.<cycle>.<item>.<n>`` gate (``resolved``,
  ``drop``, ``abandon``);
* :class:`RunPass` → ``build.verify.<cycle>.q<n>`` then ``build.integrate.<cycle>.q<n>``;
* :class:`Settled` → REVIEW.

The conflict's ledger id is ``conflict:<cycle>.<item>.<n>`` (``workflows.protocol.ledger``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from workflows import merge_queue as mq
from workflows.engine import Decision
from workflows.merge_queue import Action, Conflict, MergeQueue, ParkItem, Resolve, RunPass
from workflows.protocol.enter import enter_review
from workflows.protocol.kinds import (
    BUILD_INTEGRATE,
    BUILD_RESOLVE,
    BUILD_VERIFY,
    MERGE_CONFLICT_GATE,
)
from workflows.protocol.plan import Out, Plan, fail, open_gate, schedule, unchanged
from workflows.protocol.state import Gate, Pending, ProtocolState

GATE_ROLE = "build.merge_conflict"


def conflict_id(cycle: int, item: str, number: int) -> str:
    return f"conflict:{cycle}.{item}.{number}"


def queue_of(state: ProtocolState) -> MergeQueue:
    """The cycle's queue; a new one (its first pass in flight) when none was needed yet."""
    if state.merge is not None:
        return state.merge
    return mq.start(state.items)


def on_conflicts(state: ProtocolState, conflicts: Sequence[Conflict]) -> Out:
    """A pass met ``conflicts``: resolve or park each item not already held out."""
    queue, actions = mq.conflicted(queue_of(state), conflicts)
    return run(state, queue, actions)


def pass_done(state: ProtocolState, conflicts: Sequence[Conflict]) -> Out:
    """The pass's build.integrate succeeded (reporting ``conflicts``, if any)."""
    queue, first = mq.conflicted(queue_of(state), conflicts)
    queue, after = mq.pass_done(queue)
    return run(state, queue, first + after)


def resolved(state: ProtocolState, pending: Pending, result: Mapping[str, Any]) -> Out:
    """build.resolve succeeded: its item re-enters the queue."""
    if state.merge is None:
        return unchanged(state)
    queue, actions = mq.resolved(state.merge, pending.subject)
    return run(state, queue, actions)


def resolve_failed(state: ProtocolState, pending: Pending, detail: str) -> Out:
    """build.resolve failed for good: its item parks at the gate of its conflict."""
    if state.merge is None:
        return unchanged(state)
    files = pending.input.get("files")
    conflict = Conflict(
        pending.subject, tuple(files) if isinstance(files, list) else (), _against(pending)
    )
    queue, actions = mq.resolve_failed(state.merge, pending.subject, conflict)
    return run(state, queue, actions, note=detail)


def answered(state: ProtocolState, gate: Gate, answer: str) -> Out:
    """``resolved``: the item re-enters the queue; ``drop``: it leaves the cycle;
    ``abandon``: the workflow fails."""
    if answer == mq.ABANDON:
        return fail(state, f"abandoned at {gate.name}: {gate.note}")
    if state.merge is None:  # pragma: no cover - the gate opens only with a queue
        return unchanged(state)
    queue, actions = mq.answered(state.merge, gate.ref, answer)
    return run(state, queue, actions)


def _against(pending: Pending) -> tuple[str, ...]:
    against = pending.input.get("against")
    if not isinstance(against, list):
        return ()
    return tuple(
        a["id"] for a in against if isinstance(a, Mapping) and isinstance(a.get("id"), str)
    )


def run(state: ProtocolState, queue: MergeQueue, actions: Sequence[Action], note: str = "") -> Out:
    """The queue's actions as commands, in order, on the state holding ``queue``."""
    out = unchanged(replace(state, merge=queue))
    for action in actions:
        step = _act(out.state, action, note)
        out = Decision(step.state, out.commands + step.commands)
    return out


def _act(state: ProtocolState, action: Action, note: str) -> Out:
    match action:
        case Resolve():
            return _resolve(state, action)
        case ParkItem():
            return _park(state, action, note)
        case RunPass(number=number, items=items):
            c, given = state.cycle, {"items": list(items)}
            verify = f"{BUILD_VERIFY}.{c}.q{number}"
            return schedule(
                state,
                Plan(verify, BUILD_VERIFY, given),
                Plan(f"{BUILD_INTEGRATE}.{c}.q{number}", BUILD_INTEGRATE, given, after=(verify,)),
            )
        case _:
            return enter_review(state, state.cycle)


def _intent(state: ProtocolState, item: str) -> dict[str, str]:
    return {"id": item, "title": dict(state.plan).get(item, item)}


def _resolve(state: ProtocolState, action: Resolve) -> Out:
    c, item, n = state.cycle, action.item, action.number
    given = {
        "item": _intent(state, item),
        "files": list(action.conflict.files),
        "against": [_intent(state, other) for other in action.conflict.against],
        "round": n,
        "conflict": conflict_id(c, item, n),
    }
    return schedule(state, Plan(f"{BUILD_RESOLVE}.{c}.{item}.{n}", BUILD_RESOLVE, given, item))


def _park(state: ProtocolState, action: ParkItem, note: str) -> Out:
    c, item, n = state.cycle, action.item, action.number
    files = list(action.conflict.files)
    spent = (
        f"its {state.merge.max_resolves if state.merge else 0} resolve step(s) are spent"
        if action.new
        else f"its resolve step failed: {note[:300]}"
    )
    why = f"item {item} conflicts with the integrated tree in {', '.join(files) or '?'}; {spent}"
    gate = Gate(
        name=f"{GATE_ROLE}.{c}.{item}.{n}", role=GATE_ROLE, answers=mq.ANSWERS, ref=item, note=why
    )
    question = (
        f"Work item {item} ({_intent(state, item)['title']}) of cycle {c} does not merge: "
        f"{why}. Answer resolved once you merged vibey/integration into its branch "
        f"vibey/c{c}/{item} by hand (in its worktree, worktrees/c{c}-{item}) and committed; "
        "drop to leave it out of the cycle; abandon to fail the workflow."
    )
    context = {
        "item": item,
        "title": _intent(state, item)["title"],
        "files": files,
        "against": [_intent(state, other) for other in action.conflict.against],
        "branch": f"vibey/c{c}/{item}",
        "conflict": conflict_id(c, item, n),
        "new_conflict": action.new,
    }
    return open_gate(state, gate, MERGE_CONFLICT_GATE, question, context)
