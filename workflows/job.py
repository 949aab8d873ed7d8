"""The pure job domain: states, failure classes, kinds, backoff, idempotency keys, leases.

Nothing here reads a clock, the environment or a random source: every input is an argument,
so the same inputs always give the same answer (which is what the property tests check).

Kinds. A job's kind is a name; what it means (lane, lease, attempts, result) is declared once
by the definition that uses it (``workflows.kinds``; the protocol's 22 kinds and 3 aliases are
in ``workflows.protocol.kinds``). By the time a job is keyed and stored its kind is canonical.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType


class JobState(enum.StrEnum):
    """ready → leased → succeeded | failed | awaiting_human | awaiting_capacity | cancelled."""

    READY = "ready"
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    AWAITING_HUMAN = "awaiting_human"
    AWAITING_CAPACITY = "awaiting_capacity"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def parked(self) -> bool:
        return self is JobState.AWAITING_HUMAN


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
)

# The edges a job row may take. ``leased → ready`` is a nack with attempts left, a defer or a
# reap; ``awaiting_human → ready`` is a gate answer; ``awaiting_capacity → leased`` is a claim
# once the capacity probe is due.
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = MappingProxyType(
    {
        JobState.READY: frozenset({JobState.LEASED, JobState.CANCELLED}),
        JobState.LEASED: frozenset(
            {
                JobState.READY,
                JobState.SUCCEEDED,
                JobState.FAILED,
                JobState.AWAITING_HUMAN,
                JobState.AWAITING_CAPACITY,
                JobState.CANCELLED,
            }
        ),
        JobState.AWAITING_HUMAN: frozenset({JobState.READY, JobState.CANCELLED}),
        JobState.AWAITING_CAPACITY: frozenset({JobState.LEASED, JobState.CANCELLED}),
        JobState.SUCCEEDED: frozenset(),
        JobState.FAILED: frozenset(),
        JobState.CANCELLED: frozenset(),
    }
)


def can_transition(source: JobState, target: JobState) -> bool:
    return target in TRANSITIONS[source]


class FailureClass(enum.StrEnum):
    """Why an attempt failed, which decides what the engine's circuit does.

    capacity: the engine refused for lack of capacity (opens the circuit at once);
    engine: the engine misbehaved (opens after 3); work: the code under work is wrong;
    vibey: our own bug. The last two never touch the circuit.
    """

    CAPACITY = "capacity"
    ENGINE = "engine"
    WORK = "work"
    VIBEY = "vibey"


class UnknownJobKindError(ValueError):
    """A kind that no registered definition declares."""

    def __init__(self, kind: str, known: Iterable[str] = ()) -> None:
        names = ", ".join(sorted(known)) or "none"
        super().__init__(f"unknown job kind {kind!r}; declared kinds: {names}")
        self.kind = kind


KIND_NAME = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*")
MAX_KIND_LENGTH = 100


def valid_kind_name(name: object) -> bool:
    """A kind name: dot-separated lowercase words (``review.triage``), at most 100 characters."""
    return (
        isinstance(name, str)
        and len(name) <= MAX_KIND_LENGTH
        and KIND_NAME.fullmatch(name) is not None
    )


def check_kind_name(name: str) -> str:
    if not valid_kind_name(name):
        raise ValueError(
            f"{name!r} is not a kind name: dot-separated lowercase words such as 'review.triage'"
        )
    return name


TIMER_KIND = "workflow.timer"
"""The engine's own kind: a durable workflow timer (a job with ``run_after``, no handler)."""


