"""An engine's capacity: what it can take right now, when to look again, and the JSON codec.

Four states::

    Available | WindowExhausted(resets_at) | CreditsExhausted | AuthenticationFailed

**Credits are not a rate limit.** A rate-limit window reopens at a time the engine names; spent
credits come back only when somebody buys more, at no time anyone can know. So
:class:`CreditsExhausted` has no ``resets_at`` and can never acquire one. Three layers hold
this:

1. the type: the class has no such field, and ``slots=True`` means none can be set on an
   instance either (``AttributeError``);
2. probe scheduling: :func:`schedule_probe` gives a :class:`DeadlineProbe` only for a
   :class:`WindowExhausted`; every other state gets a :class:`BackoffProbe` (property-tested),
   and the codec refuses a ``resets_at`` key on anything but a window (:func:`decode_state`);
3. the database: ``engine_health`` carries the CHECK ``credits_never_have_a_deadline``
   (``migrations/0006_engine_health.sql``).

Nothing here reads a clock: ``now`` is an argument.

Exceptions::

    ValueError
    └── CapacityCodecError   a stored capacity state that is not exactly one of ours
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeAlias

from workflows.job import BackoffPolicy, backoff


class CapacityKind(enum.StrEnum):
    """The states' names, as stored in ``engine_health.capacity_state`` and in JSON."""

    AVAILABLE = "Available"
    WINDOW_EXHAUSTED = "WindowExhausted"
    CREDITS_EXHAUSTED = "CreditsExhausted"
    AUTHENTICATION_FAILED = "AuthenticationFailed"


@dataclass(frozen=True, slots=True)
class Available:
    """The engine takes work."""

    @property
    def kind(self) -> CapacityKind:
        return CapacityKind.AVAILABLE


@dataclass(frozen=True, slots=True)
class WindowExhausted:
    """A rate-limit window is used up; the engine said when it reopens."""

    resets_at: datetime
    detail: str = ""

    def __post_init__(self) -> None:
        if self.resets_at.utcoffset() is None:
            raise ValueError("resets_at must be timezone-aware")

    @property
    def kind(self) -> CapacityKind:
        return CapacityKind.WINDOW_EXHAUSTED


@dataclass(frozen=True, slots=True)
class CreditsExhausted:
    """The account's credits are spent. There is deliberately no ``resets_at``: nobody knows
    when credits come back, so nothing may ever wait for a time."""

    detail: str = ""

    @property
    def kind(self) -> CapacityKind:
        return CapacityKind.CREDITS_EXHAUSTED


@dataclass(frozen=True, slots=True)
class AuthenticationFailed:
    """The engine's credentials were refused; a doctor pass clears it."""

    detail: str = ""

    @property
    def kind(self) -> CapacityKind:
        return CapacityKind.AUTHENTICATION_FAILED


CapacityState: TypeAlias = Available | WindowExhausted | CreditsExhausted | AuthenticationFailed
Exhausted: TypeAlias = WindowExhausted | CreditsExhausted | AuthenticationFailed
"""The states a capacity rejection reports (everything but :class:`Available`)."""


# -- probes --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BackoffProbe:
    """Look again at ``at``, a backoff after ``attempt`` probes that found no capacity."""

    at: datetime
    attempt: int


@dataclass(frozen=True, slots=True)
class DeadlineProbe:
    """Look again at the time the engine named for its window to reopen."""

    at: datetime


Probe: TypeAlias = BackoffProbe | DeadlineProbe

PROBE_BACKOFF = BackoffPolicy(base=timedelta(minutes=1), cap=timedelta(hours=1), jitter=0.0)
"""1, 2, 4 … minutes between probes, never more than an hour apart."""
WINDOW_BACKOFF = BackoffPolicy(base=timedelta(seconds=30), cap=timedelta(minutes=30), jitter=0.0)
"""A window met again by the probe of the last one (no success in between): at least 30 s,
1, 2, 4 … minutes from then, never more than half an hour, however short its stated reset."""


