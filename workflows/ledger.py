"""The ledger's pure core: event kinds, canonical JSON, digests, the range fold, projections.

The ledger is a project's append-only event log (seed 004, "Ledger"): every event has a
gapless per-project ``seq`` (1, 2, 3, ...), a kind, a JSON object payload and a SHA-256
digest. ``store/ledger.py`` writes and reads it; everything here is pure.

**Readers are forward compatible, writers strict.** A stored kind this vibey does not know is
read as an :class:`UnrecognizedEventKind` (``LedgerEvent.kind`` is ``EventKind |
UnrecognizedEventKind``), kept in every listing, range and digest, and skipped by every
projection (:func:`open_items`). A :class:`NewEvent`, the only thing a writer accepts, takes an
:class:`EventKind` and nothing else. Match kinds with ``kind is EventKind.X``; narrow with
``isinstance(kind, EventKind)`` before using a member-only attribute.

**What is hashed.**

* :func:`canonical_json` of a payload: the payload normalised (:func:`normalise`: a float
  with an integral value becomes that integer, tuples become lists), then ``json.dumps`` with
  keys sorted by code point, separators ``,`` and ``:`` (no whitespace), ``ensure_ascii=False``
  and ``allow_nan=False``. Values must be JSON: ``None``, ``bool``, ``int``, finite ``float``,
  ``str`` without NUL (PostgreSQL's ``jsonb`` refuses ``\\u0000``), lists and objects with
  string keys. The normalisation makes the digest survive ``jsonb``, which keeps numbers as
  ``numeric``: ``1e16`` comes back as ``10000000000000000``, ``1.0`` as ``1.0``; both hash as
  the integer.
* :func:`digest` of an event: ``sha256(canonical_json({"kind": <kind name>, "payload":
  <payload>}).encode("utf-8")).hexdigest()``, 64 lowercase hex digits. It covers the kind and
  the payload, not ``seq``, the ids or the time (``seq`` enters the range fold; the database
  refuses UPDATE, so the rest cannot change either).
* :func:`digest_range` of events in order: ``h_0 = sha256(b"vibey.ledger.range/1")``;
  ``h_i = sha256(h_{i-1} || seq_i as 8 bytes big-endian || digest_i as 32 bytes)`` over
  raw digests, where ``digest_i`` is *recomputed* from the event's kind and payload; the
  result is ``h_n`` in hex. Any reordering, insertion, removal or change in the range changes
  it (up to SHA-256 collisions). Unrecognised kinds are folded like any other.

**Projections.** :data:`CLOSABLE_KINDS` (QuestionAsked, DecisionRecorded, AssumptionStated,
FindingRaised) open an item named by the payload's ``"id"`` (a non-empty string; without one
the item is named ``"#<seq>"``). A later event of a closing kind whose payload ``"closes"``
names it (a string, or a list of strings) closes it (:data:`CLOSERS`): AnswerGiven closes a
question or an assumption, FindingResolved a finding, DecisionRecorded a decision it
supersedes or an assumption it settles. :func:`open_items` is what is still open.

**Engines write only engine-level kinds** (:data:`ENGINE_KINDS`: turns, tools, files,
transcripts, budget, capacity, handoffs), reported in a step's ``evidence["ledger"]`` and read
by :func:`engine_events`; :func:`open_finding_ids` is what the findings raised and resolved so
far leave open.

**Causation and correlation.** Every stored event may carry ``causation_id`` (what caused
it, typically the job id of the step that wrote it) and ``correlation_id`` (what it belongs
to, typically the workflow id), plus ``job_id`` and ``workflow_id`` as UUIDs for joins.

Exceptions::

    LedgerError
    ├── UnwritableEvent     a NewEvent a writer refuses: not an EventKind, payload not JSON
    └── MalformedEventKind  a stored kind that is not a kind name at all
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, TypeAlias
from uuid import UUID

JsonObject: TypeAlias = Mapping[str, Any]

RANGE_DOMAIN = b"vibey.ledger.range/1"
DIGEST_PATTERN = re.compile(r"^[0-9a-f]{64}$")
# A kind name: what the database's CHECK ledger_event_kind_name accepts, too.
KIND_NAME = re.compile(r"^[A-Z][A-Za-z0-9]{0,99}$")


class LedgerError(Exception):
    """Root of the ledger's errors."""


class UnwritableEvent(LedgerError, ValueError):
    """An event a writer refuses (writers are strict)."""


class MalformedEventKind(LedgerError, ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"{name[:40]!r} is not an event kind name (UpperCamelCase letters and digits, "
            "at most 100)"
        )
        self.name = name


