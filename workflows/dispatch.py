"""The dispatch pointer: its envelope, the wait tiers that delay it, lanes, and the miss policy.

RabbitMQ carries pointers, never state (seed 000 §3-§8). A pointer names a job row and the
dispatch generation (``dispatch_seq``) it was published for; PostgreSQL decides everything
else. This module is the pure half of that design:

* :class:`DispatchEnvelope` with :func:`encode` / :func:`decode`, the ``vibey.job.dispatch/1``
  body. :func:`decode` is strict and total: any body that is not exactly such an envelope
  raises :class:`EnvelopeError` (and nothing else), so the consumer can reject it without
  requeue, which dead-letters it. A body is never guessed at.
* :class:`WaitTiers`: which fixed-delay wait queue a not-yet-due pointer goes to (§7).
* :class:`Lane`: which logical queue a kind runs in, so interactive-phase steps never wait
  behind long BUILD steps.
* :func:`decide_miss`: what a consumer does with a pointer whose fenced claim missed (§5).

Nothing here reads a clock: ``now`` is always an argument.

Exceptions::

    ValueError
    └── EnvelopeError   a body or value that is not a vibey.job.dispatch/1 envelope;
                        ``reason`` (an EnvelopeRejection) says which rule it broke

:class:`WaitTiers`, :func:`tier_name`, :class:`RowSnapshot` and :func:`decide_miss` raise a
plain ``ValueError`` for arguments they cannot work with.
"""

from __future__ import annotations

import enum
import json
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import ClassVar, TypeAlias
from uuid import UUID

from workflows.job import JobState, valid_kind_name

SCHEMA = "vibey.job.dispatch/1"
MESSAGE_TYPE = "job.dispatch"
CONTENT_TYPE = "application/json"
MAX_ENVELOPE_BYTES = 16 * 1024
MAX_PROJECT_ID_CHARS = 200
# job.dispatch_seq is a PostgreSQL bigint.
MAX_DISPATCH_SEQ = 2**63 - 1
ENVELOPE_FIELDS: frozenset[str] = frozenset(
    {"schema", "job_id", "project_id", "dispatch_seq", "kind", "not_before"}
)

_UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_MAX_TIMESTAMP_CHARS = 64
_SHOWN_CHARS = 40


# --- The envelope ------------------------------------------------------------------------


class EnvelopeRejection(enum.StrEnum):
    """Why a body is not a ``vibey.job.dispatch/1`` envelope, in the order they are checked."""

    TOO_LARGE = "too_large"
    NOT_UTF8 = "not_utf8"
    NOT_JSON = "not_json"
    DUPLICATE_KEY = "duplicate_key"
    NOT_OBJECT = "not_object"
    UNKNOWN_SCHEMA = "unknown_schema"
    MISSING_FIELD = "missing_field"
    EXTRA_FIELD = "extra_field"
    BAD_JOB_ID = "bad_job_id"
    BAD_PROJECT_ID = "bad_project_id"
    BAD_DISPATCH_SEQ = "bad_dispatch_seq"
    UNKNOWN_KIND = "unknown_kind"
    BAD_NOT_BEFORE = "bad_not_before"


class EnvelopeError(ValueError):
    """A body (or value) that is not a dispatch envelope. The message is one line."""

    def __init__(self, reason: EnvelopeRejection, detail: str) -> None:
        one_line = " ".join(detail.splitlines())
        super().__init__(f"not a {SCHEMA} envelope ({reason}): {one_line}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class DispatchEnvelope:
    """A pointer to one dispatch generation of one job.

    Construction validates every field by the rules :func:`decode` applies (the kind is a
    well-formed kind name; the worker that claims it knows what it means) and normalises
    ``not_before`` to UTC, so every envelope encodes to a body
    that decodes back to an equal envelope.
    """

    SCHEMA: ClassVar[str] = SCHEMA

    job_id: UUID
    project_id: str
    dispatch_seq: int
    kind: str
    not_before: datetime

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, UUID):
            raise EnvelopeError(
                EnvelopeRejection.BAD_JOB_ID, f"job_id must be a UUID, got {_show(self.job_id)}"
            )
        _check_project_id(self.project_id)
        _check_dispatch_seq(self.dispatch_seq)
        object.__setattr__(self, "kind", _kind_name(self.kind))
        object.__setattr__(self, "not_before", _utc(self.not_before))

    @property
    def message_id(self) -> str:
        """The AMQP message id: ``<job_id>:<dispatch_seq>``."""
        return f"{self.job_id}:{self.dispatch_seq}"


