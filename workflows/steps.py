"""What a step handler may say happened: the seam between a handler and the runtime.

A handler receives its claimed :class:`workflows.queue.Job` and returns one outcome; the
runtime turns it into the matching fenced settle (ack, nack, defer, park) in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from workflows.job import FailureClass
from workflows.queue import GateRequest, Job, JsonObject


@dataclass(frozen=True, slots=True)
class Success:
    """``result`` is what the definition reads; ``evidence`` what the engine did, for the
    ledger, as on :class:`Failure`. (The older form, an ``"evidence"`` key inside ``result``,
    is still read: :attr:`ledger_evidence`.)"""

    result: JsonObject = field(default_factory=dict)
    evidence: JsonObject = field(default_factory=dict)

    @property
    def ledger_evidence(self) -> JsonObject:
        legacy = self.result.get("evidence")
        return self.evidence or (legacy if isinstance(legacy, Mapping) else {})

    @property
    def decided(self) -> JsonObject:
        """The result without the older form's evidence key: what the workflow records."""
        return {k: v for k, v in self.result.items() if k != "evidence"}


@dataclass(frozen=True, slots=True)
class Failure:
    failure_class: FailureClass
    detail: str
    retry_in: timedelta | None = None
    evidence: JsonObject = field(default_factory=dict)  # what the engine did, for the ledger


@dataclass(frozen=True, slots=True)
class Defer:
    """Try again after ``delay`` without burning an attempt. ``capacity`` only when the engine
    really refused for lack of capacity (it opens the circuit; a verify wait does not)."""

    delay: timedelta
    reason: str
    capacity: bool = False


@dataclass(frozen=True, slots=True)
class Park:
    gate: GateRequest


Outcome = Success | Failure | Defer | Park
Handler = Callable[[Job], Outcome]
Handlers = Mapping[str, Handler]


@dataclass(frozen=True, slots=True)
class Short:
    """A handler that finishes in milliseconds and whose only effect is its outcome (no
    engine, no side effect outside the database): the runtime claims, runs and settles its
    step's first delivery in one transaction, one commit. Wrap it: ``{"kind": Short(fn)}``."""

    handler: Handler

    def __call__(self, job: Job) -> Outcome:
        return self.handler(job)
