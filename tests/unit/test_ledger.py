"""The ledger's pure core: kinds, canonical JSON, digests, the range fold, verify, projections."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from workflows.ledger import (
    CLOSABLE_KINDS,
    KIND_NAME,
    RANGE_DOMAIN,
    EventKind,
    LedgerEvent,
    MalformedEventKind,
    NewEvent,
    UnrecognizedEventKind,
    UnwritableEvent,
    canonical_json,
    digest,
    digest_range,
    open_items,
    parse_kind,
    recognised,
    verify_events,
)

SEED_004_KINDS = [
    "SessionSeeded",
    "TurnRequested",
    "TurnCompleted",
    "ToolInvoked",
    "TranscriptRecorded",
    "FileEdited",
    "VerdictRendered",
    "CapacityRejected",
    "QuestionAsked",
    "AnswerGiven",
    "DecisionRecorded",
    "AssumptionStated",
    "FindingRaised",
    "FindingResolved",
    "ArtifactProduced",
    "SavePointCreated",
    "HandoffInitiated",
    "HandoffAccepted",
    "PhaseTransitioned",
    "BudgetSpent",
    "VisualDesignOptedIn",
    "VisualDesignDeclined",
    "VisualDesignAccepted",
    "VisualDesignWaived",
    "DeploymentOptedIn",
    "DeploymentDeclined",
]

# --- strategies ---------------------------------------------------------------------------

text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
payloads = st.dictionaries(text, json_values, max_size=5)
known_kinds = st.sampled_from(list(EventKind))
unknown_names = st.from_regex(KIND_NAME, fullmatch=True).filter(
    lambda name: name not in SEED_004_KINDS
)
any_kinds = known_kinds | unknown_names.map(UnrecognizedEventKind)


def stored(seq: int, kind: Any, payload: dict[str, Any], project: str = "p") -> LedgerEvent:
    """An event as the store reads it, its digest computed as a writer computes it."""
    name = kind.value if isinstance(kind, EventKind) else kind.name
    return LedgerEvent(project, seq, kind, payload, digest(name, payload))


def numbered(items: Sequence[tuple[Any, dict[str, Any]]]) -> list[LedgerEvent]:
    return [stored(i, kind, payload) for i, (kind, payload) in enumerate(items, start=1)]


ranges = st.lists(st.tuples(any_kinds, payloads), min_size=1, max_size=8)


def integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: integral_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral_floats_as_ints(v) for v in value]
    return value


def reference_fold(events: Sequence[LedgerEvent]) -> str:
    """The fold as the module docstring states it, written out independently."""
    h = hashlib.sha256(RANGE_DOMAIN).digest()
    for e in events:
        body = json.dumps(
            {"kind": e.kind_name, "payload": integral_floats_as_ints(e.payload)},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        d = hashlib.sha256(body.encode()).digest()
        h = hashlib.sha256(h + e.seq.to_bytes(8, "big") + d).digest()
    return h.hex()


# --- kinds ----------------------------------------------------------------------------------


def test_the_26_kinds_of_seed_004_and_no_other() -> None:
    assert [k.value for k in EventKind] == SEED_004_KINDS
    assert all(k.name == k.value for k in EventKind)
    assert {k.value for k in CLOSABLE_KINDS} == {
        "QuestionAsked",
        "DecisionRecorded",
        "AssumptionStated",
        "FindingRaised",
    }


@given(known_kinds)
def test_a_known_name_parses_to_its_member(kind: EventKind) -> None:
    assert parse_kind(kind.value) is kind


@given(unknown_names)
def test_a_well_formed_unknown_name_never_raises_and_keeps_its_name(name: str) -> None:
    kind = parse_kind(name)
    assert kind == UnrecognizedEventKind(name)
    assert not isinstance(kind, EventKind)
    assert kind.name == name


@pytest.mark.parametrize("name", ["", "lowercase", "Has Space", "Dotted.Kind", "A" * 101, "É"])
def test_a_malformed_name_is_refused(name: str) -> None:
    with pytest.raises(MalformedEventKind):
        parse_kind(name)


def test_an_unrecognised_kind_cannot_pose_as_a_known_one() -> None:
    with pytest.raises(ValueError, match=r"EventKind\.QuestionAsked"):
        UnrecognizedEventKind("QuestionAsked")


# --- writers are strict ---------------------------------------------------------------------


@given(unknown_names)
def test_a_writer_refuses_an_unrecognised_kind(name: str) -> None:
    with pytest.raises(UnwritableEvent, match="read, never written"):
        NewEvent(UnrecognizedEventKind(name), {})  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["QuestionAsked", None, 3])
def test_a_writer_refuses_anything_but_an_event_kind(kind: Any) -> None:
    with pytest.raises(UnwritableEvent):
        NewEvent(kind, {})


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"x": math.nan}, "payload.x"),
        ({"x": [1, math.inf]}, r"payload.x\[1\]"),
        ({"x": "a\x00b"}, "payload.x"),
        ({"x\x00": 1}, "payload"),
        ({"x": "\ud800"}, "payload.x"),
        ({1: "int key"}, "payload"),
        ({"x": {1, 2}}, "payload.x"),
        ({"x": b"bytes"}, "payload.x"),
    ],
)
def test_a_payload_that_is_not_json_is_refused_naming_where(payload: Any, where: str) -> None:
    with pytest.raises(UnwritableEvent, match=where):
        NewEvent(EventKind.ToolInvoked, payload)


def test_a_payload_must_be_an_object() -> None:
    with pytest.raises(UnwritableEvent, match="JSON object"):
        NewEvent(EventKind.ToolInvoked, [1, 2])  # type: ignore[arg-type]


def test_a_new_event_stores_what_it_hashes() -> None:
    event = NewEvent(EventKind.BudgetSpent, {"usd": 2.0, "turns": (1, 2.5)})
    assert dict(event.payload) == {"usd": 2, "turns": [1, 2.5]}
    assert event.digest == digest("BudgetSpent", {"usd": 2, "turns": [1, 2.5]})


# --- canonical JSON and digests -------------------------------------------------------------


def test_canonical_json_is_sorted_compact_and_unescaped() -> None:
    assert canonical_json({"b": [1, 2.5, None], "a": "héllo ✓", "c": True}) == (
        '{"a":"héllo ✓","b":[1,2.5,null],"c":true}'
    )
    assert canonical_json({"x": 1.0, "y": 1e16, "z": -0.0}) == '{"x":1,"y":10000000000000000,"z":0}'


def test_the_digest_is_the_documented_sha256() -> None:
    body = '{"kind":"QuestionAsked","payload":{"id":"q1","text":"why?"}}'
    assert digest("QuestionAsked", {"text": "why?", "id": "q1"}) == (
        hashlib.sha256(body.encode()).hexdigest()
    )
    assert re.fullmatch(r"[0-9a-f]{64}", digest("X", {}))


@given(payloads, st.randoms(use_true_random=False))
def test_digest_is_stable_under_key_order(payload: dict[str, Any], rnd: Any) -> None:
    def shuffled(value: Any) -> Any:
        if isinstance(value, dict):
            items = list(value.items())
            rnd.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        if isinstance(value, list):
            return [shuffled(v) for v in value]
        return value

    again = shuffled(payload)
    assert canonical_json(again) == canonical_json(payload)
    assert digest("FileEdited", again) == digest("FileEdited", payload)


@given(payloads)
def test_digest_survives_a_json_round_trip(payload: dict[str, Any]) -> None:
    # What jsonb gives back: the canonical text parsed again (numbers as numeric would).
    back = json.loads(canonical_json(payload))
    assert digest("ArtifactProduced", back) == digest("ArtifactProduced", payload)


@given(st.lists(payloads, min_size=2, max_size=2, unique_by=canonical_json))
def test_different_payloads_have_different_digests(pair: list[dict[str, Any]]) -> None:
    a, b = pair
    assert digest("FindingRaised", a) != digest("FindingRaised", b)


def test_the_kind_is_part_of_the_digest() -> None:
    assert digest("QuestionAsked", {"id": "x"}) != digest("AnswerGiven", {"id": "x"})


# --- the range fold -------------------------------------------------------------------------


@settings(deadline=None)
@given(ranges)
def test_the_fold_is_the_documented_one(items: list[tuple[Any, dict[str, Any]]]) -> None:
    events = numbered(items)
    assert digest_range(events) == reference_fold(events)


def test_an_empty_range_is_the_domain_hash() -> None:
    assert digest_range([]) == hashlib.sha256(b"vibey.ledger.range/1").hexdigest()


def content(item: tuple[Any, dict[str, Any]]) -> str:
    return canonical_json([item[0].name, item[1]])


# At least two events, no two alike: every reordering but the identity changes the content.
distinct_ranges = st.lists(
    st.tuples(any_kinds, payloads), min_size=2, max_size=8, unique_by=content
)


def reordering(data: st.DataObject, n: int) -> list[int]:
    """A permutation of range(n) that is not the identity (n >= 2)."""
    order = list(data.draw(st.permutations(range(n))))
    if order == sorted(order):
        order[0], order[1] = order[1], order[0]
    return order


@settings(deadline=None)
@given(distinct_ranges, st.data())
def test_any_reordering_changes_the_range_digest(
    items: list[tuple[Any, dict[str, Any]]], data: st.DataObject
) -> None:
    moved = [items[i] for i in reordering(data, len(items))]
    assert digest_range(numbered(moved)) != digest_range(numbered(items))


@settings(deadline=None)
@given(st.lists(st.tuples(any_kinds, payloads), min_size=2, max_size=8), st.data())
def test_reordering_the_stored_rows_changes_the_range_digest(
    items: list[tuple[Any, dict[str, Any]]], data: st.DataObject
) -> None:
    events = numbered(items)  # identical events included: their seqs still differ
    moved = [events[i] for i in reordering(data, len(events))]
    assert digest_range(moved) != digest_range(events)


@settings(deadline=None)
@given(ranges, st.data(), any_kinds, payloads)
def test_an_insertion_changes_the_range_digest(
    items: list[tuple[Any, dict[str, Any]]], data: st.DataObject, kind: Any, payload: Any
) -> None:
    at = data.draw(st.integers(0, len(items)))
    longer = [*items[:at], (kind, payload), *items[at:]]
    assert digest_range(numbered(longer)) != digest_range(numbered(items))


@settings(deadline=None)
@given(ranges, st.data())
def test_a_removal_changes_the_range_digest(
    items: list[tuple[Any, dict[str, Any]]], data: st.DataObject
) -> None:
    at = data.draw(st.integers(0, len(items) - 1))
    events = numbered(items)
    # removed from the middle: the rest keep their seqs (a gap), or are renumbered
    assert digest_range(events[:at] + events[at + 1 :]) != digest_range(events)
    shorter = numbered(items[:at] + items[at + 1 :])
    assert digest_range(shorter) != digest_range(events)


@settings(deadline=None)
@given(ranges, st.data(), payloads)
def test_a_changed_payload_changes_the_range_digest(
    items: list[tuple[Any, dict[str, Any]]], data: st.DataObject, payload: dict[str, Any]
) -> None:
    at = data.draw(st.integers(0, len(items) - 1))
    assume(canonical_json(payload) != canonical_json(items[at][1]))
    events = numbered(items)
    changed = [*events]
    old = events[at]
    # the row altered, its stored digest left as it was: the fold uses the recomputed one
    changed[at] = LedgerEvent(old.project_id, old.seq, old.kind, payload, old.digest)
    assert digest_range(changed) != digest_range(events)


@settings(deadline=None)
@given(ranges, unknown_names, payloads, st.data())
def test_unrecognised_kinds_are_kept_in_the_range(
    items: list[tuple[Any, dict[str, Any]]], name: str, payload: Any, data: st.DataObject
) -> None:
    at = data.draw(st.integers(0, len(items)))
    with_unknown = numbered([*items[:at], (UnrecognizedEventKind(name), payload), *items[at:]])
    assert digest_range(with_unknown) != digest_range(numbered(items))
    assert digest_range(with_unknown) == reference_fold(with_unknown)


# --- verify ---------------------------------------------------------------------------------


@settings(deadline=None)
@given(ranges)
def test_an_intact_ledger_verifies(items: list[tuple[Any, dict[str, Any]]]) -> None:
    events = numbered(items)
    result = verify_events(events, last_seq=len(events))
    assert result.ok, result.problem
    assert (result.count, result.first_bad_seq) == (len(events), None)
    assert result.range_digest == digest_range(events)
    assert result.unrecognised == sum(1 for e in events if not e.recognised)


def test_verify_names_a_gap() -> None:
    events = numbered([(EventKind.ToolInvoked, {"i": i}) for i in range(6)])
    result = verify_events(events[:2] + events[4:], last_seq=6)
    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert result.problem == "seq 3..4 missing: the next stored event is seq 5"


def test_verify_names_a_repeat() -> None:
    events = numbered([(EventKind.ToolInvoked, {"i": i}) for i in range(3)])
    result = verify_events([events[0], events[1], events[1], events[2]], last_seq=3)
    assert result.first_bad_seq == 2
    assert "repeats" in str(result.problem)


def test_verify_names_an_altered_row() -> None:
    events = numbered([(EventKind.DecisionRecorded, {"id": f"d{i}"}) for i in range(5)])
    old = events[3]
    events[3] = LedgerEvent(old.project_id, 4, old.kind, {"id": "forged"}, old.digest)
    result = verify_events(events, last_seq=5)
    assert result.first_bad_seq == 4
    assert "does not match its digest" in str(result.problem)


@pytest.mark.parametrize(
    ("stored_count", "head", "bad", "words"),
    [(3, 5, 4, "seq 4..5 removed"), (3, 2, 3, "seq 3 written past the head"), (0, 1, 1, "")],
)
def test_verify_compares_the_head(stored_count: int, head: int, bad: int, words: str) -> None:
    events = numbered([(EventKind.TurnCompleted, {}) for _ in range(stored_count)])
    result = verify_events(events, last_seq=head)
    assert (result.ok, result.first_bad_seq) == (False, bad)
    assert words in str(result.problem)


def test_an_empty_ledger_without_a_head_verifies() -> None:
    result = verify_events([], last_seq=0)
    assert result.ok and result.count == 0
    assert result.range_digest == digest_range([])


# --- projections ----------------------------------------------------------------------------


def test_open_items_follow_their_closers() -> None:
    events = numbered(
        [
            (EventKind.QuestionAsked, {"id": "q1"}),
            (EventKind.DecisionRecorded, {"id": "d1"}),
            (EventKind.AssumptionStated, {"id": "a1"}),
            (EventKind.FindingRaised, {"id": "f1"}),
            (EventKind.QuestionAsked, {"text": "no id"}),
            (EventKind.AnswerGiven, {"closes": "q1"}),
            (EventKind.FindingResolved, {"closes": ["f1", "q2"]}),
            (EventKind.DecisionRecorded, {"id": "d2", "closes": ["d1", "a1"]}),
            (EventKind.FindingResolved, {"closes": "d2"}),  # the wrong closer: d2 stays open
        ]
    )
    assert [(i.kind.value, i.id, i.seq) for i in open_items(events)] == [
        ("QuestionAsked", "#5", 5),
        ("DecisionRecorded", "d2", 8),
    ]
    assert open_items([*events, stored(10, EventKind.AnswerGiven, {"closes": "#5"})])[0].id == "d2"


@given(unknown_names, st.sampled_from(sorted(CLOSABLE_KINDS, key=lambda k: k.value)))
def test_projections_skip_unrecognised_kinds(name: str, closable: EventKind) -> None:
    opened = stored(1, closable, {"id": "x"})
    unknown_closer = stored(2, UnrecognizedEventKind(name), {"closes": "x", "id": "y"})
    assert [i.id for i in open_items([opened, unknown_closer])] == ["x"]
    assert open_items([unknown_closer]) == ()
    assert recognised([opened, unknown_closer]) == [opened]
