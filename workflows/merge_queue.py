"""The merge queue of a BUILD cycle: its items merge into the integrated tree one at a time, in
the plan's order, and an item that conflicts goes to an engine (``build.resolve``), not to a
failure of the work.

Two halves, both pure:

* :func:`merge_pass` is one pass over the queue (the handlers run it with git): each item is
  tried in order, a clean one merges, a conflicting one is reported and skipped, so **a clean
  item is never held back by one that conflicts**;
* :class:`MergeQueue` is the protocol's bookkeeping between passes. Each event
  (:func:`conflicted`, :func:`pass_done`, :func:`resolved`, :func:`resolve_failed`,
  :func:`answered`) returns the new queue and what to do next (:data:`Action`): resolve an item
  (:class:`Resolve`), park it behind the ``build.merge_conflict`` gate (:class:`ParkItem`),
  run another pass (:class:`RunPass`), or go on to REVIEW (:class:`Settled`).

The bounds: an item gets at most ``max_resolves`` resolve steps in a cycle; a conflict met after
that parks it at the gate, whose answer is ``resolved`` (a person merged by hand: the item
re-enters the queue), ``drop`` (the item leaves the cycle) or ``abandon`` (the protocol fails the
workflow). Every item ends merged, dropped, or parked at the gate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeAlias

MAX_RESOLVES = 2  # resolve steps an item gets in a cycle before a conflict parks it
RESOLVED, DROP, ABANDON = "resolved", "drop", "abandon"
ANSWERS: tuple[str, ...] = (RESOLVED, DROP, ABANDON)

Counts: TypeAlias = tuple[tuple[str, int], ...]  # sorted (item, n) pairs


@dataclass(frozen=True, slots=True)
class Conflict:
    """An item whose branch does not merge into the integrated tree: the files in conflict,
    and the items already integrated that changed them (the other side's intent)."""

    item: str
    files: tuple[str, ...] = ()
    against: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Pass:
    """What one pass did: the items merged (or already merged) and the conflicts, in order."""

    merged: tuple[str, ...] = ()
    conflicts: tuple[Conflict, ...] = ()


def merge_pass(order: Sequence[str], merge: Callable[[str], Conflict | None]) -> Pass:
    """Tries each item of ``order`` once, in that order: ``merge(item)`` merges it and returns
    ``None``, or leaves the tree as it was and returns the :class:`Conflict`. A conflict never
    stops the pass."""
    merged: list[str] = []
    conflicts: list[Conflict] = []
    for item in order:
        conflict = merge(item)
        if conflict is None:
            merged.append(item)
        else:
            conflicts.append(conflict)
    return Pass(tuple(merged), tuple(conflicts))


# --- what the protocol does next ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resolve:
    """Schedule resolve step ``number`` of ``item`` (its ``number``-th conflict this cycle)."""

    item: str
    number: int
    conflict: Conflict


@dataclass(frozen=True, slots=True)
class ParkItem:
    """Open the gate for ``item``'s conflict ``number``. ``new``: the conflict was just met (the
    resolves are spent); otherwise the resolve step of that conflict failed for good."""

    item: str
    number: int
    conflict: Conflict
    new: bool


@dataclass(frozen=True, slots=True)
class RunPass:
    """Schedule pass ``number`` (build.verify, then build.integrate) over ``items``."""

    number: int
    items: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Settled:
    """The last pass merged every item still in the cycle and its tests passed: on to REVIEW."""


Action: TypeAlias = Resolve | ParkItem | RunPass | Settled


@dataclass(frozen=True, slots=True)
class MergeQueue:
    """A cycle's queue once an item conflicted. ``order`` is the plan's order; an item is in at
    most one of ``dropped``, ``resolving`` (a resolve step in flight), ``parked`` (at the gate)
    and ``waiting`` (resolved, for the next pass); the others are merged or in the pass.
    ``conflicts`` counts each item's conflicts (they name the steps and gates), ``resolves``
    its resolve steps; ``passes`` the passes run after the cycle's first; ``in_pass`` whether
    one is in flight and ``pass_conflicted`` whether the current (or last) one met a conflict."""

    order: tuple[str, ...]
    max_resolves: int = MAX_RESOLVES
    dropped: tuple[str, ...] = ()
    resolving: tuple[str, ...] = ()
    parked: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    conflicts: Counts = ()
    resolves: Counts = ()
    passes: int = 0
    in_pass: bool = True
    pass_conflicted: bool = False

    def held(self, item: str) -> bool:
        """Whether ``item`` is out of the passes (dropped, resolving, parked or waiting)."""
        return item in (*self.dropped, *self.resolving, *self.parked, *self.waiting)

    def pass_items(self) -> tuple[str, ...]:
        """The items a new pass tries: the order, less those dropped, resolving or parked."""
        out = (*self.dropped, *self.resolving, *self.parked)
        return tuple(item for item in self.order if item not in out)

    def settled(self) -> bool:
        """Nothing left to do: no pass, resolve or gate in flight, and the last pass clean."""
        busy = self.in_pass or self.resolving or self.parked or self.waiting
        return not busy and not self.pass_conflicted


Step: TypeAlias = tuple[MergeQueue, tuple[Action, ...]]


def count(counts: Counts, item: str) -> int:
    return dict(counts).get(item, 0)


def _bump(counts: Counts, item: str) -> Counts:
    bumped = dict(counts)
    bumped[item] = bumped.get(item, 0) + 1
    return tuple(sorted(bumped.items()))


def _without(items: tuple[str, ...], item: str) -> tuple[str, ...]:
    return tuple(i for i in items if i != item)


def start(order: Iterable[str], max_resolves: int = MAX_RESOLVES) -> MergeQueue:
    """The queue of a cycle whose first pass (in flight) met a conflict."""
    if max_resolves < 0:
        raise ValueError(f"max_resolves must be >= 0, got {max_resolves}")
    return MergeQueue(order=tuple(dict.fromkeys(order)), max_resolves=max_resolves)


def conflicted(queue: MergeQueue, conflicts: Iterable[Conflict]) -> Step:
    """The pass in flight met ``conflicts``: each item not already held out gets a resolve
    step, or once its resolves are spent, the gate. Unknown items are ignored."""
    actions: list[Action] = []
    for conflict in conflicts:
        item = conflict.item
        if item not in queue.order:
            continue
        queue = replace(queue, pass_conflicted=True)
        if queue.held(item):
            continue
        queue = replace(queue, conflicts=_bump(queue.conflicts, item))
        number = count(queue.conflicts, item)
        if count(queue.resolves, item) < queue.max_resolves:
            queue = replace(
                queue,
                resolving=(*queue.resolving, item),
                resolves=_bump(queue.resolves, item),
            )
            actions.append(Resolve(item, number, conflict))
        else:
            queue = replace(queue, parked=(*queue.parked, item))
            actions.append(ParkItem(item, number, conflict, new=True))
    return queue, tuple(actions)


def pass_done(queue: MergeQueue) -> Step:
    """The pass in flight finished (its integrate succeeded)."""
    return _next(replace(queue, in_pass=False))


def resolved(queue: MergeQueue, item: str) -> Step:
    """``item``'s resolve step succeeded: it re-enters the queue."""
    if item not in queue.resolving:
        return queue, ()
    return _next(
        replace(queue, resolving=_without(queue.resolving, item), waiting=_waits(queue, item))
    )


def resolve_failed(queue: MergeQueue, item: str, conflict: Conflict) -> Step:
    """``item``'s resolve step failed for good: it parks at the gate of the same conflict."""
    if item not in queue.resolving:
        return queue, ()
    parked = replace(queue, resolving=_without(queue.resolving, item), parked=(*queue.parked, item))
    return parked, (ParkItem(item, count(queue.conflicts, item), conflict, new=False),)


def answered(queue: MergeQueue, item: str, answer: str) -> Step:
    """The gate of parked ``item`` was answered ``resolved`` (it re-enters the queue) or
    ``drop`` (it leaves the cycle). ``abandon`` is the protocol's: it ends the workflow."""
    if item not in queue.parked or answer not in (RESOLVED, DROP):
        return queue, ()
    rest = replace(queue, parked=_without(queue.parked, item))
    if answer == RESOLVED:
        return _next(replace(rest, waiting=_waits(rest, item)))
    return _next(replace(rest, dropped=(*rest.dropped, item)))


def _waits(queue: MergeQueue, item: str) -> tuple[str, ...]:
    return (*_without(queue.waiting, item), item)


def _next(queue: MergeQueue) -> Step:
    """Between passes: run one for what waits (never held back by a gate or a resolve still
    running), settle once nothing is left, otherwise wait."""
    if queue.in_pass:
        return queue, ()
    if queue.waiting or (queue.pass_conflicted and not (queue.resolving or queue.parked)):
        number = queue.passes + 1
        running = replace(queue, passes=number, in_pass=True, pass_conflicted=False, waiting=())
        return running, (RunPass(number, running.pass_items()),)
    if queue.settled():
        return queue, (Settled(),)
    return queue, ()
