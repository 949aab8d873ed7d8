"""The domain-event codec (workflows/events.py): round trips, strictness, references."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.engine import (
    Complete,
    Fail,
    GateAnswered,
    Header,
    OpenGate,
    Started,
    Status,
    StepFailed,
    TransitionPhase,
)
from workflows.events import (
    DEFAULT_BY,
    INLINE_LIMIT,
    DomainEvent,
    EventCodecError,
    EventType,
    PayloadRef,
    binding_key,
    by_reference,
    decode,
    digest,
    encode,
    from_json,
    gate_opened,
    implied,
    recorded,
    resolved,
    routing_key,
    to_json,
)
from workflows.job import FailureClass

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
payloads = st.dictionaries(st.text(max_size=8), json_values, max_size=5)
stamps = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
optional_ids = st.none() | st.text(max_size=12)
domain_events = st.builds(
    DomainEvent,
    event_id=st.uuids(),
    event_type=st.sampled_from(EventType),
    timestamp=stamps,
    tenant_id=st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True),
    project_id=st.text(max_size=12),
    correlation_id=optional_ids,
    causation_id=optional_ids,
    payload=payloads,
)


@given(domain_events)
def test_every_event_round_trips_through_the_wire(event: DomainEvent) -> None:
    assert decode(encode(event)) == event


@given(domain_events)
def test_the_wire_form_is_the_canonical_document_serialised_once(event: DomainEvent) -> None:
    """encode() sorts the payload's keys with the envelope's: the bytes are those of the
    document to_json() gives (the payload through canonical()), sorted and compact."""
    document = json.dumps(to_json(event), sort_keys=True, separators=(",", ":")).encode()
    assert encode(event) == document


@given(domain_events)
def test_a_by_reference_event_round_trips_and_resolves_to_the_original(event: DomainEvent) -> None:
    travelling = by_reference(event, limit=16)
    assert decode(encode(travelling)) == travelling
    assert resolved(travelling, event.payload) == event
    if travelling.payload_ref is not None:
        assert travelling.payload == {}
        assert travelling.payload_ref.sha256 == digest(event.payload)


def test_a_large_payload_travels_by_reference_and_a_tampered_one_is_refused() -> None:
    event = _sample(payload={"result": "x" * (INLINE_LIMIT + 1)})
    travelling = by_reference(event)
    assert travelling.payload_ref is not None and len(encode(travelling)) < INLINE_LIMIT
    with pytest.raises(EventCodecError, match="SHA-256"):
        resolved(travelling, {"result": "y"})


def _sample(**changes: Any) -> DomainEvent:
    base: dict[str, Any] = {
        "event_id": UUID(int=7),
        "event_type": EventType.GATE_OPENED,
        "timestamp": datetime(2026, 12, 1, tzinfo=UTC),
        "tenant_id": "default",
        "project_id": "demo",
        "correlation_id": "wf",
        "causation_id": None,
        "payload": {"gate": "g"},
    }
    return DomainEvent(**(base | changes))


WRONG: dict[str, list[Any]] = {
    "version": [2, "1", None, True],
    "event_id": ["nope", 1, None],
    "event_type": ["gate.nope", 1, None],
    "timestamp": ["2026-12-01T00:00:00", "yesterday", 1, None],
    "tenant_id": [1, None, ""],
    "project_id": [1, None],
    "correlation_id": [1, ["x"]],
    "causation_id": [1, {"a": 1}],
    "payload": [[1], "x", None],
    "payload_ref": [{"pointer": "p"}, "x", {"pointer": "p", "sha256": "zz", "size": 1}],
}


@pytest.mark.parametrize(
    ("name", "bad"), [(n, b) for n, values in WRONG.items() for b in values], ids=repr
)
def test_each_field_refuses_a_wrong_value(name: str, bad: Any) -> None:
    data = to_json(_sample())
    data[name] = bad
    with pytest.raises(EventCodecError):
        from_json(json.loads(json.dumps(data)))


def test_a_missing_or_extra_field_or_a_body_that_is_not_json_is_refused() -> None:
    data = to_json(_sample())
    with pytest.raises(EventCodecError, match="missing"):
        from_json({k: v for k, v in data.items() if k != "tenant_id"})
    with pytest.raises(EventCodecError, match="unknown"):
        from_json({**data, "surprise": 1})
    with pytest.raises(EventCodecError, match="not JSON"):
        decode(b"\xff{")
    with pytest.raises(EventCodecError, match="object"):
        decode(b"[1]")
    assert set(WRONG) == set(data)


def test_a_timestamp_keeps_its_offset() -> None:
    stamp = datetime(2026, 12, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    assert decode(encode(_sample(timestamp=stamp))).timestamp == stamp


def test_routing_and_binding_keys() -> None:
    assert _sample().routing_key == "default.demo.gate.opened"
    assert routing_key("acme", "a.b", "step.settled") == "acme.a_b.step.settled"
    assert (
        routing_key("default", "", "engine.circuit_changed") == "default._.engine.circuit_changed"
    )
    assert binding_key() == "*.*.#"
    assert binding_key(project="demo", event_type="gate") == "*.demo.gate.*"
    assert binding_key(tenant="acme", event_type="gate.opened") == "acme.*.gate.opened"


def test_a_decision_implies_start_transitions_and_finish() -> None:
    before, after = Header("design"), Header("build", 1, Status.COMPLETED, "local")
    commands = (TransitionPhase("review", 0), TransitionPhase("build", 1), Complete("local"))
    drafts = implied(Started(), before, after, commands)
    assert [d.event_type for d in drafts] == [
        EventType.WORKFLOW_STARTED,
        EventType.PHASE_TRANSITIONED,
        EventType.PHASE_TRANSITIONED,
        EventType.WORKFLOW_COMPLETED,
    ]
    assert drafts[2].payload == {"from": "review", "to": "build", "cycle": 1}
    failed = implied(
        GateAnswered("g", "x", "me"),
        before,
        Header("design", 0, Status.FAILED, reason="r"),
        (Fail("r"),),
    )
    assert [d.event_type for d in failed] == [EventType.WORKFLOW_FAILED]
    assert implied(GateAnswered("g", "x", "me"), before, before, ()) == ()


def test_recorded_facts_mark_a_default_answer() -> None:
    (answered,) = recorded(GateAnswered("g", "yes", DEFAULT_BY))
    assert answered.event_type is EventType.GATE_ANSWERED and answered.payload["default"] is True
    (person,) = recorded(GateAnswered("g", "yes", "ann"))
    assert person.payload["default"] is False
    (settled,) = recorded(StepFailed("s", FailureClass.WORK, "boom"))
    assert settled.payload["outcome"] == "failed"


def test_a_gate_opened_names_its_id_and_deadline() -> None:
    gate = OpenGate("g", "k", "q?", ("a", "b"), deadline=timedelta(seconds=2), default="a")
    at = datetime(2026, 12, 1, tzinfo=UTC)
    draft = gate_opened(UUID(int=1), gate, at)
    assert draft.payload["deadline_at"] == at.isoformat()
    assert draft.payload["on_deadline"] == "answer"
    with pytest.raises(ValueError):
        PayloadRef("p", "nothex", 1)
