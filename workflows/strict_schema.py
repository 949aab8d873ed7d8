"""A result schema in OpenAI's strict subset, and the answer mapped back to the declared shape.

Codex sends ``--output-schema`` to the Responses API with ``strict: true``, and the API refuses
any schema outside the strict subset (``invalid_json_schema``: "'additionalProperties' is
required to be supplied and to be false", "'required' is required to be supplied and to be an
array including every key in properties"). A kind declares its result in the looser subset of
:mod:`workflows.schema` (optional keys, open objects), so the schema Codex gets is
:func:`project`'s, and its answer goes through :func:`decode` before it is the step's result.

The projection, node by node:

==============================================  ==============================================
declared                                        strict
==============================================  ==============================================
an object with ``properties``                   every key required, ``additionalProperties:
                                                false``; an optional key made nullable (its
                                                ``null`` stands for "absent")
an open object (no ``properties``), a node      a string holding the value JSON-encoded
with no type, ``anyOf``/``oneOf``/``allOf``/
``$ref``/``not``, a type this subset does not
know, an array without ``items``' schema, an
object or array past :data:`MAX_DEPTH`
an optional key whose schema admits ``null``    the value JSON-encoded, so a present ``null``
                                                (``"null"``) differs from an absent key
``enum`` without ``type``                       the enum, typed by its values
a type list with ``object`` or ``array``        the value JSON-encoded
scalars, ``enum``, ``items``, ``description``   as declared (other keywords are dropped: the
                                                declared schema still checks the result)
a root that is not an object                    ``{"value": <the value JSON-encoded>}``
==============================================  ==============================================

:func:`encode` maps a value of the declared shape to the strict shape (what a model answers);
``decode(encode(v)) == v`` for every ``v`` the declared schema accepts, up to the keys an
object's schema does not name (a strict answer cannot hold them; the definition reads only the
keys it names, :mod:`workflows.schema`). :func:`with_failure_report` lets the strict answer
also be the verdict contract's ``{"status": "failed", "detail": …}``.
:func:`strict_problem` checks a schema against the API's strict rules (the model server of the
real-binary tier refuses what it refuses, as the API does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

JsonObject = Mapping[str, Any]
MAX_DEPTH = 10  # the API's nesting limit for strict schemas
ENCODED = "A JSON value, encoded as a string (json.dumps): "
WRAPPER = "value"
_SCALARS = ("string", "number", "integer", "boolean", "null")
_COMPOSITE = ("anyOf", "oneOf", "allOf", "$ref", "not", "if", "patternProperties")
_KEPT = ("description", "title")


class StrictAnswerError(ValueError):
    """An answer that is not of the projected shape (a string that is not JSON, a key
    missing)."""


# -- the projection --------------------------------------------------------------------------


def project(schema: JsonObject) -> dict[str, Any]:
    """``schema`` (a kind's declared result schema) in the strict subset; its root is always a
    closed object."""
    if _shape(schema, 0) == "object":
        return _node(schema, 0)
    return _closed({WRAPPER: _encoded(schema)}, [WRAPPER])


def encode(value: Any, schema: JsonObject) -> Any:
    """``value`` (valid under ``schema``) in the projected shape."""
    if _shape(schema, 0) == "object":
        return _encode(value, schema, 0)
    return {WRAPPER: json.dumps(value)}


def decode(answer: Any, schema: JsonObject) -> Any:
    """An answer of ``project(schema)``'s shape in ``schema``'s own: the ``null`` of an absent
    optional key dropped, encoded values decoded. :class:`StrictAnswerError` when it is not
    of that shape."""
    if _shape(schema, 0) == "object":
        return _decode(answer, schema, 0, "result")
    if not isinstance(answer, Mapping) or WRAPPER not in answer:
        raise StrictAnswerError(f"result: expected an object with {WRAPPER!r}")
    return _loads(answer[WRAPPER], "result." + WRAPPER)


def _shape(schema: Any, depth: int) -> str:
    """How a declared node is projected: ``object``, ``array``, ``scalar`` or ``encoded``."""
    if not isinstance(schema, Mapping) or any(k in schema for k in _COMPOSITE):
        return "encoded"
    types = _types(schema)
    if types is None:
        return "scalar" if "enum" in schema and _enum_types(schema) else "encoded"
    if not types or any(t not in (*_SCALARS, "object", "array") for t in types):
        return "encoded"
    if "object" in types or "array" in types:
        if len(types) > 1 or depth >= MAX_DEPTH:
            return "encoded"
        if types == ["object"]:
            closed = schema.get("additionalProperties") is False
            has_properties = isinstance(schema.get("properties"), Mapping)
            return "object" if has_properties or closed else "encoded"
        return "array" if isinstance(schema.get("items"), Mapping) else "encoded"
    return "scalar"


def _types(schema: JsonObject) -> list[str] | None:
    declared = schema.get("type")
    if declared is None:
        return None
    names = [declared] if isinstance(declared, str) else list(declared)
    return names if all(isinstance(n, str) for n in names) else []


def _enum_types(schema: JsonObject) -> list[str]:
    names: list[str] = []
    for value in schema.get("enum") or []:
        name = _json_type(value)
        if name is None:
            return []
        if name not in names:
            names.append(name)
    return names


def _json_type(value: Any) -> str | None:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


def _properties(schema: JsonObject) -> dict[str, Any]:
    properties = schema.get("properties")
    return dict(properties) if isinstance(properties, Mapping) else {}


def _optional(schema: JsonObject) -> set[str]:
    required = set(schema.get("required") or ())
    return set(_properties(schema)) - required


def _admits_null(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return True
    if "enum" in schema:
        return None in list(schema["enum"] or [])
    types = _types(schema)
    return types is None or "null" in types


def _node(schema: JsonObject, depth: int) -> dict[str, Any]:
    shape = _shape(schema, depth)
    if shape == "encoded":
        return _encoded(schema)
    kept = {k: schema[k] for k in _KEPT if isinstance(schema.get(k), str)}
    if shape == "object":
        properties = _properties(schema)
        optional = _optional(schema)
        projected = {
            key: _optional_node(rules, depth + 1) if key in optional else _node(rules, depth + 1)
            for key, rules in properties.items()
        }
        return {**kept, **_closed(projected, list(properties))}
    if shape == "array":
        return {**kept, "type": "array", "items": _node(schema["items"], depth + 1)}
    types = _types(schema) or _enum_types(schema)
    node: dict[str, Any] = {**kept, "type": types[0] if len(types) == 1 else types}
    if "enum" in schema:
        node["enum"] = list(schema["enum"])
    return node


def _optional_node(schema: Any, depth: int) -> dict[str, Any]:
    """An optional key's node: its own, nullable (``null`` = absent); encoded when its own
    already admits ``null``."""
    if _admits_null(schema) or _shape(schema, depth) == "encoded":
        return _nullable(_encoded(schema))
    return _nullable(_node(schema, depth))


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    if "enum" in node:
        return {"anyOf": [node, {"type": "null"}]}
    declared = node["type"]
    types = [declared] if isinstance(declared, str) else list(declared)
    if types in (["object"], ["array"]):
        return {"anyOf": [node, {"type": "null"}]}
    return {**node, "type": [*types, "null"] if "null" not in types else types}


def _encoded(schema: Any) -> dict[str, Any]:
    described = json.dumps(schema, sort_keys=True) if isinstance(schema, Mapping) else "any"
    return {"type": "string", "description": ENCODED + described[:2000]}


def _closed(properties: Mapping[str, Any], keys: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": keys,
        "additionalProperties": False,
    }


def with_failure_report(schema: JsonObject) -> dict[str, Any]:
    """``schema`` widened so that ``{"status": "failed", "detail": …}`` (the engine's report
    that the work cannot be done) is also of its shape: an object's ``status`` enum gains
    ``"failed"`` (an optional one is added where it names none) and ``detail`` an optional
    string. A schema whose ``status`` or ``detail`` is of another kind, or that is not an
    object with properties, is returned as it is (an encoded answer holds any object)."""
    widened = dict(schema)
    if _shape(schema, 0) != "object":
        return widened
    properties = _properties(schema)
    status, detail = properties.get("status"), properties.get("detail")
    if status is None:
        properties["status"] = {"enum": ["failed"]}
    elif isinstance(status, Mapping) and isinstance(status.get("enum"), list):
        properties["status"] = {**status, "enum": [*status["enum"], "failed"]}
    elif not (isinstance(status, Mapping) and _types(status) == ["string"]):
        return widened
    if detail is None:
        properties["detail"] = {"type": "string"}
    elif not (isinstance(detail, Mapping) and _types(detail) == ["string"]):
        return dict(schema)
    widened["properties"] = properties
    return widened


# -- the values ------------------------------------------------------------------------------


def _encode(value: Any, schema: Any, depth: int) -> Any:
    shape = _shape(schema, depth)
    if shape == "encoded":
        return json.dumps(value)
    if shape == "object" and isinstance(value, Mapping):
        optional = _optional(schema)
        out: dict[str, Any] = {}
        for key, rules in _properties(schema).items():
            if key not in optional:
                out[key] = _encode(value[key], rules, depth + 1)
            elif key not in value:
                out[key] = None
            elif _admits_null(rules) or _shape(rules, depth + 1) == "encoded":
                out[key] = json.dumps(value[key])
            else:
                out[key] = _encode(value[key], rules, depth + 1)
        return out
    if shape == "array" and isinstance(value, list | tuple):
        return [_encode(item, schema["items"], depth + 1) for item in value]
    return value


def _decode(answer: Any, schema: Any, depth: int, where: str) -> Any:
    shape = _shape(schema, depth)
    if shape == "encoded":
        return _loads(answer, where)
    if shape == "object":
        return _decode_object(answer, schema, depth, where)
    if shape == "array":
        if not isinstance(answer, list):
            raise StrictAnswerError(f"{where}: expected an array")
        items = schema["items"]
        return [_decode(a, items, depth + 1, f"{where}[{i}]") for i, a in enumerate(answer)]
    return answer


def _decode_object(answer: Any, schema: JsonObject, depth: int, where: str) -> dict[str, Any]:
    if not isinstance(answer, Mapping):
        raise StrictAnswerError(f"{where}: expected an object")
    optional = _optional(schema)
    out: dict[str, Any] = {}
    for key, rules in _properties(schema).items():
        path = f"{where}.{key}"
        if key not in answer and key not in optional:
            raise StrictAnswerError(f"{where}: missing {key!r}")
        if key not in optional:
            out[key] = _decode(answer[key], rules, depth + 1, path)
        elif answer.get(key) is None:
            continue  # the null of an absent optional key
        elif _admits_null(rules) or _shape(rules, depth + 1) == "encoded":
            out[key] = _loads(answer[key], path)
        else:
            out[key] = _decode(answer[key], rules, depth + 1, path)
    return out


def _loads(text: Any, where: str) -> Any:
    if not isinstance(text, str):
        raise StrictAnswerError(f"{where}: expected a JSON-encoded string")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StrictAnswerError(f"{where}: not JSON ({exc})") from None


# -- the API's strict rules ------------------------------------------------------------------

_ALLOWED = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "anyOf",
    "description",
    "title",
    "const",
    "$defs",
    "$ref",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
    "default",
}


def strict_problem(schema: Any) -> str | None:
    """Why the Responses API would refuse ``schema`` as a strict ``json_schema`` format (the
    API's wording, ``context=(…)`` naming where), or ``None``."""
    if not isinstance(schema, Mapping):
        return "In context=(), schema must be a JSON Schema of 'type: \"object\"'."
    if schema.get("type") != "object" or "anyOf" in schema:
        return (
            "In context=(), schema must be a JSON Schema of 'type: \"object\"', "
            f"got 'type: \"{schema.get('type')}\"'."
        )
    return _strict(schema, (), 1)


def _strict(node: Any, context: tuple[str, ...], depth: int) -> str | None:
    where = f"In context={context!r}"
    if not isinstance(node, Mapping):
        return f"{where}, schema must be an object."
    if depth > MAX_DEPTH:
        return f"{where}, schema nesting exceeds the limit of {MAX_DEPTH} levels."
    unknown = sorted(set(node) - _ALLOWED)
    if unknown:
        return f"{where}, '{unknown[0]}' is not permitted."
    if "anyOf" in node:
        for index, branch in enumerate(node["anyOf"]):
            found = _strict(branch, (*context, "anyOf", str(index)), depth)
            if found:
                return found
        return None
    return _strict_typed(node, context, depth, where)


def _strict_typed(node: JsonObject, context: tuple[str, ...], depth: int, where: str) -> str | None:
    types = node.get("type")
    names = [types] if isinstance(types, str) else list(types or [])
    if not names and "enum" not in node and "const" not in node:
        return f"{where}, schema must have a 'type' key."
    if "object" in names:
        return _strict_object(node, context, depth, where)
    if "array" in names:
        if not isinstance(node.get("items"), Mapping):
            return f"{where}, array schema missing items."
        return _strict(node["items"], (*context, "items"), depth + 1)
    return None


def _strict_object(
    node: JsonObject, context: tuple[str, ...], depth: int, where: str
) -> str | None:
    if node.get("additionalProperties") is not False:
        return f"{where}, 'additionalProperties' is required to be supplied and to be false."
    properties = node.get("properties")
    if not isinstance(properties, Mapping):
        properties = {}
    required = node.get("required")
    if not isinstance(required, list) or set(required) != set(properties):
        missing = sorted(set(properties) - set(required if isinstance(required, list) else []))
        extra = f" Missing '{missing[0]}'." if missing else ""
        return (
            f"{where}, 'required' is required to be supplied and to be an array including "
            f"every key in properties.{extra}"
        )
    for key, rules in properties.items():
        found = _strict(rules, (*context, "properties", key), depth + 1)
        if found:
            return found
    return None
