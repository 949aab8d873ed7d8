"""The strict-schema projection (workflows/strict_schema.py): every projection is in the
Responses API's strict subset, and an answer maps back to the declared shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from workflows import strict_schema
from workflows.protocol.kinds import STEP_KINDS
from workflows.schema import problem
from workflows.strict_schema import (
    StrictAnswerError,
    decode,
    encode,
    project,
    strict_problem,
    with_failure_report,
)

KEYS = st.text("abcdefgh_", min_size=1, max_size=6)
SCALAR_TYPES = ("string", "integer", "number", "boolean", "null")
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    enum = st.lists(st.text(max_size=5) | st.integers(-9, 9), min_size=1, max_size=4, unique=True)
    return st.one_of(
        st.sampled_from(SCALAR_TYPES).map(lambda t: {"type": t}),
        st.sampled_from(SCALAR_TYPES[:4]).map(lambda t: {"type": [t, "null"]}),
        enum.map(lambda values: {"enum": values}),
        enum.map(lambda values: {"enum": [*values, None]}),
        st.just({}),  # any value
        st.just({"type": "object"}),  # an open object
        st.just({"type": "array"}),  # an array of anything
        st.just({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
        st.just({"type": ["object", "null"]}),
    )


def _extend(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    properties = st.dictionaries(KEYS, inner, max_size=4)

    @st.composite
    def objects(draw: st.DrawFn) -> dict[str, Any]:
        props = draw(properties)
        required = draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
        schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
        if draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema

    return objects() | inner.map(lambda items: {"type": "array", "items": items})


SCHEMAS = st.recursive(_leaf(), _extend, max_leaves=12)


def values(schema: dict[str, Any], *, extras: bool) -> st.SearchStrategy[Any]:
    """The values ``schema`` accepts (as workflows.schema checks it); with ``extras``, objects
    also hold keys their schema does not name."""
    if "anyOf" in schema or (not schema.get("type") and "enum" not in schema):
        return JSON
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    declared = schema["type"]
    types = [declared] if isinstance(declared, str) else declared
    return st.one_of(*(_typed(t, schema, extras) for t in types))


def _typed(name: str, schema: dict[str, Any], extras: bool) -> st.SearchStrategy[Any]:
    if name == "object":
        if "properties" not in schema:
            return st.dictionaries(KEYS, JSON, max_size=3)
        props = schema["properties"]
        required = {k: values(props[k], extras=extras) for k in schema["required"]}
        optional = {k: values(v, extras=extras) for k, v in props.items() if k not in required}
        named = st.fixed_dictionaries(required, optional=optional)
        if not extras or schema.get("additionalProperties") is False:
            return named
        more = st.dictionaries(KEYS.map(lambda k: "x_" + k), JSON, max_size=2)
        return st.tuples(named, more).map(lambda pair: {**pair[1], **pair[0]})
    if name == "array":
        items = schema.get("items")
        return st.lists(JSON if items is None else values(items, extras=extras), max_size=3)
    return {
        "string": st.text(max_size=8),
        "integer": st.integers(-(2**40), 2**40),
        "number": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-99, 99),
        "boolean": st.booleans(),
        "null": st.none(),
    }[name]


@settings(max_examples=300)
@given(SCHEMAS)
def test_every_projection_is_strict(schema: dict[str, Any]) -> None:
    assert strict_problem(project(schema)) is None
    assert strict_problem(project(with_failure_report(schema))) is None


@settings(max_examples=300)
@given(st.data(), SCHEMAS)
def test_a_declared_value_round_trips(data: st.DataObject, schema: dict[str, Any]) -> None:
    value = data.draw(values(schema, extras=False))
    assert problem(value, schema) is None
    answer = encode(value, schema)
    Draft202012Validator(project(schema)).validate(answer)  # what a strict answer may be
    assert json.loads(json.dumps(answer)) == answer
    assert decode(answer, schema) == value


@settings(max_examples=200)
@given(st.data(), SCHEMAS)
def test_keys_no_schema_names_are_dropped_and_the_rest_is_declared(
    data: st.DataObject, schema: dict[str, Any]
) -> None:
    value = data.draw(values(schema, extras=True))
    answer = encode(value, schema)
    Draft202012Validator(project(schema)).validate(answer)
    assert problem(decode(answer, schema), schema) is None


@given(st.data(), SCHEMAS)
def test_a_failure_report_fits_the_widened_schema(
    data: st.DataObject, schema: dict[str, Any]
) -> None:
    widened = with_failure_report(schema)
    value = data.draw(values(widened, extras=False))
    assert decode(encode(value, widened), widened) == value


@pytest.mark.parametrize("kind", sorted(STEP_KINDS.names()))
def test_every_kind_projects_to_a_strict_schema(kind: str) -> None:
    declared = dict(STEP_KINDS.get_kind(kind).result)
    assert strict_problem(project(with_failure_report(declared))) is None


def test_the_conformance_schema_is_an_encoded_object() -> None:
    declared = {"type": "object"}
    assert project(declared) == {
        "type": "object",
        "properties": {
            "value": {"type": "string", "description": strict_schema.ENCODED + '{"type": "object"}'}
        },
        "required": ["value"],
        "additionalProperties": False,
    }
    assert decode({"value": '{"status": "done"}'}, declared) == {"status": "done"}


def test_optional_keys_are_nullable_and_their_null_means_absent() -> None:
    declared = {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"enum": ["done", "ambiguous"]}, "note": {"type": "string"}},
    }
    strict = project(declared)
    assert strict["required"] == ["status", "note"]
    assert strict["properties"]["note"] == {"type": ["string", "null"]}
    assert strict["properties"]["status"] == {"type": "string", "enum": ["done", "ambiguous"]}
    assert decode({"status": "done", "note": None}, declared) == {"status": "done"}
    assert decode({"status": "done", "note": "n"}, declared) == {"status": "done", "note": "n"}


def test_a_failure_report_decodes_to_the_verdict_contract() -> None:
    declared = dict(STEP_KINDS.get_kind("build.verify").result)
    widened = with_failure_report(declared)
    answer = {"passed": False, "status": "failed", "detail": "no tests"}
    assert decode(answer, widened) == answer
    assert decode({"passed": True, "status": None, "detail": None}, widened) == {"passed": True}


def test_the_checker_says_what_the_api_says() -> None:
    assert strict_problem({"type": "object"}) == (
        "In context=(), 'additionalProperties' is required to be supplied and to be false."
    )
    loose = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    assert strict_problem(loose) == (
        "In context=(), 'required' is required to be supplied and to be an array including "
        "every key in properties. Missing 'b'."
    )
    nested = {**loose, "required": ["a", "b"], "properties": {"a": {"type": "object"}, "b": {}}}
    found = strict_problem(nested)
    assert found is not None and found.startswith("In context=('properties', 'a'), ")


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({"value": "{not json"}, "result.value: not JSON"),
        ({"value": 3}, "result.value: expected a JSON-encoded string"),
        ({}, "result: expected an object with 'value'"),
    ],
)
def test_an_answer_not_of_the_projected_shape_is_refused(answer: Any, why: str) -> None:
    with pytest.raises(StrictAnswerError, match=why):
        decode(answer, {"type": "object"})