class EventKind(enum.Enum):
    """The 26 kinds of seed 004. A member's name is its value, the name stored."""

    SessionSeeded = "SessionSeeded"
    TurnRequested = "TurnRequested"
    TurnCompleted = "TurnCompleted"
    ToolInvoked = "ToolInvoked"
    TranscriptRecorded = "TranscriptRecorded"
    FileEdited = "FileEdited"
    VerdictRendered = "VerdictRendered"
    CapacityRejected = "CapacityRejected"
    QuestionAsked = "QuestionAsked"
    AnswerGiven = "AnswerGiven"
    DecisionRecorded = "DecisionRecorded"
    AssumptionStated = "AssumptionStated"
    FindingRaised = "FindingRaised"
    FindingResolved = "FindingResolved"
    ArtifactProduced = "ArtifactProduced"
    SavePointCreated = "SavePointCreated"
    HandoffInitiated = "HandoffInitiated"
    HandoffAccepted = "HandoffAccepted"
    PhaseTransitioned = "PhaseTransitioned"
    BudgetSpent = "BudgetSpent"
    # ADR-0014: the opt-in gate events
    VisualDesignOptedIn = "VisualDesignOptedIn"
    VisualDesignDeclined = "VisualDesignDeclined"
    VisualDesignAccepted = "VisualDesignAccepted"
    VisualDesignWaived = "VisualDesignWaived"
    DeploymentOptedIn = "DeploymentOptedIn"
    DeploymentDeclined = "DeploymentDeclined"


_BY_NAME: Mapping[str, EventKind] = MappingProxyType({k.value: k for k in EventKind})


@dataclass(frozen=True, slots=True)
class UnrecognizedEventKind:
    """A stored kind this vibey does not know (written by a newer one): read, never written."""

    name: str

    def __post_init__(self) -> None:
        if not KIND_NAME.match(self.name):
            raise MalformedEventKind(self.name)
        if self.name in _BY_NAME:
            raise ValueError(f"{self.name} is a kind this vibey knows: use EventKind.{self.name}")


Kind: TypeAlias = EventKind | UnrecognizedEventKind

CLOSABLE_KINDS: frozenset[EventKind] = frozenset(
    {
        EventKind.QuestionAsked,
        EventKind.DecisionRecorded,
        EventKind.AssumptionStated,
        EventKind.FindingRaised,
    }
)

# Which kinds close which: an event of the key's kind whose payload "closes" names an open
# item of one of the value's kinds closes it.
CLOSERS: Mapping[EventKind, frozenset[EventKind]] = MappingProxyType(
    {
        EventKind.AnswerGiven: frozenset({EventKind.QuestionAsked, EventKind.AssumptionStated}),
        EventKind.FindingResolved: frozenset({EventKind.FindingRaised}),
        EventKind.DecisionRecorded: frozenset(
            {EventKind.DecisionRecorded, EventKind.AssumptionStated}
        ),
    }
)


def parse_kind(name: str) -> Kind:
    """The kind a stored name stands for. Never raises for a well-formed name: one this
    vibey does not know is an :class:`UnrecognizedEventKind`."""
    known = _BY_NAME.get(name)
    if known is not None:
        return known
    return UnrecognizedEventKind(name)


# --- canonical JSON and digests -----------------------------------------------------------


def normalise(value: Any, path: str = "payload") -> Any:
    """``value`` as the JSON the digest covers; raises :class:`UnwritableEvent` (naming
    where) for anything that is not JSON or that ``jsonb`` would not keep."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return _checked_text(value, path)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UnwritableEvent(f"{path} is {value!r}: JSON has no NaN or infinity")
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise UnwritableEvent(f"{path} has a key {key!r}: JSON object keys are strings")
            out[_checked_text(key, path)] = normalise(item, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [normalise(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise UnwritableEvent(f"{path} is a {type(value).__name__}, which is not JSON")


def _checked_text(text: str, path: str) -> str:
    if "\x00" in text:
        raise UnwritableEvent(f"{path} holds a NUL character, which jsonb refuses")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnwritableEvent(f"{path} is not valid Unicode ({exc.reason})") from None
    return text


def canonical_json(payload: Any) -> str:
    """The canonical JSON text of ``payload`` (see the module docstring)."""
    return json.dumps(
        normalise(payload),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def digest(kind_name: str, payload: JsonObject) -> str:
    """SHA-256 hex of the canonical JSON of ``{"kind": kind_name, "payload": payload}``."""
    text = canonical_json({"kind": kind_name, "payload": payload})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append: a known kind and a JSON object payload.

    The payload is normalised (what is stored is what is hashed); ``digest`` is computed once.
    Raises :class:`UnwritableEvent` for any other kind or a payload that is not JSON.
    """

    kind: EventKind
    payload: JsonObject = field(default_factory=dict)
    digest: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, EventKind):
            raise UnwritableEvent(
                f"a ledger writer takes an EventKind, not {self.kind!r}: "
                "a kind this vibey does not know is read, never written"
            )
        if not isinstance(self.payload, Mapping):
            raise UnwritableEvent(
                f"a {self.kind.value} payload must be a JSON object, "
                f"not a {type(self.payload).__name__}"
            )
        payload = normalise(self.payload)
        object.__setattr__(self, "payload", MappingProxyType(payload))
        object.__setattr__(self, "digest", digest(self.kind.value, payload))


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    """A stored event. ``digest`` is as stored; :meth:`recomputed_digest` is what it should be."""

    project_id: str
    seq: int
    kind: Kind
    payload: JsonObject
    digest: str
    causation_id: str | None = None
    correlation_id: str | None = None
    job_id: UUID | None = None
    workflow_id: UUID | None = None
    recorded_at: datetime | None = None

    @property
    def kind_name(self) -> str:
        return self.kind.value if isinstance(self.kind, EventKind) else self.kind.name

    @property
    def recognised(self) -> bool:
        return isinstance(self.kind, EventKind)

    def recomputed_digest(self) -> str:
        return digest(self.kind_name, self.payload)


