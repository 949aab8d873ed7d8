"""An engine's circuit breaker, and the rule that a capacity rejection outranks a completion claim.

One circuit per engine::

    CLOSED ──capacity rejection──────────────▶ OPEN ──probe due──▶ HALF_OPEN ──success──▶ CLOSED
       └──3rd consecutive engine failure─────▶  ▲                      │
                                                └──any failure but work/vibey──┘

* a capacity rejection (:class:`CapacityRejected`, or a bare ``FailureClass.CAPACITY``) opens
  the circuit at once and records the capacity state;
* engine failures open it after :data:`ENGINE_FAILURE_THRESHOLD` in a row; a success in
  between starts the count again;
* work failures (the code under work is wrong) and vibey failures (our bug) never touch it;
* an open circuit is probed when :func:`workflows.capacity.schedule_probe` says so: a window
  at its reset time, everything else on backoff. A bare ``FailureClass.CAPACITY`` names no
  reset time, so it is recorded as :class:`CreditsExhausted`: without evidence of a window,
  nothing waits for a time;
* only a half-open probe's success closes the circuit; a late success from a run that began
  before the circuit opened proves nothing about capacity now;
* a window that the probe of the last one meets again (no success in between) keeps the
  circuit open longer each time (:func:`workflows.capacity.schedule_probe`), and while a probe
  is in flight (:meth:`Circuit.probing`) rotation sends other steps to other engines.

:func:`settle_verdict` reads every event a step produced and settles it: any capacity
rejection makes the outcome a capacity outcome, whatever else the step claimed.

Nothing here reads a clock: ``now`` is an argument.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TypeAlias

from workflows.capacity import (
    AuthenticationFailed,
    Available,
    BackoffProbe,
    CapacityState,
    CreditsExhausted,
    DeadlineProbe,
    Exhausted,
    Probe,
    WindowExhausted,
    schedule_probe,
)
from workflows.job import FailureClass

ENGINE_FAILURE_THRESHOLD = 3
PROBE_IN_FLIGHT = timedelta(hours=2)
"""How long a half-open circuit's probe counts as running (build.implement's lease, the
longest a step holds): a probe whose outcome never came back (its worker lost) stops keeping
steps away after that."""
AVAILABLE = Available()


class CircuitStatus(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class Success:
    """An attempt the engine carried to the end (whatever the verdict on the work)."""


@dataclass(frozen=True, slots=True)
class CapacityRejected:
    """The engine refused for lack of capacity, and said which kind."""

    state: Exhausted


Outcome: TypeAlias = Success | FailureClass | CapacityRejected


@dataclass(frozen=True, slots=True)
class Circuit:
    engine_id: str
    status: CircuitStatus = CircuitStatus.CLOSED
    consecutive_failures: int = 0
    capacity: CapacityState = AVAILABLE
    opened_at: datetime | None = None
    probes: int = 0
    """Probes that failed since the circuit opened (the next backoff probe is ``probes + 1``)."""
    probe: Probe | None = None
    """When an open circuit is next probed; ``None`` while closed."""

    def __post_init__(self) -> None:
        closed = self.status is CircuitStatus.CLOSED
        if closed != (self.opened_at is None) or closed != (self.probe is None):
            raise ValueError("a circuit has opened_at and a probe exactly when it is not closed")
        if isinstance(self.probe, DeadlineProbe) and not isinstance(self.capacity, WindowExhausted):
            raise ValueError(
                f"only a rate-limit window has a deadline probe, not {self.capacity.kind}"
            )
        if self.consecutive_failures < 0 or self.probes < 0:
            raise ValueError("failure and probe counts are never negative")
        if isinstance(self.probe, BackoffProbe) and self.probe.attempt != self.probes + 1:
            raise ValueError("the next backoff probe is attempt probes + 1")

    @property
    def is_open(self) -> bool:
        return self.status is CircuitStatus.OPEN

    def probe_due(self, now: datetime) -> bool:
        return self.is_open and self.probe is not None and now >= self.probe.at

    def probing(self, now: datetime) -> bool:
        """Whether a probe is in flight: half-open, its probe started less than
        :data:`PROBE_IN_FLIGHT` ago (rotation sends other steps elsewhere meanwhile)."""
        if self.status is not CircuitStatus.HALF_OPEN or self.probe is None:
            return False
        return now < self.probe.at + PROBE_IN_FLIGHT

    def admits(self, now: datetime) -> bool:
        """Whether rotation may pick this engine: closed, half-open, or open with its probe
        due (picking it is the probe)."""
        return not self.is_open or self.probe_due(now)


def record(circuit: Circuit, outcome: Outcome, now: datetime) -> Circuit:
    """The circuit after one attempt's outcome."""
    if outcome in (FailureClass.WORK, FailureClass.VIBEY):
        return circuit
    if outcome is FailureClass.CAPACITY:
        outcome = CapacityRejected(CreditsExhausted(detail="capacity failure with no state"))
    if isinstance(outcome, CapacityRejected):
        return _open(circuit, outcome.state, now)
    if isinstance(outcome, Success):
        return _succeeded(circuit)
    return _engine_failed(circuit, now)