def encode(envelope: DispatchEnvelope) -> bytes:
    """Compact canonical JSON (sorted keys, no spaces, UTF-8) of exactly the six fields."""
    document = {
        "schema": SCHEMA,
        "job_id": str(envelope.job_id),
        "project_id": envelope.project_id,
        "dispatch_seq": envelope.dispatch_seq,
        "kind": envelope.kind,
        "not_before": envelope.not_before.isoformat(),
    }
    text = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def decode(body: bytes) -> DispatchEnvelope:
    """The envelope in ``body``; :class:`EnvelopeError` for anything else, never another error.

    The size is checked before anything is parsed.
    """
    if len(body) > MAX_ENVELOPE_BYTES:
        raise EnvelopeError(
            EnvelopeRejection.TOO_LARGE,
            f"the body is {len(body)} bytes; the limit is {MAX_ENVELOPE_BYTES}",
        )
    fields = _envelope_fields(_parse(body))
    return DispatchEnvelope(
        job_id=_job_id_from_text(fields["job_id"]),
        project_id=_check_project_id(fields["project_id"]),
        dispatch_seq=_check_dispatch_seq(fields["dispatch_seq"]),
        kind=_kind_name(fields["kind"]),
        not_before=_timestamp_from_text(fields["not_before"]),
    )


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return document


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _parse(body: bytes) -> object:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvelopeError(
            EnvelopeRejection.NOT_UTF8, f"byte {exc.start} is not valid UTF-8"
        ) from exc
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constants)
    except _DuplicateKeyError as exc:
        raise EnvelopeError(
            EnvelopeRejection.DUPLICATE_KEY, f"the key {_show(exc.key)} appears more than once"
        ) from None
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError, the constants above and over-long integers;
        # RecursionError is deep nesting.
        raise EnvelopeError(EnvelopeRejection.NOT_JSON, str(exc)[:200]) from exc


def _envelope_fields(document: object) -> dict[str, object]:
    if not isinstance(document, dict):
        raise EnvelopeError(
            EnvelopeRejection.NOT_OBJECT, f"the body is {_show(document)}, not a JSON object"
        )
    if "schema" not in document:
        raise EnvelopeError(EnvelopeRejection.UNKNOWN_SCHEMA, 'the body has no "schema" key')
    if document["schema"] != SCHEMA:
        raise EnvelopeError(
            EnvelopeRejection.UNKNOWN_SCHEMA,
            f"schema {_show(document['schema'])} is not {SCHEMA!r}",
        )
    if missing := ENVELOPE_FIELDS - document.keys():
        raise EnvelopeError(
            EnvelopeRejection.MISSING_FIELD, f"missing field(s): {', '.join(sorted(missing))}"
        )
    if extra := document.keys() - ENVELOPE_FIELDS:
        shown = ", ".join(_show(key) for key in sorted(extra)[:5])
        raise EnvelopeError(EnvelopeRejection.EXTRA_FIELD, f"unexpected field(s): {shown}")
    return document


def _job_id_from_text(value: object) -> UUID:
    if not isinstance(value, str) or not _UUID_TEXT.fullmatch(value):
        raise EnvelopeError(
            EnvelopeRejection.BAD_JOB_ID,
            f"job_id must be a canonical (lowercase, hyphenated) UUID string, got {_show(value)}",
        )
    return UUID(value)


