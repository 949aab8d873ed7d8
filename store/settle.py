"""A step's settle: the fenced write its handler's outcome asks for, as one store call.

The step actor hands the store the claimed job and the outcome (``workflows.steps``:
``Success``, ``Failure``, ``Defer``, ``Park``); the store picks the fenced write (ack, nack,
defer, park) and, for a workflow's step, records the workflow's event with everything it
decides in the same unit of work (:meth:`store.workflows.WorkflowStore.settle_txn`). Nothing
is handed back and forth: :func:`settle` is one unit of work and one commit (one statement,
on its own connection, when a plain job's write is one), :func:`settle_txn` joins the
caller's (a short step's claim, handler and settle in one transaction).
"""

from __future__ import annotations

from typing import Any

from store.ports import SettlingJobRepository
from store.unit_of_work import UnitOfWork
from workflows.queue import Job, JsonObject, Settled
from workflows.steps import Defer, Failure, Outcome, Park, Success

__all__ = ["event_facts", "settle", "settle_txn"]


def settle_txn(
    jobs: SettlingJobRepository, unit: UnitOfWork, job: Job, outcome: Outcome
) -> Settled:
    """The fenced write ``outcome`` asks for, in the caller's unit of work."""
    lease = job.lease
    match outcome:
        case Success():
            return jobs.ack_txn(unit, lease, result=outcome.result)
        case Failure(failure_class=cls, detail=detail, retry_in=retry_in):
            return jobs.nack_txn(unit, lease, error=detail, failure_class=cls, retry_in=retry_in)
        case Defer(delay=delay, reason=reason, capacity=capacity):
            return jobs.defer_txn(unit, lease, delay=delay, reason=reason, capacity=capacity)
        case Park(gate=gate):
            return jobs.park_txn(unit, lease, gate)


def settle(jobs: SettlingJobRepository, job: Job, outcome: Outcome) -> Settled:
    """The settle in a unit of work of its own, no workflow's event with it. A nack and a
    defer are one statement each: no BEGIN/COMMIT around them (an ack may release dependents,
    a park writes its gate's event and ledger question: a transaction)."""
    with jobs.units.begin(one_statement=is_one_statement(outcome)) as unit:
        return settle_txn(jobs, unit, job, outcome)


def is_one_statement(outcome: Outcome) -> bool:
    """The outcome's fenced write is one statement (a nack, a defer)."""
    return isinstance(outcome, Failure | Defer)


def event_facts(outcome: Outcome) -> tuple[JsonObject, tuple[Any, str] | None, JsonObject | None]:
    """What a workflow's event needs from an outcome: (result, failure, evidence)."""
    match outcome:
        case Success():
            return outcome.decided, None, outcome.ledger_evidence or None
        case Failure(failure_class=cls, detail=detail, evidence=evidence):
            return {}, (cls, detail), evidence or None
        case _:
            return {}, None, None