# --- the range fold -----------------------------------------------------------------------


class RangeFold:
    """The order-sensitive fold of :func:`digest_range`, one event at a time."""

    def __init__(self) -> None:
        self._state = hashlib.sha256(RANGE_DOMAIN).digest()

    def add(self, seq: int, event_digest: str) -> None:
        if seq < 0 or not DIGEST_PATTERN.match(event_digest):
            raise ValueError(f"cannot fold seq {seq} with digest {event_digest[:70]!r}")
        step = hashlib.sha256(self._state)
        step.update(seq.to_bytes(8, "big"))
        step.update(bytes.fromhex(event_digest))
        self._state = step.digest()

    def hexdigest(self) -> str:
        return self._state.hex()


def digest_range(events: Iterable[LedgerEvent]) -> str:
    """The range digest of ``events`` in the order given, over their recomputed digests."""
    fold = RangeFold()
    for event in events:
        fold.add(event.seq, event.recomputed_digest())
    return fold.hexdigest()


# --- verification -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerVerification:
    """What :func:`verify_events` found. ``first_bad_seq`` and ``problem`` name the first
    problem in seq order (None when there is none); ``range_digest`` folds every stored event
    in seq order; ``last_seq`` is the project's ``ledger_head`` (0: none)."""

    count: int
    first_bad_seq: int | None
    problem: str | None
    range_digest: str
    last_seq: int
    unrecognised: int = 0

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify_events(events: Iterable[LedgerEvent], *, last_seq: int) -> LedgerVerification:
    """Check a project's events in seq order: seq runs 1..N with no gap or repeat, every
    stored digest equals the recomputed one, and the head's ``last_seq`` is N."""
    fold = RangeFold()
    count = previous = unrecognised = 0
    bad: tuple[int, str] | None = None
    for event in events:
        count += 1
        unrecognised += 0 if event.recognised else 1
        recomputed = _safe_digest(event)
        bad = bad or _problem(event, previous, recomputed)
        fold.add(max(event.seq, 0), recomputed or "0" * 64)
        previous = max(previous, event.seq)
    bad = bad or _head_problem(count, last_seq)
    return LedgerVerification(
        count=count,
        first_bad_seq=None if bad is None else bad[0],
        problem=None if bad is None else bad[1],
        range_digest=fold.hexdigest(),
        last_seq=last_seq,
        unrecognised=unrecognised,
    )


def _problem(event: LedgerEvent, previous: int, recomputed: str | None) -> tuple[int, str] | None:
    expected = previous + 1
    if event.seq > expected:
        missing = _seqs(expected, event.seq - 1)
        return expected, f"{missing} missing: the next stored event is seq {event.seq}"
    if event.seq < expected:
        return event.seq, f"seq {event.seq} repeats or is out of order (after seq {previous})"
    if recomputed is None:
        return event.seq, f"its {event.kind_name} payload cannot be hashed"
    if recomputed != event.digest:
        return event.seq, (
            f"its {event.kind_name} event does not match its digest (stored "
            f"{event.digest[:12]}…, recomputed {recomputed[:12]}…): the row was altered"
        )
    return None


def _seqs(first: int, last: int) -> str:
    return f"seq {first}" if first == last else f"seq {first}..{last}"


def _safe_digest(event: LedgerEvent) -> str | None:
    try:
        return event.recomputed_digest()
    except UnwritableEvent:
        return None


def _head_problem(count: int, last_seq: int) -> tuple[int, str] | None:
    if last_seq > count:
        return count + 1, (
            f"ledger_head.last_seq is {last_seq} but only {count} events are stored: "
            f"{_seqs(count + 1, last_seq)} removed"
        )
    if last_seq < count:
        return last_seq + 1, (
            f"ledger_head.last_seq is {last_seq} but {count} events are stored: "
            f"{_seqs(last_seq + 1, count)} written past the head"
        )
    return None


