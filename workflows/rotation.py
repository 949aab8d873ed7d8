"""Which engine runs next: eligibility, local preference, and smooth weighted round robin.

Rotation happens **at boundaries only**, never mid-turn; :class:`Trigger` names the five
boundaries. A capacity rejection forces a rotation that excludes the engine that refused.

An engine is *eligible* when it is installed, authenticated (its doctor passed within
:attr:`RotationPolicy.doctor_ttl` of ``now``), its circuit admits work (not open, or open with
its probe due), it has every capability the boundary requires, the phase's allow-list (if the
phase has one) names it, it is not the engine a forced rotation excludes, and, for a local
engine, its switch is on. **No step joins a probe in flight**: an engine whose circuit is
half-open (rotation picked it for its probe, whose outcome is not in yet) is considered only
when no other eligible engine with weight is, so while a rate-limited engine is being probed
every other step goes to a healthy one. (An open engine whose probe is due is a candidate like
any other: picking it is its probe, one step, and a window met again backs off further, see
:func:`workflows.capacity.schedule_probe`.) Then, when any of those is a local engine with
weight, only local engines are considered (local first); otherwise all of them are.

Among those, :func:`select` is nginx's smooth weighted round robin: every candidate's current
weight grows by its weight, the largest current weight wins (ties to the smaller engine id) and
pays back the sum of the weights. Over a fixed set of weights ``w`` with sum ``W`` this gives:

* **no starvation**: every ``W`` consecutive selections include each candidate with weight > 0;
* **weight fidelity**: those ``W`` selections hold each candidate exactly ``w`` times (the seed
  asks for ±1);
* **smoothness**: each selection goes to a candidate that lags furthest behind its share
  (``n·w/W`` minus its count so far), so no candidate is chosen again while another has gone
  unselected for longer, measured in each one's own weighted time; equal weights make plain
  round robin;
* **determinism**: the same candidates and state give the same choice, in any input order.

The state is the current weights of the set the last selection was made over. A selection over
a different set (an engine joined, left, or was excluded) starts that set from zero.

Nothing here reads a clock: ``now`` is an argument.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType

from workflows.phases import Phase


class Trigger(enum.StrEnum):
    """The boundaries at which an engine may change (and the only ones)."""

    NEW_WORK_ITEM = "new_work_item"
    CAPACITY_REJECTION = "capacity_rejection"
    EFFORT_ESCALATION = "effort_escalation"
    PHASE_TRANSITION = "phase_transition"
    OPERATOR_REQUEST = "operator_request"


@dataclass(frozen=True, slots=True)
class Candidate:
    """An engine as rotation sees it (built from its ``engine_health`` row)."""

    engine_id: str
    weight: int = 1
    installed: bool = True
    authenticated_at: datetime | None = None
    """When its doctor last passed; ``None``: never, so never eligible."""
    circuit_admits: bool = True
    probing: bool = False
    """Its circuit is half-open: a probe is in flight (see :meth:`Circuit.probing`)."""
    capabilities: frozenset[str] = frozenset()
    local: bool = False

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"engine {self.engine_id}: weight must not be negative")


@dataclass(frozen=True, slots=True)
class Boundary:
    """The boundary a rotation happens at, and what the next engine must offer."""

    trigger: Trigger
    phase: Phase
    requires: frozenset[str] = frozenset()
    rejected_by: str | None = None
    """The engine whose capacity rejection forced this rotation; it is excluded."""

    def __post_init__(self) -> None:
        forced = self.trigger is Trigger.CAPACITY_REJECTION
        if forced != (self.rejected_by is not None):
            raise ValueError("a capacity-rejection rotation, and only one, names rejected_by")


def _no_allow_lists() -> Mapping[Phase, frozenset[str]]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RotationPolicy:
    doctor_ttl: timedelta = timedelta(hours=24)
    allow_lists: Mapping[Phase, frozenset[str]] = field(default_factory=_no_allow_lists)
    """Per phase, the engines allowed in it; a phase without a list allows every engine."""
    local_on: frozenset[str] = frozenset()
    """The local engines whose switch is on; a local engine not named here never runs."""
    prefer_local: bool = True


@dataclass(frozen=True, slots=True)
class RotationState:
    """Current weights, as ``(engine_id, weight)`` pairs sorted by id."""

    current: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[str, int]:
        return dict(self.current)


@dataclass(frozen=True, slots=True)
class Selection:
    engine_id: str | None
    """The chosen engine; ``None`` when no engine is eligible."""
    state: RotationState
    considered: tuple[str, ...]
    """The engines the choice was made among (after local preference)."""
    ineligible: tuple[tuple[str, str], ...]
    """``(engine_id, why)`` for every candidate that was not eligible."""


def ineligibility(
    candidate: Candidate, boundary: Boundary, policy: RotationPolicy, now: datetime
) -> str | None:
    """Why ``candidate`` may not run at ``boundary``, or ``None`` when it may."""
    checks = (
        (not candidate.installed, "not installed"),
        (not _authenticated(candidate, policy, now), "no doctor pass within the TTL"),
        (not candidate.circuit_admits, "circuit open"),
        (not boundary.requires <= candidate.capabilities, _missing(candidate, boundary)),
        (not _allowed(candidate, boundary.phase, policy), f"not allowed in {boundary.phase}"),
        (candidate.engine_id == boundary.rejected_by, "rejected for capacity"),
        (candidate.local and candidate.engine_id not in policy.local_on, "local, switched off"),
    )
    return next((why for failed, why in checks if failed), None)


def _authenticated(candidate: Candidate, policy: RotationPolicy, now: datetime) -> bool:
    at = candidate.authenticated_at
    return at is not None and now - at <= policy.doctor_ttl


def _missing(candidate: Candidate, boundary: Boundary) -> str:
    return "lacks " + ", ".join(sorted(boundary.requires - candidate.capabilities))


def _allowed(candidate: Candidate, phase: Phase, policy: RotationPolicy) -> bool:
    allowed = policy.allow_lists.get(phase)
    return allowed is None or candidate.engine_id in allowed


def rotate(
    candidates: Sequence[Candidate],
    state: RotationState,
    boundary: Boundary,
    policy: RotationPolicy,
    now: datetime,
) -> Selection:
    """Pick the engine for ``boundary``: eligibility, local preference, then :func:`select`."""
    _check_unique(candidates)
    eligible: list[Candidate] = []
    ineligible: list[tuple[str, str]] = []
    for candidate in sorted(candidates, key=lambda c: c.engine_id):
        why = ineligibility(candidate, boundary, policy, now)
        if why is None:
            eligible.append(candidate)
        else:
            ineligible.append((candidate.engine_id, why))
    settled = [c for c in eligible if not c.probing and c.weight > 0]
    healthy = settled or eligible
    local = [c for c in healthy if c.local and c.weight > 0]
    pool = local if policy.prefer_local and local else healthy
    chosen, new_state = select(pool, state)
    return Selection(chosen, new_state, tuple(c.engine_id for c in pool), tuple(ineligible))


def select(
    candidates: Sequence[Candidate], state: RotationState
) -> tuple[str | None, RotationState]:
    """Smooth weighted round robin over ``candidates`` (already eligible): the chosen engine id
    (``None`` if no candidate has weight) and the next state. Input order does not matter."""
    _check_unique(candidates)
    weighted = sorted((c for c in candidates if c.weight > 0), key=lambda c: c.engine_id)
    if not weighted:
        return None, state
    prior = state.as_dict()
    same_set = set(prior) == {c.engine_id for c in weighted} and sum(prior.values()) == 0
    total = sum(c.weight for c in weighted)
    current = {c.engine_id: (prior[c.engine_id] if same_set else 0) + c.weight for c in weighted}
    # max() keeps the first of equals; the candidates are in engine-id order.
    chosen = max(current, key=lambda engine_id: current[engine_id])
    current[chosen] -= total
    return chosen, RotationState(tuple(sorted(current.items())))


def _check_unique(candidates: Sequence[Candidate]) -> None:
    ids = [c.engine_id for c in candidates]
    if len(ids) != len(set(ids)):
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"engines listed twice: {', '.join(duplicated)}")
