"""Domain events: the facts vibey publishes for the console, webhooks and users' consumers.

A :class:`DomainEvent` is seed 003's envelope: ``event_id``, ``event_type``, ``timestamp``,
``tenant_id``, ``project_id``, ``correlation_id`` (the workflow), ``causation_id`` (the job or
answer that caused it) and ``payload``. The store writes one row per event in the transaction
of the change it reports (``domain_event``); the publisher sends it to the ``vibey.events``
topic exchange under :attr:`DomainEvent.routing_key` (``<tenant>.<project>.<event_type>``,
bind ``default.*.gate.*`` for every gate event of the default tenant). PostgreSQL is the record;
a consumer dedupes by ``event_id``.

The wire codec is strict and versioned (:func:`encode`, :func:`decode`): a body that is not
exactly one version-``1`` envelope of a known type — a missing or extra field, a value of the
wrong type, a naive timestamp — raises :class:`EventCodecError`, and a consumer dead-letters it
with that message as the reason. A payload whose canonical JSON is longer than
:data:`INLINE_LIMIT` travels by reference (:func:`by_reference`): the envelope carries an
empty payload and a :class:`PayloadRef` (a pointer and the payload's SHA-256); the payload
stays in PostgreSQL, and :func:`resolved` puts it back after checking its digest.

:func:`implied` is what one workflow event and its decision imply (pure: the store adds ids,
the clock and the tenant). Nothing here reads a clock or makes an id.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from workflows.engine import (
    Command,
    Event,
    GateAnswered,
    Header,
    OpenGate,
    Started,
    Status,
    StepFailed,
    StepSucceeded,
    TransitionPhase,
)

VERSION = 1
EXCHANGE = "vibey.events"
INLINE_LIMIT = 8192  # bytes of canonical JSON; a longer payload travels by reference
DEFAULT_TENANT = "default"
DEFAULT_BY = "vibey:default"  # who answered a gate its deadline answered with its default
NO_PROJECT = "_"  # the routing segment of an event about no project (an engine's circuit)
JsonObject = Mapping[str, Any]
_SEGMENT = re.compile(r"[^A-Za-z0-9_-]")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class EventCodecError(ValueError):
    """A body that is not exactly one domain event this vibey reads."""


class EventType(enum.StrEnum):
    WORKFLOW_STARTED = "workflow.started"
    WORKFLOW_COMPLETED = "workflow.completed"
    WORKFLOW_FAILED = "workflow.failed"
    WORKFLOW_CANCELLED = "workflow.cancelled"
    WORKFLOW_BLOCKED = "workflow.blocked"
    PHASE_TRANSITIONED = "phase.transitioned"
    STEP_SETTLED = "step.settled"
    GATE_OPENED = "gate.opened"
    GATE_ANSWERED = "gate.answered"
    GATE_REMINDED = "gate.reminded"
    GATE_EXPIRED = "gate.expired"
    GATE_ESCALATED = "gate.escalated"
    ENGINE_CIRCUIT_CHANGED = "engine.circuit_changed"


_FINISHED = {
    Status.COMPLETED: EventType.WORKFLOW_COMPLETED,
    Status.FAILED: EventType.WORKFLOW_FAILED,
    Status.CANCELLED: EventType.WORKFLOW_CANCELLED,
}


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """Where a large payload is (``pointer``) and its SHA-256 (hex) and length in bytes."""

    pointer: str
    sha256: str
    size: int

    def __post_init__(self) -> None:
        if not self.pointer or _SHA256.fullmatch(self.sha256) is None or self.size < 0:
            raise ValueError("a payload reference is a pointer, a hex SHA-256 and a size")


@dataclass(frozen=True, slots=True)
class DomainEvent:
    event_id: UUID
    event_type: EventType
    timestamp: datetime
    tenant_id: str
    project_id: str
    correlation_id: str | None
    causation_id: str | None
    payload: JsonObject = field(default_factory=dict)
    payload_ref: PayloadRef | None = None

    def __post_init__(self) -> None:
        if self.timestamp.tzinfo is None:
            raise ValueError("an event's timestamp is timezone-aware")
        if not self.tenant_id:
            raise ValueError("an event names its tenant")
        if self.payload_ref is not None and self.payload:
            raise ValueError("a payload travels inline or by reference, not both")

    @property
    def routing_key(self) -> str:
        return routing_key(self.tenant_id, self.project_id, self.event_type)


def exchange_for(prefix: str) -> str:
    """The events exchange under a deployment's name prefix (``vibey``: ``vibey.events``)."""
    return f"{prefix}.events"