def schedule_probe(
    state: CapacityState,
    now: datetime,
    attempt: int,
    policy: BackoffPolicy = PROBE_BACKOFF,
    windows: BackoffPolicy = WINDOW_BACKOFF,
) -> Probe:
    """When to probe an engine next, given its capacity state and how many probes came before.

    A :class:`WindowExhausted` gets a :class:`DeadlineProbe` at its ``resets_at`` (or ``now``
    if that has passed) the first time; a window that the probe of the last one met again
    (``attempt`` > 1: no success in between) is probed no sooner than ``backoff(attempt - 1,
    windows)`` from ``now``, so an engine that is rate-limited again and again is left alone
    longer each time, whatever short reset its CLI names (the later of the two). Every other
    state gets a :class:`BackoffProbe`: for credits there is no time to wait for, for a failed
    login there is a doctor to rerun, and an engine whose capacity is fine but whose circuit
    opened on engine failures is simply tried again later. ``attempt`` counts from 1.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    if isinstance(state, WindowExhausted):
        at = max(state.resets_at, now)
        if attempt > 1:
            at = max(at, now + backoff(attempt - 1, windows))
        return DeadlineProbe(at=at)
    return BackoffProbe(at=now + backoff(attempt, policy), attempt=attempt)


# -- the JSON codec ------------------------------------------------------------------------


class CapacityCodecError(ValueError):
    """A stored capacity state that is not exactly one of ours (unknown state, a missing or
    extra key, or a ``resets_at`` on a state that has none)."""


_BY_NAME: Mapping[str, CapacityKind] = {kind.value: kind for kind in CapacityKind}
_KEYS: Mapping[CapacityKind, frozenset[str]] = {
    CapacityKind.AVAILABLE: frozenset({"state"}),
    CapacityKind.WINDOW_EXHAUSTED: frozenset({"state", "resets_at", "detail"}),
    CapacityKind.CREDITS_EXHAUSTED: frozenset({"state", "detail"}),
    CapacityKind.AUTHENTICATION_FAILED: frozenset({"state", "detail"}),
}


def encode_state(state: CapacityState) -> dict[str, str]:
    """``{"state": "WindowExhausted", "resets_at": "…", "detail": "…"}``; only a window has
    a ``resets_at`` key."""
    if isinstance(state, Available):
        return {"state": state.kind.value}
    if isinstance(state, WindowExhausted):
        return {
            "state": state.kind.value,
            "resets_at": state.resets_at.isoformat(),
            "detail": state.detail,
        }
    return {"state": state.kind.value, "detail": state.detail}


def decode_state(data: Mapping[str, Any]) -> CapacityState:
    """The inverse of :func:`encode_state`, strict: anything else raises
    :class:`CapacityCodecError`. A ``CreditsExhausted`` with a ``resets_at`` key (even null)
    is refused, never quietly dropped."""
    raw = data.get("state")
    kind = _BY_NAME.get(raw) if isinstance(raw, str) else None
    if kind is None:
        raise CapacityCodecError(f"unknown capacity state {raw!r}")
    keys = frozenset(data)
    if kind is CapacityKind.CREDITS_EXHAUSTED and "resets_at" in keys:
        raise CapacityCodecError("CreditsExhausted has no resets_at: credits have no reset time")
    if keys != _KEYS[kind]:
        extra, missing = sorted(keys - _KEYS[kind]), sorted(_KEYS[kind] - keys)
        raise CapacityCodecError(f"{kind.value}: unexpected keys {extra}, missing keys {missing}")
    detail = data.get("detail", "")
    if not isinstance(detail, str):
        raise CapacityCodecError(f"{kind.value}: detail must be a string")
    if kind is CapacityKind.AVAILABLE:
        return Available()
    if kind is CapacityKind.WINDOW_EXHAUSTED:
        return WindowExhausted(resets_at=_timestamp(data["resets_at"]), detail=detail)
    if kind is CapacityKind.CREDITS_EXHAUSTED:
        return CreditsExhausted(detail=detail)
    return AuthenticationFailed(detail=detail)


def _timestamp(value: Any) -> datetime:
    if not isinstance(value, str):
        raise CapacityCodecError("WindowExhausted: resets_at must be an ISO-8601 string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise CapacityCodecError(f"WindowExhausted: resets_at {value!r} is not ISO-8601") from None
    if parsed.utcoffset() is None:
        raise CapacityCodecError("WindowExhausted: resets_at must carry a UTC offset")
    return parsed


def rejection_from_payload(data: Mapping[str, Any]) -> Exhausted:
    """The capacity state a ``CapacityRejected`` payload reports (its payload is
    :func:`encode_state` of the state, other keys ignored). A payload that names no exhausted
    state, or a malformed one, is read as :class:`CreditsExhausted`: a rejection is never
    dropped, and without a valid reset time nothing waits for a time."""
    known = {key: data[key] for key in ("state", "resets_at", "detail") if key in data}
    try:
        state = decode_state(known)
    except CapacityCodecError as exc:
        return CreditsExhausted(detail=f"unreadable capacity rejection: {exc}")
    if isinstance(state, Available):
        return CreditsExhausted(detail="a capacity rejection that reported Available")
    return state


def from_columns(kind: str, resets_at: datetime | None, detail: str) -> CapacityState:
    """A state from ``engine_health``'s columns; the same rules as :func:`decode_state`."""
    data: dict[str, Any] = {"state": kind}
    if resets_at is not None:
        data["resets_at"] = resets_at.isoformat()
    if kind != CapacityKind.AVAILABLE:
        data["detail"] = detail
    return decode_state(data)


def resets_at_of(state: CapacityState) -> datetime | None:
    """The reset time a state carries: only a window has one."""
    return state.resets_at if isinstance(state, WindowExhausted) else None


def detail_of(state: CapacityState) -> str:
    return "" if isinstance(state, Available) else state.detail