def idempotency_key(project_id: str, cycle: int, kind: str, subject: str) -> str:
    """sha256 over (project, cycle, kind, subject), hex encoded. ``kind`` is the canonical
    kind: an alias is resolved by the definition's kinds before a job is keyed.

    The four parts are encoded as a JSON array, so no choice of separators inside a part can
    make two different tuples hash alike.
    """
    parts = [project_id, cycle, kind, subject]
    canonical = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Exponential backoff after a failed attempt: base × 2^(attempt-1), capped.

    ``jitter`` is the largest fraction taken off a delay; the caller supplies where in that
    range a given delay falls (see :func:`jitter_fraction`), so no randomness lives here.
    The cap defaults to 15 minutes, the longest nack wait seed 000 §7 allows.
    """

    base: timedelta = timedelta(seconds=5)
    cap: timedelta = timedelta(minutes=15)
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base <= timedelta(0):
            raise ValueError("backoff base must be positive")
        if self.cap < self.base:
            raise ValueError("backoff cap must be at least the base")
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError("backoff jitter must be in [0, 1)")


DEFAULT_BACKOFF = BackoffPolicy()
_MICROSECOND = timedelta(microseconds=1)


def backoff(
    attempt: int, policy: BackoffPolicy = DEFAULT_BACKOFF, *, spread: float = 0.0
) -> timedelta:
    """The wait before attempt ``attempt + 1`` after attempt ``attempt`` failed.

    ``attempt`` counts from 1. ``spread`` in [0, 1] picks a point in the jitter range:
    0 gives the full exponential delay, 1 takes off ``policy.jitter`` of it.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    if not 0.0 <= spread <= 1.0:
        raise ValueError(f"spread must be in [0, 1], got {spread}")
    # Whole microseconds keep this exact up to timedelta.max. The base is at least 1 microsecond,
    # so once the exponent reaches the cap's bit length every delay is capped; bounding it there
    # keeps the shift small for huge attempts. Only the jitter taken off goes through a float.
    base, cap = policy.base // _MICROSECOND, policy.cap // _MICROSECOND
    raw = min(base << min(attempt - 1, cap.bit_length()), cap)
    return timedelta(microseconds=raw - min(raw, round(raw * policy.jitter * spread)))


def jitter_fraction(*parts: object) -> float:
    """A deterministic fraction in [0, 1) derived from ``parts`` (e.g. job id and attempt)."""
    digest = hashlib.sha256(repr(parts).encode("utf-8")).digest()
    # 53 bits, the float's precision: 64 bits near 2^64 would round up to exactly 1.0.
    return (int.from_bytes(digest[:8], "big") >> 11) / 2.0**53


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How long a claim holds a job: a kind's own lease (its declaration's, passed in as
    ``declared``) unless ``by_kind`` overrides it (``[queue.lease_seconds]``), else
    ``default`` (2 min)."""

    default: timedelta = timedelta(minutes=2)
    by_kind: Mapping[str, timedelta] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.default <= timedelta(0):
            raise ValueError("the default lease must be positive")
        for kind, duration in self.by_kind.items():
            if duration <= timedelta(0):
                raise ValueError(f"the lease for {kind!r} must be positive")
        object.__setattr__(self, "by_kind", MappingProxyType(dict(self.by_kind)))

    def __reduce__(self) -> tuple[type[LeasePolicy], tuple[timedelta, dict[str, timedelta]]]:
        # The read-only mapping does not pickle; worker processes receive the policy pickled.
        return (LeasePolicy, (self.default, dict(self.by_kind)))

    def lease_for(self, kind: str, declared: timedelta | None = None) -> timedelta:
        override = self.by_kind.get(kind)
        if override is not None:
            return override
        return self.default if declared is None else declared

    def with_overrides(self, overrides: Mapping[str, timedelta]) -> LeasePolicy:
        """A policy with some kinds' leases replaced; the key ``default`` sets the default."""
        merged = dict(self.by_kind)
        default = self.default
        for kind, duration in overrides.items():
            if kind == "default":
                default = duration
            else:
                merged[kind] = duration
        return LeasePolicy(default=default, by_kind=merged)

    def resolved(self, canonical: Callable[[str], str]) -> LeasePolicy:
        """The overrides keyed by canonical kind (``canonical`` maps an alias to its kind and
        raises for a name no definition declares)."""
        return LeasePolicy(
            default=self.default, by_kind={canonical(k): v for k, v in self.by_kind.items()}
        )