def _check_project_id(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise EnvelopeError(
            EnvelopeRejection.BAD_PROJECT_ID,
            f"project_id must be a non-empty string, got {_show(value)}",
        )
    if len(value) > MAX_PROJECT_ID_CHARS:
        raise EnvelopeError(
            EnvelopeRejection.BAD_PROJECT_ID,
            f"project_id is {len(value)} characters; the limit is {MAX_PROJECT_ID_CHARS}",
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise EnvelopeError(
            EnvelopeRejection.BAD_PROJECT_ID,
            f"project_id {_show(value)} holds a lone surrogate, which UTF-8 cannot carry",
        ) from None
    return value


def _check_dispatch_seq(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DISPATCH_SEQ:
        raise EnvelopeError(
            EnvelopeRejection.BAD_DISPATCH_SEQ,
            f"dispatch_seq must be an integer from 1 to 2**63-1, got {_show(value)}",
        )
    return value


def _kind_name(value: object) -> str:
    if isinstance(value, str) and valid_kind_name(value):
        return value
    raise EnvelopeError(
        EnvelopeRejection.UNKNOWN_KIND,
        f"kind {_show(value)} is not a kind name (dot-separated lowercase words)",
    )


def _timestamp_from_text(value: object) -> datetime:
    if isinstance(value, str) and value.isascii() and len(value) <= _MAX_TIMESTAMP_CHARS:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if parsed.utcoffset() is not None:
                return parsed
    raise EnvelopeError(
        EnvelopeRejection.BAD_NOT_BEFORE,
        f"not_before must be an ISO 8601 string with a UTC offset, got {_show(value)}",
    )


def _utc(value: object) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise EnvelopeError(
            EnvelopeRejection.BAD_NOT_BEFORE,
            f"not_before must be a timezone-aware time, got {_show(value)}",
        )
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise EnvelopeError(
            EnvelopeRejection.BAD_NOT_BEFORE, f"not_before {value} is out of range in UTC"
        ) from None


def _show(value: object) -> str:
    """A short, one-line description of an untrusted value, safe for any decoded JSON."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, str):
        suffix = "..." if len(value) > _SHOWN_CHARS else ""
        return repr(value[:_SHOWN_CHARS]) + suffix
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return repr(value) if isinstance(value, float | datetime) else type(value).__name__


# --- Wait tiers --------------------------------------------------------------------------

DUE_SLACK = timedelta(milliseconds=50)
_MILLISECOND = timedelta(milliseconds=1)
_NAME_UNITS: tuple[tuple[str, timedelta], ...] = (
    ("h", timedelta(hours=1)),
    ("m", timedelta(minutes=1)),
    ("s", timedelta(seconds=1)),
)


@dataclass(frozen=True, slots=True)
class WaitTiers:
    """The fixed delays of the ``vibey.jobs.wait.<tier>`` queues, kept sorted ascending.

    Each tier is positive, a whole number of milliseconds (``x-message-ttl`` is in ms) and
    appears once.
    """

    tiers: tuple[timedelta, ...]

    def __post_init__(self) -> None:
        tiers = tuple(self.tiers)
        if not tiers:
            raise ValueError("wait tiers must not be empty (the default is 1s 5s 30s 2m 10m 1h)")
        for tier in tiers:
            _check_tier(tier)
        ordered = tuple(sorted(tiers))
        for shorter, longer in pairwise(ordered):
            if shorter == longer:
                raise ValueError(f"wait tier {tier_name(shorter)} is listed more than once")
        object.__setattr__(self, "tiers", ordered)

    @classmethod
    def from_seconds(cls, seconds: Iterable[float]) -> WaitTiers:
        """Tiers from a list of seconds, as ``[queue.rabbitmq] wait_tiers_seconds`` gives them."""
        return cls(tuple(timedelta(seconds=s) for s in seconds))

    @property
    def seconds(self) -> tuple[float, ...]:
        """The tiers as ``wait_tiers_seconds`` writes them."""
        return tuple(tier.total_seconds() for tier in self.tiers)

    @property
    def smallest(self) -> timedelta:
        return self.tiers[0]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tier_name(tier) for tier in self.tiers)

    def route(self, remaining: timedelta) -> timedelta | None:
        """The tier for a pointer due in ``remaining``; None when it is due now.

        Due now means within :data:`DUE_SLACK`: publish to the work exchange. Otherwise the
        largest tier not longer than ``remaining``, or the smallest tier when ``remaining`` is
        shorter than every tier (an early arrival is re-delayed by the consumer).
        """
        if remaining <= DUE_SLACK:
            return None
        not_longer = bisect_right(self.tiers, remaining)
        return self.tiers[max(not_longer - 1, 0)]


def _check_tier(tier: object) -> None:
    if not isinstance(tier, timedelta):
        raise ValueError(f"a wait tier must be a timedelta, got {tier!r}")
    if tier <= timedelta(0):
        raise ValueError(f"a wait tier must be positive, got {tier}")
    if tier % _MILLISECOND:
        raise ValueError(f"a wait tier must be a whole number of milliseconds, got {tier}")


def tier_name(tier: timedelta) -> str:
    """The tier's queue-name suffix in the largest whole unit: w1s, w2m, w1h, w1500ms."""
    _check_tier(tier)
    for suffix, unit in _NAME_UNITS:
        if not tier % unit:
            return f"w{tier // unit}{suffix}"
    return f"w{tier // _MILLISECOND}ms"


DEFAULT_WAIT_TIERS = WaitTiers(
    (
        timedelta(seconds=1),
        timedelta(seconds=5),
        timedelta(seconds=30),
        timedelta(minutes=2),
        timedelta(minutes=10),
        timedelta(hours=1),
    )
)


# --- Lanes -------------------------------------------------------------------------------


class Lane(enum.StrEnum):
    """The logical queue a kind runs in: interactive-phase steps never wait behind BUILD."""

    INTERACTIVE = "interactive"
    BUILD = "build"


# --- The miss policy ---------------------------------------------------------------------


class MissReason(enum.StrEnum):
    UNKNOWN_JOB = "unknown_job"
    STALE_GENERATION = "stale_generation"
    TERMINAL = "terminal"
    PARKED = "parked"
    BLOCKED = "blocked"
    LEASED = "leased"
    EARLY = "early"
    RACED = "raced"


@dataclass(frozen=True, slots=True)
class RowSnapshot:
    """What the consumer read of the job row after its fenced claim missed.

    The times should come from the store's clock, as should the ``now`` the policy is given.
    """

    state: JobState
    dispatch_seq: int
    run_after: datetime
    lease_expires_at: datetime | None
    deps_met: bool

    def __post_init__(self) -> None:
        if self.dispatch_seq < 0:
            raise ValueError(f"dispatch_seq is never negative, got {self.dispatch_seq}")
        _require_aware("run_after", self.run_after)
        if self.lease_expires_at is not None:
            _require_aware("lease_expires_at", self.lease_expires_at)


@dataclass(frozen=True, slots=True)
class Drop:
    """Ack the pointer and publish nothing."""

    reason: MissReason


@dataclass(frozen=True, slots=True)
class Redelay:
    """Ack the pointer and publish it again (same generation) to be due at ``until``."""

    until: datetime
    reason: MissReason


MissDecision: TypeAlias = Drop | Redelay


def decide_miss(row: RowSnapshot | None, message_seq: int, now: datetime) -> MissDecision:
    """What to do with a pointer whose fenced claim missed (seed 000 §5, DispatchMissPolicy).

    Drop it when the row is gone, at another generation, terminal, parked or blocked on
    dependencies; otherwise re-delay it to when the row can next be claimed. A row that looks
    claimable means the claim lost a race, and the pointer is due again at once.
    """
    _require_aware("now", now)
    if row is None:
        return Drop(MissReason.UNKNOWN_JOB)
    if message_seq != row.dispatch_seq:
        return Drop(MissReason.STALE_GENERATION)
    if row.state.terminal:
        return Drop(MissReason.TERMINAL)
    if row.state.parked:
        return Drop(MissReason.PARKED)
    if not row.deps_met:
        return Drop(MissReason.BLOCKED)
    lease = row.lease_expires_at
    if row.state is JobState.LEASED and lease is not None and lease > now:
        return Redelay(max(lease, row.run_after), MissReason.LEASED)
    if row.run_after > now:
        return Redelay(row.run_after, MissReason.EARLY)
    return Redelay(now, MissReason.RACED)


def _require_aware(name: str, value: datetime) -> None:
    if value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got {value!r}")