# --- projections --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenItem:
    """A closable event not closed yet: its kind, its id, the seq that opened it."""

    kind: EventKind
    id: str
    seq: int
    payload: JsonObject


def recognised(events: Iterable[LedgerEvent]) -> list[LedgerEvent]:
    """The events of kinds this vibey knows, in order (what every projection starts from)."""
    return [e for e in events if isinstance(e.kind, EventKind)]


def item_id(event: LedgerEvent) -> str:
    """The id a closable event opens: its payload's ``"id"``, else ``"#<seq>"``."""
    value = event.payload.get("id")
    return value if isinstance(value, str) and value else f"#{event.seq}"


def closes(event: LedgerEvent) -> tuple[str, ...]:
    """The ids an event's payload ``"closes"`` names (a string or a list of strings)."""
    value = event.payload.get("closes")
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str) and v)
    return ()


def open_items(events: Iterable[LedgerEvent]) -> tuple[OpenItem, ...]:
    """The open questions, decisions, assumptions and findings, in the order they opened.
    Unrecognised kinds are skipped: they neither open nor close anything."""
    open_: dict[tuple[EventKind, str], OpenItem] = {}
    for event in events:
        kind = event.kind
        if not isinstance(kind, EventKind):
            continue
        for closed in closes(event):
            for target in CLOSERS.get(kind, ()):
                open_.pop((target, closed), None)
        if kind in CLOSABLE_KINDS:
            key = (kind, item_id(event))  # opened again: the newer one stands
            open_[key] = OpenItem(kind, key[1], event.seq, event.payload)
    return tuple(sorted(open_.values(), key=lambda item: item.seq))


# --- what engines may write, and the findings still open ------------------------------

ENGINE_KINDS: frozenset[EventKind] = frozenset(
    {
        EventKind.TurnRequested,
        EventKind.TurnCompleted,
        EventKind.ToolInvoked,
        EventKind.TranscriptRecorded,
        EventKind.FileEdited,
        EventKind.BudgetSpent,
        EventKind.CapacityRejected,
        EventKind.AssumptionStated,
        EventKind.SavePointCreated,
        EventKind.HandoffInitiated,  # a handoff inside an engine-driven job (actors/handoff.py)
        EventKind.HandoffAccepted,
    }
)


def job_gate_asked(
    gate_id: object, kind: str, question: str, answers: Sequence[str], job_id: object
) -> NewEvent:
    """A parked job's gate (ladder, spend, handoff, delivery_exhausted, ...) as the ledger's
    ``QuestionAsked``: ``id`` is ``gate:<gate id>``, which its answer closes."""
    payload = {
        "id": f"gate:{gate_id}",
        "kind": kind,
        "question": question,
        "answers": list(answers),
        "job_id": str(job_id),
    }
    return NewEvent(EventKind.QuestionAsked, payload)


def job_gate_answered(gate_id: object, answer: str, by: str) -> NewEvent:
    """The answer to a parked job's gate: an ``AnswerGiven`` that closes its question."""
    return NewEvent(
        EventKind.AnswerGiven, {"closes": f"gate:{gate_id}", "answer": answer, "by": by}
    )


def engine_events(evidence: Mapping[str, Any]) -> list[NewEvent]:
    """The engine-level events a step's evidence reports under ``"ledger"``: a list of
    ``{"kind": <EventKind name>, "payload": {...}}``. Writers are strict: a kind that is not
    an engine-level kind of this vibey, or a payload that is not JSON, raises
    :class:`~workflows.ledger.UnwritableEvent`."""
    entries = evidence.get("ledger") or []
    if not isinstance(entries, list):
        raise UnwritableEvent("evidence.ledger must be a list of {kind, payload} objects")
    out = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise UnwritableEvent(f"evidence.ledger holds {entry!r}, not a {{kind, payload}}")
        name = entry.get("kind")
        kind = next((k for k in ENGINE_KINDS if k.value == name), None)
        if kind is None:
            known = ", ".join(sorted(k.value for k in ENGINE_KINDS))
            raise UnwritableEvent(f"an engine may not write ledger kind {name!r}; it may: {known}")
        out.append(NewEvent(kind, entry.get("payload") or {}))
    return out


def open_finding_ids(events: Iterable[tuple[str, Mapping[str, Any]]]) -> frozenset[str]:
    """The findings still open after ``events`` (kind name, payload), in ledger order."""
    open_: set[str] = set()
    for kind, payload in events:
        if kind == EventKind.FindingRaised.value and isinstance(payload.get("id"), str):
            open_.add(payload["id"])
        elif kind == EventKind.FindingResolved.value:
            closed = payload.get("closes")
            open_ -= {closed} if isinstance(closed, str) else set(closed or ())
    return frozenset(open_)