def routing_key(tenant_id: str, project_id: str, event_type: str) -> str:
    """``<tenant>.<project>.<event_type>``; a dot in a name becomes ``_`` (a topic separator)."""
    project = _SEGMENT.sub("_", project_id) if project_id else NO_PROJECT
    return f"{_SEGMENT.sub('_', tenant_id)}.{project}.{event_type}"


def binding_key(
    *, tenant: str | None = None, project: str | None = None, event_type: str | None = None
) -> str:
    """The topic binding for the events of ``tenant``/``project``/``event_type`` (``None``:
    any). ``event_type`` may be a family: ``gate`` binds every ``gate.*``."""
    tenant_part = "*" if tenant is None else _SEGMENT.sub("_", tenant)
    project_part = "*" if project is None else _SEGMENT.sub("_", project)
    if event_type is None:
        kind = "#"
    elif "." in event_type:
        kind = event_type
    else:
        kind = f"{event_type}.*"
    return f"{tenant_part}.{project_part}.{kind}"


# --- payloads and references ---------------------------------------------------------------


def canonical(payload: JsonObject) -> bytes:
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EventCodecError(f"a payload is JSON: {exc}") from None
    return text.encode()


def digest(payload: JsonObject) -> str:
    return hashlib.sha256(canonical(payload)).hexdigest()


def pointer_of(event_id: UUID) -> str:
    """Where a by-reference payload is: the ``domain_event`` row's payload."""
    return f"vibey:domain_event/{event_id}/payload"


def by_reference(event: DomainEvent, *, limit: int = INLINE_LIMIT) -> DomainEvent:
    """``event`` as it travels: its payload inline when short, else a reference to it."""
    body = canonical(event.payload)
    if len(body) <= limit:
        return event
    ref = PayloadRef(pointer_of(event.event_id), hashlib.sha256(body).hexdigest(), len(body))
    return replace(event, payload={}, payload_ref=ref)


def resolved(event: DomainEvent, payload: JsonObject) -> DomainEvent:
    """``event`` with its by-reference ``payload`` put back; a payload whose digest is not the
    reference's raises :class:`EventCodecError`."""
    ref = event.payload_ref
    if ref is None:
        return event
    if digest(payload) != ref.sha256:
        raise EventCodecError(f"event {event.event_id}: the payload does not match its SHA-256")
    return replace(event, payload=dict(payload), payload_ref=None)


# --- the wire codec ------------------------------------------------------------------------

_FIELDS = frozenset(
    {
        "version",
        "event_id",
        "event_type",
        "timestamp",
        "tenant_id",
        "project_id",
        "correlation_id",
        "causation_id",
        "payload",
        "payload_ref",
    }
)


def to_json(event: DomainEvent) -> dict[str, Any]:
    return _envelope(event, json.loads(canonical(event.payload)))


def _envelope(event: DomainEvent, payload: Any) -> dict[str, Any]:
    ref = event.payload_ref
    return {
        "version": VERSION,
        "event_id": str(event.event_id),
        "event_type": event.event_type.value,
        "timestamp": event.timestamp.isoformat(),
        "tenant_id": event.tenant_id,
        "project_id": event.project_id,
        "correlation_id": event.correlation_id,
        "causation_id": event.causation_id,
        "payload": payload,
        "payload_ref": None
        if ref is None
        else {"pointer": ref.pointer, "sha256": ref.sha256, "size": ref.size},
    }


def encode(event: DomainEvent) -> bytes:
    """The wire form: :func:`to_json`'s document, its keys sorted at every level, compact.
    One serialisation: the payload goes in as it is (sorting the envelope's keys sorts its
    keys too), not through :func:`canonical` and back."""
    try:
        text = json.dumps(
            _envelope(event, event.payload),
            sort_keys=True,
            separators=(",", ":"),
            allow_nan=False,
        )
    except (TypeError, ValueError) as exc:
        raise EventCodecError(f"a payload is JSON: {exc}") from None
    return text.encode()


def decode(body: bytes | str) -> DomainEvent:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise EventCodecError(f"not JSON: {exc}") from None
    return from_json(data)


def from_json(data: Any) -> DomainEvent:
    if not isinstance(data, dict):
        raise EventCodecError(f"an event is a JSON object, got {type(data).__name__}")
    keys = set(data)
    if keys != _FIELDS:
        extra, missing = sorted(keys - _FIELDS), sorted(_FIELDS - keys)
        raise EventCodecError(f"event fields: unknown {extra or '-'}, missing {missing or '-'}")
    version = data["version"]
    if type(version) is not int or version != VERSION:
        raise EventCodecError(f"event version {version!r}: this vibey reads version {VERSION}")
    try:
        return DomainEvent(
            event_id=UUID(_text(data, "event_id")),
            event_type=_event_type(data["event_type"]),
            timestamp=_timestamp(data["timestamp"]),
            tenant_id=_text(data, "tenant_id"),
            project_id=_text(data, "project_id"),
            correlation_id=_optional_text(data, "correlation_id"),
            causation_id=_optional_text(data, "causation_id"),
            payload=_object(data["payload"], "payload"),
            payload_ref=_ref(data["payload_ref"]),
        )
    except EventCodecError:
        raise
    except ValueError as exc:
        raise EventCodecError(f"event: {exc}") from None


