"""A step kind's result schema, checked: the JSON-schema subset kinds declare their results in.

:func:`problem` answers what is wrong with a value (``None``: nothing), naming the path of the
first mismatch, as in ``result.findings[0].ambiguous: expected boolean, got string``.

Understood keywords: ``type`` (one name or a list of them: ``object``, ``array``, ``string``,
``boolean``, ``integer``, ``number``, ``null``), ``required``, ``properties``, ``items`` and
``enum``. Others are ignored (a schema may say more than this checks, never less). A key the
schema does not name is allowed: the definition reads the keys it names, an engine may report
more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

JsonObject = Mapping[str, Any]

_TYPES: Mapping[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list, tuple),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "null": (type(None),),
}


def problem(value: Any, schema: JsonObject, where: str = "result") -> str | None:
    """What is wrong with ``value`` against ``schema`` (the first mismatch), or ``None``."""
    if "enum" in schema and value not in list(schema["enum"]):
        allowed = ", ".join(repr(v) for v in schema["enum"])
        return f"{where}: {value!r} is not one of {allowed}"
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, name) for name in names):
            return f"{where}: expected {' or '.join(names)}, got {_name(value)}"
    if isinstance(value, Mapping):
        return _object(value, schema, where)
    if isinstance(value, list | tuple) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            found = problem(item, schema["items"], f"{where}[{index}]")
            if found is not None:
                return found
    return None


def _object(value: JsonObject, schema: JsonObject, where: str) -> str | None:
    required: Sequence[str] = schema.get("required", ())
    missing = [key for key in required if key not in value]
    if missing:
        return f"{where}: missing {', '.join(repr(k) for k in missing)}"
    properties: JsonObject = schema.get("properties", {})
    for key, rules in properties.items():
        if key in value and isinstance(rules, Mapping):
            found = problem(value[key], rules, f"{where}.{key}")
            if found is not None:
                return found
    return None


def _is(value: Any, name: str) -> bool:
    kinds = _TYPES.get(name)
    if kinds is None:
        return True  # a type this subset does not know is not refused
    if name == "object":
        return isinstance(value, Mapping)
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, kinds)


def _name(value: Any) -> str:
    for name in _TYPES:
        if _is(value, name) and name != "number":
            return name
    return type(value).__name__


def minimal(schema: JsonObject) -> Any:
    """The smallest value ``schema`` accepts: an object of its required keys, the first of an
    ``enum``, ``None`` where null is allowed, else ``""``, ``True``, ``0`` or ``[]`` (what a
    fake engine answers when a test gives it nothing to say)."""
    if "enum" in schema:
        return next(iter(schema["enum"]))
    types = schema.get("type", "object")
    names = [types] if isinstance(types, str) else list(types)
    if "null" in names:
        return None
    name = names[0] if names else "object"
    if name == "object":
        properties: JsonObject = schema.get("properties", {})
        return {key: minimal(properties.get(key, {})) for key in schema.get("required", ())}
    return {"array": [], "string": "", "boolean": True, "integer": 0, "number": 0}.get(name)
