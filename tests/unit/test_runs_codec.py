"""The run protocol's codec (workflows/runs.py): every message round-trips, anything else is
refused with a reason, and no completion or capacity field (``resets_at`` above all) ever rides
on a message, whatever the caller tries."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.capacity import CreditsExhausted, encode_state
from workflows.runs import (
    FORBIDDEN_FIELDS,
    CodecRejection,
    ControlCommand,
    InFlight,
    Message,
    Purpose,
    RunAccepted,
    RunCodecError,
    RunControl,
    RunProgress,
    RunRequest,
    RunResult,
    RunStatus,
    ServiceStatus,
    Supersedes,
    decode,
    decode_request,
    encode,
    is_late,
)

times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
engine_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,10}", fullmatch=True)
cwds = st.lists(st.from_regex(r"[a-z0-9_-]{1,8}", fullmatch=True), min_size=1, max_size=4).map(
    lambda parts: "/" + "/".join(parts)
)
supersedes = st.none() | st.builds(
    Supersedes,
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20),
    st.integers(0, 1000),
)
requests = st.builds(
    RunRequest,
    run_id=st.uuids(),
    engine=engine_ids,
    purpose=st.sampled_from(Purpose),
    args=st.lists(texts, max_size=5).map(tuple),
    cwd=cwds,
    supersedes=supersedes,
    deadline_seconds=st.floats(0.001, 7 * 24 * 3600.0),
    start_by=times,
    requested_at=times,
    reply_to=st.from_regex(r"amq\.gen-[A-Za-z0-9_-]{1,20}", fullmatch=True),
    caller=texts,
)
results = st.builds(
    RunResult,
    run_id=st.uuids(),
    status=st.sampled_from(RunStatus),
    exit_code=st.none() | st.integers(-255, 255),
    started_at=st.none() | times,
    finished_at=times,
    detail=texts,
    service_instance=texts,
)
messages: st.SearchStrategy[Message] = st.one_of(
    requests,
    results,
    st.builds(RunAccepted, st.uuids(), texts, st.integers(0, 2**31), times),
    st.builds(RunProgress, st.uuids(), st.integers(0, 10**6), texts),
    st.builds(RunControl, st.uuids(), engine_ids, st.sampled_from(ControlCommand)),
    st.builds(
        ServiceStatus,
        st.uuids(),
        texts,
        times,
        st.lists(st.builds(InFlight, st.uuids(), cwds, st.none() | times), max_size=3).map(tuple),
        st.none() | times,
        texts,
    ),
)


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


@given(messages)
def test_every_message_round_trips(message: Message) -> None:
    assert decode(encode(message)) == message


@given(messages)
def test_no_completion_or_capacity_field_survives_encoding(message: Message) -> None:
    assert not _keys(json.loads(encode(message))) & FORBIDDEN_FIELDS


@given(results, st.sampled_from(sorted(FORBIDDEN_FIELDS)))
def test_a_credits_state_riding_on_a_result_is_refused(result: RunResult, key: str) -> None:
    document = json.loads(encode(result))
    credits = encode_state(CreditsExhausted(detail="spent"))
    document[key] = {**credits, "resets_at": "2030-01-01T00:00:00+00:00"}
    with pytest.raises(RunCodecError) as caught:
        decode(json.dumps(document).encode())
    assert caught.value.reason is CodecRejection.FORBIDDEN_FIELD
    assert caught.value.field == key


@given(messages, st.text(min_size=1, max_size=12).filter(lambda k: k != "schema"))
def test_an_extra_field_is_refused(message: Message, key: str) -> None:
    document = json.loads(encode(message))
    if key in document:
        return
    document[key] = 1
    with pytest.raises(RunCodecError) as caught:
        decode(json.dumps(document).encode())
    assert caught.value.reason in (CodecRejection.EXTRA_FIELD, CodecRejection.FORBIDDEN_FIELD)


@given(messages, st.data())
def test_a_missing_field_is_refused(message: Message, data: st.DataObject) -> None:
    document = json.loads(encode(message))
    optional = {"caller", "detail", "service_instance", "last_probe_at", "last_probe"}
    key = data.draw(st.sampled_from(sorted(set(document) - optional)))
    del document[key]
    with pytest.raises(RunCodecError) as caught:
        decode(json.dumps(document).encode())
    expected = CodecRejection.UNKNOWN_SCHEMA if key == "schema" else CodecRejection.MISSING_FIELD
    assert caught.value.reason is expected


@given(st.binary(max_size=200))
def test_decode_is_total_on_bytes(body: bytes) -> None:
    with contextlib.suppress(RunCodecError):
        decode(body)


@given(messages, st.sampled_from(["v2", "vibey.run.request/2", "vibey.job.dispatch/1", None]))
def test_an_unknown_schema_is_refused(message: Message, schema: object) -> None:
    document = json.loads(encode(message))
    document["schema"] = schema
    with pytest.raises(RunCodecError) as caught:
        decode(json.dumps(document).encode())
    assert caught.value.reason is CodecRejection.UNKNOWN_SCHEMA


def _request(**changes: Any) -> dict[str, Any]:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    request = RunRequest(
        run_id=uuid4(),
        engine="claude",
        purpose=Purpose.RUN,
        args=("-p", "go"),
        cwd="/work/project",
        supersedes=Supersedes("job-1", 2),
        deadline_seconds=60,
        start_by=now + timedelta(seconds=30),
        requested_at=now,
        reply_to="amq.gen-x",
    )
    document: dict[str, Any] = json.loads(encode(request))
    document.update(changes)
    return document


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"env": {"PATH": "/tmp/evil"}}, "env"),
        ({"binary": "/bin/sh"}, "binary"),
        ({"cwd": "relative/dir"}, "cwd"),
        ({"cwd": "/work/../etc"}, "cwd"),
        ({"args": ["ok", 3]}, "args"),
        ({"args": "-p go"}, "args"),
        ({"deadline_seconds": 0}, "deadline_seconds"),
        ({"deadline_seconds": True}, "deadline_seconds"),
        ({"purpose": "shell"}, "purpose"),
        ({"start_by": "2026-12-01T00:00:00"}, "start_by"),
        ({"supersedes": {"key": "j", "attempt": -1}}, "supersedes.attempt"),
        ({"supersedes": {"key": "j"}}, "supersedes"),
        ({"engine": "a.b"}, "engine"),
    ],
)
def test_a_bad_request_names_its_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(RunCodecError) as caught:
        decode_request(json.dumps(_request(**changes)).encode())
    assert caught.value.field == field


def test_decode_request_refuses_another_message() -> None:
    result = RunResult(uuid4(), RunStatus.EXITED, 0, None, datetime.now(UTC))
    with pytest.raises(RunCodecError):
        decode_request(encode(result))


def test_a_duplicate_key_and_a_huge_body_are_refused() -> None:
    with pytest.raises(RunCodecError) as caught:
        decode(b'{"schema": "vibey.run.control/1", "schema": "x"}')
    assert caught.value.reason is CodecRejection.DUPLICATE_KEY
    with pytest.raises(RunCodecError) as caught:
        decode(b" " * (2 * 1024 * 1024))
    assert caught.value.reason is CodecRejection.TOO_LARGE


@given(requests, times)
def test_a_request_is_late_only_after_its_start_by(request: RunRequest, now: datetime) -> None:
    assert is_late(request, now) == (now > request.start_by)