def half_open(circuit: Circuit, now: datetime) -> Circuit:
    """An open circuit whose probe is due, moved to half-open (the next attempt is the probe,
    its ``probe.at`` now when it started); any other circuit unchanged."""
    if not circuit.probe_due(now) or circuit.probe is None:
        return circuit
    return replace(circuit, status=CircuitStatus.HALF_OPEN, probe=replace(circuit.probe, at=now))


def reauthenticated(circuit: Circuit, now: datetime) -> Circuit:
    """A doctor pass: a circuit held open by a failed login is due for its probe at once (the
    probe, not the doctor, closes it). Any other circuit is unchanged."""
    probe = circuit.probe
    if not circuit.is_open or not isinstance(circuit.capacity, AuthenticationFailed):
        return circuit
    if probe is None or probe.at <= now:
        return circuit
    return replace(circuit, probe=replace(probe, at=now))


def _open(circuit: Circuit, capacity: CapacityState, now: datetime) -> Circuit:
    probes = circuit.probes + 1 if circuit.status is CircuitStatus.HALF_OPEN else circuit.probes
    opened_at = circuit.opened_at if circuit.opened_at is not None else now
    return replace(
        circuit,
        status=CircuitStatus.OPEN,
        capacity=capacity,
        opened_at=opened_at,
        probes=probes,
        probe=schedule_probe(capacity, now, probes + 1),
    )


def _succeeded(circuit: Circuit) -> Circuit:
    if circuit.status is CircuitStatus.OPEN:
        return circuit
    return Circuit(engine_id=circuit.engine_id)


def _engine_failed(circuit: Circuit, now: datetime) -> Circuit:
    failures = circuit.consecutive_failures + 1
    counted = replace(circuit, consecutive_failures=failures)
    if circuit.status is CircuitStatus.HALF_OPEN or (
        circuit.status is CircuitStatus.CLOSED and failures >= ENGINE_FAILURE_THRESHOLD
    ):
        return _open(counted, circuit.capacity, now)
    return counted


# -- settling a step -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompletionClaimed:
    """The engine said the step is done."""

    detail: str = ""


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    failure_class: FailureClass
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Progress:
    """Any other event of a step (a turn, a tool call, a file edit); it settles nothing."""

    kind: str


StepEvent: TypeAlias = CompletionClaimed | CapacityRejected | AttemptFailed | Progress


@dataclass(frozen=True, slots=True)
class Completed:
    detail: str = ""


@dataclass(frozen=True, slots=True)
class OutOfCapacity:
    """The step met a capacity rejection: it is not complete, whatever it claimed."""

    state: Exhausted


@dataclass(frozen=True, slots=True)
class Failed:
    failure_class: FailureClass
    detail: str = ""


Verdict: TypeAlias = Completed | OutOfCapacity | Failed

NO_CLAIM = "the step ended without a completion claim"


def settle_verdict(events: Iterable[StepEvent]) -> Verdict:
    """How a step settles, from every event it produced, in order.

    1. Any capacity rejection wins: the verdict is :class:`OutOfCapacity`, never
       :class:`Completed`. With several, credits outrank a failed login, which outranks a
       window (the latest reset among windows): a deadline is kept only when every rejection
       named one.
    2. Otherwise the first failure.
    3. Otherwise a completion claim completes the step.
    4. No claim at all is an engine failure (missing evidence is never a success).
    """
    seen = tuple(events)
    rejections = [e.state for e in seen if isinstance(e, CapacityRejected)]
    if rejections:
        return OutOfCapacity(_worst(rejections))
    for event in seen:
        if isinstance(event, AttemptFailed):
            return Failed(event.failure_class, event.detail)
    for event in seen:
        if isinstance(event, CompletionClaimed):
            return Completed(event.detail)
    return Failed(FailureClass.ENGINE, NO_CLAIM)


def _worst(rejections: list[Exhausted]) -> Exhausted:
    for kind in (CreditsExhausted, AuthenticationFailed):
        for state in rejections:
            if isinstance(state, kind):
                return state
    windows = [s for s in rejections if isinstance(s, WindowExhausted)]
    return max(windows, key=lambda w: w.resets_at)