def _text(data: Mapping[str, Any], name: str) -> str:
    value = data[name]
    if type(value) is not str:
        raise EventCodecError(f"{name} is a string, got {type(value).__name__}")
    return value


def _optional_text(data: Mapping[str, Any], name: str) -> str | None:
    return None if data[name] is None else _text(data, name)


def _event_type(value: Any) -> EventType:
    try:
        return EventType(value)
    except ValueError:
        raise EventCodecError(f"unknown event type {value!r}") from None


def _timestamp(value: Any) -> datetime:
    if type(value) is not str:
        raise EventCodecError("timestamp is an ISO 8601 string")
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise EventCodecError(f"timestamp {value!r} is not ISO 8601") from None
    if stamp.tzinfo is None:
        raise EventCodecError(f"timestamp {value!r} has no timezone")
    return stamp


def _object(value: Any, name: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise EventCodecError(f"{name} is a JSON object, got {type(value).__name__}")
    return value


def _ref(value: Any) -> PayloadRef | None:
    if value is None:
        return None
    ref = _object(value, "payload_ref")
    if set(ref) != {"pointer", "sha256", "size"}:
        raise EventCodecError("payload_ref has exactly pointer, sha256 and size")
    size = ref["size"]
    if type(size) is not int:
        raise EventCodecError("payload_ref.size is an integer")
    return PayloadRef(_text(ref, "pointer"), _text(ref, "sha256"), size)


# --- what a workflow event implies -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Draft:
    """An event before the store gives it an id, a timestamp and a tenant."""

    event_type: EventType
    payload: JsonObject = field(default_factory=dict)


def recorded(event: Event) -> tuple[Draft, ...]:
    """The facts a recorded workflow event reports, decided or not (a step settled, a gate
    answered)."""
    match event:
        case StepSucceeded(step=step, result=result):
            return (
                Draft(
                    EventType.STEP_SETTLED,
                    {"step": step, "outcome": "succeeded"} | {"result": dict(result)},
                ),
            )
        case StepFailed(step=step, failure_class=cls, detail=detail):
            failed = {"step": step, "outcome": "failed", "failure_class": cls.value}
            return (Draft(EventType.STEP_SETTLED, failed | {"detail": detail}),)
        case GateAnswered(gate=gate, answer=answer, by=by):
            answered = {"gate": gate, "answer": answer, "by": by, "default": by == DEFAULT_BY}
            return (Draft(EventType.GATE_ANSWERED, answered),)
    return ()


def implied(
    event: Event, before: Header, after: Header, commands: Iterable[Command]
) -> tuple[Draft, ...]:
    """The events one decision implies: a start, each phase transition, a finish or block.
    Gates opened are reported by the store (:func:`gate_opened`: it knows their ids)."""
    drafts: list[Draft] = []
    if isinstance(event, Started):
        drafts.append(Draft(EventType.WORKFLOW_STARTED, {"phase": before.phase}))
    phase = before.phase
    for command in commands:
        if isinstance(command, TransitionPhase):
            moved = {"from": phase, "to": command.phase, "cycle": command.cycle}
            drafts.append(Draft(EventType.PHASE_TRANSITIONED, moved))
            phase = command.phase
    drafts.extend(status_changed(before, after))
    return tuple(drafts)


def status_changed(before: Header, after: Header) -> tuple[Draft, ...]:
    """A workflow that just finished or blocked."""
    if after.status is before.status:
        return ()
    finished = _FINISHED.get(after.status)
    facts = {"phase": after.phase, "cycle": after.cycle, "reason": after.reason}
    if finished is not None and not before.status.finished:
        return (Draft(finished, facts | {"completion_mode": after.completion_mode}),)
    if after.status is Status.BLOCKED:
        return (Draft(EventType.WORKFLOW_BLOCKED, facts),)
    return ()


def gate_opened(gate_id: UUID, command: OpenGate, deadline_at: datetime | None) -> Draft:
    payload = {
        "gate_id": str(gate_id),
        "gate": command.gate,
        "kind": command.kind,
        "question": command.question,
        "answers": list(command.answers),
        "deadline_at": None if deadline_at is None else deadline_at.isoformat(),
        "on_deadline": command.on_deadline if deadline_at is not None else None,
    }
    return Draft(EventType.GATE_OPENED, payload)
