"""The dispatch pointer (workflows/dispatch.py) against seed 000 §3, §5, §7 and §8.

``MALFORMED`` holds one body per rejection reason; it doubles as the list of malformed-message
classes that the broker tests publish (each must dead-letter, never be guessed at).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.dispatch import (
    CONTENT_TYPE,
    DEFAULT_WAIT_TIERS,
    DUE_SLACK,
    ENVELOPE_FIELDS,
    MAX_DISPATCH_SEQ,
    MAX_ENVELOPE_BYTES,
    MESSAGE_TYPE,
    SCHEMA,
    DispatchEnvelope,
    Drop,
    EnvelopeError,
    EnvelopeRejection,
    MissReason,
    Redelay,
    RowSnapshot,
    WaitTiers,
    decide_miss,
    decode,
    encode,
    tier_name,
)
from workflows.job import JobState
from workflows.protocol.kinds import STEP_KINDS

R = EnvelopeRejection
JOB_ID = "0b6f2c3e-9d1a-4c57-8e2f-5a7b9c1d3e4f"
NOW = datetime(2026, 9, 22, 12, 0, tzinfo=UTC)
VALID: dict[str, Any] = {
    "schema": SCHEMA,
    "job_id": JOB_ID,
    "project_id": "proj-1",
    "dispatch_seq": 3,
    "kind": "build.implement",
    "not_before": "2026-09-22T12:00:00+00:00",
}
_DELETE = object()


def body(**changes: Any) -> bytes:
    """A valid envelope body with some fields replaced (or deleted with ``_DELETE``)."""
    document = {**VALID, **changes}
    document = {k: v for k, v in document.items() if v is not _DELETE}
    return json.dumps(document).encode("utf-8")


def reason_of(raw: bytes) -> EnvelopeRejection:
    with pytest.raises(EnvelopeError) as raised:
        decode(raw)
    return raised.value.reason


# --- Strategies --------------------------------------------------------------------------

offsets = st.timedeltas(
    min_value=-timedelta(hours=23, minutes=59), max_value=timedelta(hours=23, minutes=59)
)
zones = st.just(UTC) | st.builds(timezone, offsets)
aware_times = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=zones
)
project_ids = st.text(min_size=1, max_size=200)
registered_kinds = st.sampled_from(sorted(STEP_KINDS.names()))
envelopes = st.builds(
    DispatchEnvelope,
    job_id=st.uuids(),
    project_id=project_ids,
    dispatch_seq=st.integers(min_value=1, max_value=MAX_DISPATCH_SEQ),
    kind=registered_kinds,
    not_before=aware_times,
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


# --- Malformed bodies: one per reason, then more of each --------------------------------

_valid_text = json.dumps(VALID)
MALFORMED: dict[EnvelopeRejection, bytes] = {
    # A valid envelope padded past the limit: the size is checked before parsing.
    R.TOO_LARGE: _valid_text.encode().ljust(MAX_ENVELOPE_BYTES + 1),
    R.NOT_UTF8: body(project_id="p").replace(b'"p"', b'"\xff"'),
    R.NOT_JSON: _valid_text[:-1].encode(),
    R.DUPLICATE_KEY: _valid_text[:-1].encode() + b', "kind": "build.verify"}',
    R.NOT_OBJECT: json.dumps([VALID]).encode(),
    R.UNKNOWN_SCHEMA: body(schema="vibey.job.dispatch/2"),
    R.MISSING_FIELD: body(not_before=_DELETE),
    R.EXTRA_FIELD: body(priority=1),
    R.BAD_JOB_ID: body(job_id=JOB_ID.upper()),
    R.BAD_PROJECT_ID: body(project_id=""),
    R.BAD_DISPATCH_SEQ: body(dispatch_seq=0),
    R.UNKNOWN_KIND: body(kind="build..deploy"),
    R.BAD_NOT_BEFORE: body(not_before="2026-09-22T12:00:00"),
}

MORE_MALFORMED: list[tuple[EnvelopeRejection, bytes]] = [
    (R.TOO_LARGE, b"\xff" * (MAX_ENVELOPE_BYTES + 1)),
    (R.TOO_LARGE, b"[" * (MAX_ENVELOPE_BYTES + 1)),
    (R.NOT_UTF8, b"\xed\xa0\x80"),  # a surrogate, encoded
    (R.NOT_UTF8, b'{"schema": "\xc0\xaf"}'),  # an overlong encoding
    (R.NOT_UTF8, b'{"schema": "\xe2\x82"}'),  # a truncated sequence
    (R.NOT_JSON, b""),
    (R.NOT_JSON, b"   "),
    (R.NOT_JSON, b"\xef\xbb\xbf" + _valid_text.encode()),  # a byte-order mark
    (R.NOT_JSON, _valid_text.encode() + b"{}"),
    (R.NOT_JSON, _valid_text.replace('"', "'").encode()),
    (R.NOT_JSON, body(dispatch_seq=3).replace(b"3", b"NaN")),
    (R.NOT_JSON, body(dispatch_seq=3).replace(b"3", b"Infinity")),
    (R.NOT_JSON, body(dispatch_seq=3).replace(b"3", b"-Infinity")),
    (R.NOT_JSON, body(dispatch_seq=3).replace(b"3", b"1" * 5000)),  # past the int digit limit
    (R.NOT_JSON, b"[" * 8_000 + b"]" * 8_000),  # nesting deeper than the recursion limit
    (R.NOT_JSON, b'{"schema": "\\x41"}'),
    (R.DUPLICATE_KEY, b'{"schema": "vibey.job.dispatch/1", "schema": "vibey.job.dispatch/1"}'),
    (R.DUPLICATE_KEY, b'{"a": {"b": 1, "b": 1}}'),
    (R.NOT_OBJECT, b"null"),
    (R.NOT_OBJECT, b"17"),
    (R.NOT_OBJECT, b'"vibey.job.dispatch/1"'),
    (R.NOT_OBJECT, b"[]"),
    (R.NOT_OBJECT, b"true"),
    (R.UNKNOWN_SCHEMA, body(schema=_DELETE)),
    (R.UNKNOWN_SCHEMA, body(schema=None)),
    (R.UNKNOWN_SCHEMA, body(schema=1)),
    (R.UNKNOWN_SCHEMA, body(schema=[SCHEMA])),
    (R.UNKNOWN_SCHEMA, body(schema=SCHEMA + " ")),
    (R.UNKNOWN_SCHEMA, body(schema=SCHEMA.upper())),
    (R.UNKNOWN_SCHEMA, b"{}"),
    (R.UNKNOWN_SCHEMA, json.dumps({"schema": "vibey.job.dispatch/2", "x": 1}).encode()),
    (R.MISSING_FIELD, json.dumps({"schema": SCHEMA}).encode()),
    *[(R.MISSING_FIELD, body(**{name: _DELETE})) for name in sorted(ENVELOPE_FIELDS - {"schema"})],
    (R.EXTRA_FIELD, body(Kind="build.implement")),
    (R.EXTRA_FIELD, body(resets_at="2026-09-22T13:00:00+00:00")),
    (R.EXTRA_FIELD, body(**{"": None})),
    (R.BAD_JOB_ID, body(job_id="{" + JOB_ID + "}")),
    (R.BAD_JOB_ID, body(job_id=JOB_ID.replace("-", ""))),
    (R.BAD_JOB_ID, body(job_id="urn:uuid:" + JOB_ID)),
    (R.BAD_JOB_ID, body(job_id=JOB_ID + "\n")),
    (R.BAD_JOB_ID, body(job_id=JOB_ID[:-1])),
    (R.BAD_JOB_ID, body(job_id="٠" * 8 + JOB_ID[8:])),  # Arabic-Indic digits int() accepts
    (R.BAD_JOB_ID, body(job_id="")),
    (R.BAD_JOB_ID, body(job_id=None)),
    (R.BAD_JOB_ID, body(job_id=int(UUID(JOB_ID)))),
    (R.BAD_JOB_ID, body(job_id=[JOB_ID])),
    (R.BAD_PROJECT_ID, body(project_id="p" * 201)),
    (R.BAD_PROJECT_ID, body(project_id=7)),
    (R.BAD_PROJECT_ID, body(project_id=None)),
    (R.BAD_PROJECT_ID, body(project_id=["p"])),
    (R.BAD_PROJECT_ID, body(project_id="\ud800")),  # a lone surrogate, as a JSON escape
    (R.BAD_DISPATCH_SEQ, body(dispatch_seq=-1)),
    (R.BAD_DISPATCH_SEQ, body(dispatch_seq=True)),
    (R.BAD_DISPATCH_SEQ, body(dispatch_seq=False)),
    (R.BAD_DISPATCH_SEQ, body(dispatch_seq=3.0)),
    (R.BAD_DISPATCH_SEQ, body(dispatch_seq=1e3)),
    (R.BAD_DISPATCH_SEQ, body(dispatch_seq="3")),
    (R.BAD_DISPATCH_SEQ, body(dispatch_seq=None)),
    (R.BAD_DISPATCH_SEQ, body(dispatch_seq=MAX_DISPATCH_SEQ + 1)),
    (R.BAD_DISPATCH_SEQ, body(dispatch_seq=10**4000)),
    (R.UNKNOWN_KIND, body(kind="")),
    (R.UNKNOWN_KIND, body(kind="BUILD.IMPLEMENT")),
    (R.UNKNOWN_KIND, body(kind=" build.implement")),
    (R.UNKNOWN_KIND, body(kind=None)),
    (R.UNKNOWN_KIND, body(kind=1)),
    (R.UNKNOWN_KIND, body(kind=["build.implement"])),
    (R.UNKNOWN_KIND, body(kind={"build": "implement"})),  # unhashable, so never looked up
    (R.BAD_NOT_BEFORE, body(not_before="2026-09-22")),
    (R.BAD_NOT_BEFORE, body(not_before="")),
    (R.BAD_NOT_BEFORE, body(not_before="tomorrow")),
    (R.BAD_NOT_BEFORE, body(not_before=1_758_542_400)),
    (R.BAD_NOT_BEFORE, body(not_before=None)),
    (R.BAD_NOT_BEFORE, body(not_before="2026-09-22T12:00:00+25:00")),
    (R.BAD_NOT_BEFORE, body(not_before="0001-01-01T00:00:00+01:00")),  # before year 1 in UTC
    (R.BAD_NOT_BEFORE, body(not_before="9999-12-31T23:59:59-01:00")),  # after 9999 in UTC
    (R.BAD_NOT_BEFORE, body(not_before="\ud800")),
    (R.BAD_NOT_BEFORE, body(not_before="٢٠٢٦-09-22T12:00:00+00:00")),
    (R.BAD_NOT_BEFORE, body(not_before="2026-09-22T12:00:00+00:00" + " " * 60)),
]


def test_every_rejection_reason_has_an_example() -> None:
    assert set(MALFORMED) == set(EnvelopeRejection)
    assert len(MALFORMED) >= 12
    assert {reason for reason, _ in MORE_MALFORMED} == set(EnvelopeRejection)


@pytest.mark.parametrize(("reason", "raw"), sorted(MALFORMED.items()), ids=sorted(MALFORMED))
def test_one_malformed_body_per_reason(reason: EnvelopeRejection, raw: bytes) -> None:
    with pytest.raises(EnvelopeError) as raised:
        decode(raw)
    error = raised.value
    assert error.reason is reason
    assert isinstance(error, ValueError)
    message = str(error)
    assert message.startswith(f"not a {SCHEMA} envelope ({reason}): ")
    assert "\n" not in message
    assert len(message) < 400


@pytest.mark.parametrize(
    ("reason", "raw"), MORE_MALFORMED, ids=[f"{r}-{i}" for i, (r, _) in enumerate(MORE_MALFORMED)]
)
def test_more_malformed_bodies(reason: EnvelopeRejection, raw: bytes) -> None:
    assert reason_of(raw) is reason


def test_the_body_the_examples_mutate_is_valid() -> None:
    # The base the examples mutate is itself valid, so each example fails for its own reason.
    assert decode(body()) == DispatchEnvelope(
        job_id=UUID(JOB_ID),
        project_id="proj-1",
        dispatch_seq=3,
        kind="build.implement",
        not_before=NOW,
    )


def test_a_body_of_exactly_the_limit_decodes() -> None:
    padded = _valid_text.encode().ljust(MAX_ENVELOPE_BYTES)
    assert len(padded) == MAX_ENVELOPE_BYTES
    assert decode(padded).dispatch_seq == 3
    assert reason_of(padded + b" ") is R.TOO_LARGE


def test_not_before_accepts_any_iso_offset_and_normalises_to_utc() -> None:
    for text in (
        "2026-09-22T14:00:00+02:00",
        "2026-09-22T12:00:00Z",
        "2026-09-22T07:00:00-05:00",
        "2026-09-22 12:00:00+00:00",
        "2026-09-22T12:00:00.000000+00:00",
    ):
        decoded = decode(body(not_before=text))
        assert decoded.not_before == NOW
        assert decoded.not_before.tzinfo is UTC


@pytest.mark.parametrize("kind", ["build.plan", "orders.charge", "a", "fan_out.item_2"])
def test_decode_takes_any_kind_name_as_sent(kind: str) -> None:
    # What a kind means is its definition's; the claiming worker knows it. The row's kind is
    # canonical already (an alias is resolved when the step is scheduled).
    assert decode(body(kind=kind)).kind == kind


@pytest.mark.parametrize("kind", ["Orders", "orders.", ".orders", "orders..x", "2fa", "x" * 101])
def test_decode_refuses_what_is_not_a_kind_name(kind: str) -> None:
    with pytest.raises(EnvelopeError) as raised:
        decode(body(kind=kind))
    assert raised.value.reason is R.UNKNOWN_KIND


# --- Codec properties --------------------------------------------------------------------


@given(envelopes)
def test_round_trip(envelope: DispatchEnvelope) -> None:
    assert decode(encode(envelope)) == envelope


@given(envelopes)
def test_encoding_is_compact_canonical_json_of_exactly_six_fields(
    envelope: DispatchEnvelope,
) -> None:
    raw = encode(envelope)
    document = json.loads(raw.decode("utf-8"))
    assert set(document) == ENVELOPE_FIELDS
    assert document["schema"] == SCHEMA
    assert document["job_id"] == str(envelope.job_id)
    assert document["dispatch_seq"] == envelope.dispatch_seq
    assert document["not_before"].endswith("+00:00")
    assert datetime.fromisoformat(document["not_before"]) == envelope.not_before
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert raw == canonical.encode("utf-8")
    assert len(raw) <= MAX_ENVELOPE_BYTES
    assert encode(decode(raw)) == raw


@given(st.uuids(), project_ids, st.integers(1, MAX_DISPATCH_SEQ), registered_kinds, aware_times)
def test_construction_normalises_kind_and_time(
    job_id: UUID, project: str, seq: int, kind: str, when: datetime
) -> None:
    envelope = DispatchEnvelope(job_id, project, seq, kind, when)
    assert envelope.kind == kind
    assert envelope.not_before == when
    assert envelope.not_before.tzinfo is UTC
    assert envelope.message_id == f"{job_id}:{seq}"
    assert envelope.SCHEMA == SCHEMA


def test_message_id_example_and_amqp_properties() -> None:
    envelope = decode(body())
    assert envelope.message_id == f"{JOB_ID}:3"
    assert (MESSAGE_TYPE, CONTENT_TYPE) == ("job.dispatch", "application/json")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"job_id": JOB_ID}, R.BAD_JOB_ID),
        ({"project_id": ""}, R.BAD_PROJECT_ID),
        ({"project_id": "x" * 201}, R.BAD_PROJECT_ID),
        ({"dispatch_seq": 0}, R.BAD_DISPATCH_SEQ),
        ({"dispatch_seq": True}, R.BAD_DISPATCH_SEQ),
        ({"dispatch_seq": 2**64}, R.BAD_DISPATCH_SEQ),
        ({"kind": "build.Nothing"}, R.UNKNOWN_KIND),
        ({"not_before": datetime(2026, 9, 22, 12)}, R.BAD_NOT_BEFORE),
        ({"not_before": "2026-09-22T12:00:00+00:00"}, R.BAD_NOT_BEFORE),
    ],
    ids=str,
)
def test_construction_validates_like_decode(
    changes: dict[str, Any], reason: EnvelopeRejection
) -> None:
    valid = decode(body())
    with pytest.raises(EnvelopeError) as raised:
        dataclasses.replace(valid, **changes)
    assert raised.value.reason is reason


def test_envelopes_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        decode(body()).dispatch_seq = 4  # type: ignore[misc]


def _assert_only_envelope_errors(raw: bytes) -> None:
    try:
        decoded = decode(raw)
    except EnvelopeError as error:
        assert error.reason in set(EnvelopeRejection)
        assert "\n" not in str(error)
    else:
        assert decode(encode(decoded)) == decoded


@settings(max_examples=200)
@given(st.binary(max_size=512))
def test_decode_raises_only_envelope_errors_for_any_bytes(raw: bytes) -> None:
    _assert_only_envelope_errors(raw)


@given(st.binary(max_size=16), st.integers(-4, 4), st.sampled_from([b" ", b"[", b"\xff", b"1"]))
def test_bodies_around_the_size_limit(head: bytes, over: int, filler: bytes) -> None:
    raw = head.ljust(MAX_ENVELOPE_BYTES + over, filler)
    if over > 0:
        assert reason_of(raw) is R.TOO_LARGE
    else:
        _assert_only_envelope_errors(raw)


@given(st.text())
def test_decode_raises_only_envelope_errors_for_any_text(text: str) -> None:
    _assert_only_envelope_errors(text.encode("utf-8"))


@st.composite
def byte_mutations(draw: st.DrawFn) -> bytes:
    raw = bytearray(encode(draw(envelopes)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        at = draw(st.integers(min_value=0, max_value=len(raw)))
        op = draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "insert" or at == len(raw):
            raw[at:at] = draw(st.binary(min_size=1, max_size=3))
        elif op == "flip":
            raw[at] ^= 1 << draw(st.integers(0, 7))
        else:
            del raw[at]
    return bytes(raw)


@settings(max_examples=150)
@given(byte_mutations())
def test_mutated_bodies_raise_only_envelope_errors(raw: bytes) -> None:
    _assert_only_envelope_errors(raw)


FIELD_REASON: dict[str, EnvelopeRejection] = {
    "schema": R.UNKNOWN_SCHEMA,
    "job_id": R.BAD_JOB_ID,
    "project_id": R.BAD_PROJECT_ID,
    "dispatch_seq": R.BAD_DISPATCH_SEQ,
    "kind": R.UNKNOWN_KIND,
    "not_before": R.BAD_NOT_BEFORE,
}


def _wrong_type_for(field: str) -> Callable[[object], bool]:
    if field == "dispatch_seq":
        return lambda v: isinstance(v, bool) or not isinstance(v, int)
    return lambda v: not isinstance(v, str)


@given(envelopes, st.sampled_from(sorted(ENVELOPE_FIELDS)), st.data())
def test_a_field_of_the_wrong_json_type_is_rejected_for_that_field(
    envelope: DispatchEnvelope, field: str, data: st.DataObject
) -> None:
    document = json.loads(encode(envelope))
    document[field] = data.draw(json_values.filter(_wrong_type_for(field)))
    assert reason_of(json.dumps(document).encode()) is FIELD_REASON[field]


@given(envelopes, st.sampled_from(sorted(ENVELOPE_FIELDS)), json_values, st.text(max_size=10))
def test_json_level_mutations_raise_only_envelope_errors(
    envelope: DispatchEnvelope, field: str, value: object, key: str
) -> None:
    document = json.loads(encode(envelope))
    replaced = {**document, field: value}
    _assert_only_envelope_errors(json.dumps(replaced).encode())
    without = {k: v for k, v in document.items() if k != field}
    assert reason_of(json.dumps(without).encode()) in {R.UNKNOWN_SCHEMA, R.MISSING_FIELD}
    if key not in document:
        assert reason_of(json.dumps({**document, key: value}).encode()) is R.EXTRA_FIELD


# --- Wait tiers --------------------------------------------------------------------------

MS = timedelta(milliseconds=1)


def test_default_wait_tiers_are_the_seed_six() -> None:
    assert DEFAULT_WAIT_TIERS.names == ("w1s", "w5s", "w30s", "w2m", "w10m", "w1h")
    assert WaitTiers.from_seconds([1, 5, 30, 120, 600, 3600]) == DEFAULT_WAIT_TIERS
    assert DEFAULT_WAIT_TIERS.smallest == timedelta(seconds=1)
    assert timedelta(milliseconds=50) == DUE_SLACK


@pytest.mark.parametrize(
    ("tier", "name"),
    [
        (timedelta(milliseconds=1), "w1ms"),
        (timedelta(milliseconds=1500), "w1500ms"),
        (timedelta(seconds=1.001), "w1001ms"),
        (timedelta(seconds=1), "w1s"),
        (timedelta(seconds=90), "w90s"),
        (timedelta(seconds=60), "w1m"),
        (timedelta(minutes=90), "w90m"),
        (timedelta(hours=1), "w1h"),
        (timedelta(hours=36), "w36h"),
    ],
    ids=str,
)
def test_tier_name_examples(tier: timedelta, name: str) -> None:
    assert tier_name(tier) == name


_TIER_NAME = re.compile(r"w([1-9][0-9]*)(ms|s|m|h)")
_UNIT = {"ms": MS, "s": timedelta(seconds=1), "m": timedelta(minutes=1), "h": timedelta(hours=1)}


@given(st.integers(min_value=1, max_value=10**10))
def test_tier_name_is_exact_and_uses_the_largest_unit(milliseconds: int) -> None:
    tier = milliseconds * MS
    match = _TIER_NAME.fullmatch(tier_name(tier))
    assert match, tier_name(tier)
    count, unit = int(match[1]), _UNIT[match[2]]
    assert count * unit == tier
    larger = [u for u in _UNIT.values() if u > unit]
    assert all(tier % u for u in larger)


@pytest.mark.parametrize(
    "tiers",
    [
        (),
        (timedelta(0),),
        (timedelta(seconds=-1),),
        (timedelta(seconds=1), timedelta(seconds=1)),
        (timedelta(seconds=60), timedelta(minutes=1)),
        (timedelta(microseconds=1500),),
        (timedelta(seconds=1), 5),
    ],
    ids=str,
)
def test_wait_tiers_are_validated(tiers: tuple[timedelta, ...]) -> None:
    with pytest.raises(ValueError, match="tier"):
        WaitTiers(tiers)


@pytest.mark.parametrize("tier", [timedelta(0), -MS, timedelta(microseconds=1)], ids=str)
def test_tier_name_rejects_what_cannot_be_a_tier(tier: timedelta) -> None:
    with pytest.raises(ValueError, match="tier"):
        tier_name(tier)


def test_wait_tiers_are_kept_sorted() -> None:
    tiers = WaitTiers((timedelta(minutes=2), timedelta(seconds=1), timedelta(seconds=5)))
    assert tiers.names == ("w1s", "w5s", "w2m")


@pytest.mark.parametrize(
    ("remaining", "tier"),
    [
        (timedelta(hours=-2), None),
        (timedelta(0), None),
        (DUE_SLACK, None),
        (DUE_SLACK + timedelta(microseconds=1), timedelta(seconds=1)),
        (timedelta(milliseconds=999), timedelta(seconds=1)),
        (timedelta(seconds=1), timedelta(seconds=1)),
        (timedelta(seconds=4.999), timedelta(seconds=1)),
        (timedelta(seconds=5), timedelta(seconds=5)),
        (timedelta(minutes=15), timedelta(minutes=10)),
        (timedelta(hours=2), timedelta(hours=1)),
        (timedelta(days=30), timedelta(hours=1)),
    ],
    ids=str,
)
def test_route_examples(remaining: timedelta, tier: timedelta | None) -> None:
    assert DEFAULT_WAIT_TIERS.route(remaining) == tier


def _hops(tiers: WaitTiers, remaining: timedelta, limit: int) -> list[timedelta]:
    hops: list[timedelta] = []
    while (tier := tiers.route(remaining)) is not None:
        hops.append(tier)
        remaining -= tier
        assert len(hops) <= limit, "routing the remainder did not terminate"
    return hops


def test_a_fifteen_minute_backoff_hops_down_the_tiers() -> None:
    assert _hops(DEFAULT_WAIT_TIERS, timedelta(minutes=15), 10) == [
        timedelta(minutes=10),
        timedelta(minutes=2),
        timedelta(minutes=2),
        timedelta(seconds=30),
        timedelta(seconds=30),
    ]
    assert _hops(DEFAULT_WAIT_TIERS, timedelta(hours=2), 10) == [timedelta(hours=1)] * 2


@st.composite
def wait_tiers(draw: st.DrawFn) -> WaitTiers:
    milliseconds = draw(st.lists(st.integers(1, 86_400_000), min_size=1, max_size=8, unique=True))
    return WaitTiers(tuple(m * MS for m in milliseconds))


tier_lists = st.just(DEFAULT_WAIT_TIERS) | wait_tiers()
remainders = st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=2))


@given(tier_lists, remainders)
def test_route_never_picks_a_tier_longer_than_the_wait_unless_it_must(
    tiers: WaitTiers, remaining: timedelta
) -> None:
    tier = tiers.route(remaining)
    if remaining <= DUE_SLACK:
        assert tier is None
        return
    assert tier in tiers.tiers
    if remaining < tiers.smallest:
        assert tier == tiers.smallest
    else:
        assert tier <= remaining
        # The largest such tier: the next one up is longer than the wait.
        longer = [t for t in tiers.tiers if t > tier]
        assert not longer or longer[0] > remaining


@given(tier_lists, remainders, remainders)
def test_route_is_monotone(tiers: WaitTiers, a: timedelta, b: timedelta) -> None:
    shorter, longer = sorted((a, b))
    assert (tiers.route(shorter) or timedelta(0)) <= (tiers.route(longer) or timedelta(0))


@given(tier_lists, st.data())
def test_routing_the_remainder_terminates_neither_early_nor_too_late(
    tiers: WaitTiers, data: st.DataObject
) -> None:
    smallest = tiers.smallest
    remaining = data.draw(st.timedeltas(min_value=-smallest, max_value=smallest * 1000))
    hops = _hops(tiers, remaining, limit=1001 + 1)
    total = sum(hops, timedelta(0))
    assert total >= remaining - DUE_SLACK
    assert total <= max(remaining, timedelta(0)) + smallest
    assert all(tier in tiers.tiers for tier in hops)


@given(wait_tiers())
def test_tier_names_are_distinct(tiers: WaitTiers) -> None:
    assert len(set(tiers.names)) == len(tiers.tiers)


# --- The miss policy ---------------------------------------------------------------------


def row(
    state: JobState = JobState.READY,
    *,
    seq: int = 3,
    run_after: datetime = NOW,
    lease: datetime | None = None,
    deps_met: bool = True,
) -> RowSnapshot:
    return RowSnapshot(
        state=state,
        dispatch_seq=seq,
        run_after=run_after,
        lease_expires_at=lease,
        deps_met=deps_met,
    )


LATER = NOW + timedelta(minutes=5)
MUCH_LATER = NOW + timedelta(hours=2)
EARLIER = NOW - timedelta(minutes=5)


@pytest.mark.parametrize(
    ("snapshot", "seq", "decision"),
    [
        (None, 3, Drop(MissReason.UNKNOWN_JOB)),
        (row(seq=4), 3, Drop(MissReason.STALE_GENERATION)),
        (row(seq=2), 3, Drop(MissReason.STALE_GENERATION)),
        (row(JobState.SUCCEEDED), 3, Drop(MissReason.TERMINAL)),
        (row(JobState.FAILED), 3, Drop(MissReason.TERMINAL)),
        (row(JobState.CANCELLED), 3, Drop(MissReason.TERMINAL)),
        (row(JobState.AWAITING_HUMAN), 3, Drop(MissReason.PARKED)),
        (row(deps_met=False), 3, Drop(MissReason.BLOCKED)),
        (row(JobState.LEASED, lease=LATER), 3, Redelay(LATER, MissReason.LEASED)),
        (
            row(JobState.LEASED, lease=LATER, run_after=MUCH_LATER),
            3,
            Redelay(MUCH_LATER, MissReason.LEASED),
        ),
        (row(JobState.LEASED, lease=EARLIER), 3, Redelay(NOW, MissReason.RACED)),
        (row(JobState.LEASED, lease=NOW), 3, Redelay(NOW, MissReason.RACED)),
        (row(run_after=LATER), 3, Redelay(LATER, MissReason.EARLY)),
        (row(JobState.AWAITING_CAPACITY, run_after=LATER), 3, Redelay(LATER, MissReason.EARLY)),
        (row(JobState.AWAITING_CAPACITY), 3, Redelay(NOW, MissReason.RACED)),
        (row(), 3, Redelay(NOW, MissReason.RACED)),
        (row(run_after=EARLIER), 3, Redelay(NOW, MissReason.RACED)),
    ],
    ids=str,
)
def test_miss_policy_examples(
    snapshot: RowSnapshot | None, seq: int, decision: Drop | Redelay
) -> None:
    assert decide_miss(snapshot, seq, NOW) == decision


def test_every_miss_reason_has_an_example() -> None:
    reached = {
        decide_miss(snapshot, 3, NOW).reason
        for snapshot in (
            None,
            row(seq=4),
            row(JobState.FAILED),
            row(JobState.AWAITING_HUMAN),
            row(deps_met=False),
            row(JobState.LEASED, lease=LATER),
            row(run_after=LATER),
            row(),
        )
    }
    assert reached == set(MissReason)


times = st.timedeltas(min_value=timedelta(hours=-3), max_value=timedelta(hours=3)).map(
    lambda d: NOW + d
)
snapshots = st.builds(
    RowSnapshot,
    state=st.sampled_from(list(JobState)),
    dispatch_seq=st.integers(0, 6),
    run_after=times,
    lease_expires_at=st.none() | times,
    deps_met=st.booleans(),
)


@given(snapshots, st.integers(0, 6), times)
def test_miss_policy_properties(snapshot: RowSnapshot, seq: int, now: datetime) -> None:
    decision = decide_miss(snapshot, seq, now)
    if seq != snapshot.dispatch_seq:
        assert decision == Drop(MissReason.STALE_GENERATION)
    elif snapshot.state.terminal or snapshot.state.parked or not snapshot.deps_met:
        assert isinstance(decision, Drop)
    else:
        assert isinstance(decision, Redelay)
    if isinstance(decision, Redelay):
        assert decision.until >= now
        assert decision.until >= snapshot.run_after
        if snapshot.state is JobState.LEASED and snapshot.lease_expires_at is not None:
            assert decision.until >= snapshot.lease_expires_at
        assert (decision.until == now) == (decision.reason is MissReason.RACED)


@pytest.mark.parametrize("state", list(JobState), ids=str)
@settings(max_examples=25)
@given(snapshot=snapshots, seq=st.integers(0, 6), now=times)
def test_miss_policy_for_each_state(
    state: JobState, snapshot: RowSnapshot, seq: int, now: datetime
) -> None:
    snapshot = dataclasses.replace(snapshot, state=state)
    decision = decide_miss(snapshot, seq, now)
    if seq != snapshot.dispatch_seq:
        assert decision.reason is MissReason.STALE_GENERATION
    elif state.terminal:
        assert decision == Drop(MissReason.TERMINAL)
    elif state is JobState.AWAITING_HUMAN:
        assert decision == Drop(MissReason.PARKED)
    elif not snapshot.deps_met:
        assert decision == Drop(MissReason.BLOCKED)
    elif state is JobState.LEASED and (snapshot.lease_expires_at or now) > now:
        assert decision.reason is MissReason.LEASED
    elif snapshot.run_after > now:
        assert decision == Redelay(snapshot.run_after, MissReason.EARLY)
    else:
        assert decision == Redelay(now, MissReason.RACED)


@given(snapshots, times)
def test_a_stale_generation_is_dropped_whatever_the_row(
    snapshot: RowSnapshot, now: datetime
) -> None:
    stale = snapshot.dispatch_seq + 1
    assert decide_miss(snapshot, stale, now) == Drop(MissReason.STALE_GENERATION)
    if snapshot.dispatch_seq > 0:
        older = snapshot.dispatch_seq - 1
        assert decide_miss(snapshot, older, now) == Drop(MissReason.STALE_GENERATION)


def test_naive_times_are_refused() -> None:
    naive = datetime(2026, 9, 22, 12)
    with pytest.raises(ValueError, match="run_after"):
        row(run_after=naive)
    with pytest.raises(ValueError, match="lease_expires_at"):
        row(JobState.LEASED, lease=naive)
    with pytest.raises(ValueError, match="now"):
        decide_miss(row(), 3, naive)
    with pytest.raises(ValueError, match="dispatch_seq"):
        row(seq=-1)
