"""Continue in place: the next step of a workflow on the worker that settled the last one.

When a short step's settle releases a job this process would consume anyway (its queue, its
project), the step runner keeps that job's pointer from the relay and runs the job itself right
after the commit, on the same thread: no broker hop between the two steps. Nothing of the
record changes: the pointer is written to the outbox as always, released in the settle's
transaction (a job the settle's decision inserts is chosen before its insert, which writes the
row released: ``UnitOfWork.hold_next``), and marked sent by the claim of the step that runs it
(fenced on its generation, as a delivery's claim is). A process that dies between the two
leaves the row unsent and unheld, so a reconciler's drain publishes it at its next pass: a cut
chain costs at most one reconcile interval, never a lease.

A chain is bounded (``max_steps``, and ``budget`` seconds of wall time), then its next
pointer goes through the broker as any other, so workflows and lanes take turns. Only the
first released job continues in place; fan-out beyond it goes through the broker, where other
workers share it. Spans, metrics and the ledger are the same on either path: the in-place step
runs through the same claims, handlers and settle as a delivered one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from actors.relay import Router
from store.unit_of_work import OutboxRow, UnitOfWork

DEFAULT_STEPS = 16  # a chain's steps at most ([queue.rabbitmq] in_place_steps)


@dataclass(frozen=True, slots=True)
class InPlace:
    """Which released pointers this process may run in place, and for how long a chain goes.

    ``queues``: the queues the process consumes; ``budget``: seconds of wall time a chain may
    run before its next pointer is published (``[queue.rabbitmq] in_place_ms``)."""

    router: Router
    queues: Collection[str]
    max_steps: int
    budget: float

    def chain(self) -> Chain:
        return Chain(self, deadline=time.monotonic() + self.budget)


@dataclass(slots=True)
class Chain:
    """One delivery's run of in-place steps: how many are left, and the pointer held next."""

    policy: InPlace
    deadline: float
    steps: int = 0
    held: tuple[OutboxRow, str] | None = field(default=None)

    def pick(
        self, pointers: Sequence[OutboxRow], running: object, short: Callable[[str], bool]
    ) -> OutboxRow | None:
        """The first of ``pointers`` this chain may run next (None: publish them all): due,
        not solo, of a kind on the short path (``short``: claim, handler and settle in one
        unit of work), for a queue this process consumes."""
        if self.steps >= self.policy.max_steps or time.monotonic() >= self.deadline:
            return None
        now = datetime.now(UTC)
        for row in pointers:
            if row.job_id == running or row.solo or row.not_before > now:
                continue
            if not short(row.kind):
                continue
            if self.policy.router.queue(row.kind, row.project_id) in self.policy.queues:
                return row
        return None

    def taker(
        self, unit: UnitOfWork, running: object, short: Callable[[str], bool]
    ) -> Callable[[str, str], bool]:
        """What :meth:`UnitOfWork.hold_next` offers a job about to be dispatched at once (due
        now, not solo) in ``unit``: taken when :meth:`pick` would take its pointer and none
        written before it in the unit."""

        def take(kind: str, project_id: str) -> bool:
            if self.steps >= self.policy.max_steps or time.monotonic() >= self.deadline:
                return False
            if (
                not short(kind)
                or self.policy.router.queue(kind, project_id) not in self.policy.queues
            ):
                return False
            return self.pick(unit.pointers, running, short) is None

        return take

    def keep(self, row: OutboxRow) -> None:
        """``row``'s commit landed: its job is this chain's next step."""
        key = self.policy.router.publication(row, datetime.now(UTC)).routing_key
        self.held = (row, key)

    def take(self) -> tuple[OutboxRow, str] | None:
        held, self.held = self.held, None
        if held is not None:
            self.steps += 1
        return held
