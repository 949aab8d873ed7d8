"""The settings' declarative layer: how a key is declared (:func:`setting`, one line with
its type, default, variable, flag and constraint; its help is the docstring below it), how
the environment's text is read into it (:class:`Kind`), and how a refusal becomes one line
naming the key and its fix (:func:`explain`). The declarations themselves: actors.config.
"""

from __future__ import annotations

import ast
import inspect
import math
import shlex
import textwrap
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, ClassVar, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

# The longest interval a setting takes: a year (anything longer is a typo).
MAX_INTERVAL_SECONDS = 365 * 24 * 3600.0


class SettingsError(ValueError):
    """A setting is unreadable, mistyped or out of range; the message names the fix."""


# --- the declarative layer --------------------------------------------------------------------


class Unreadable(ValueError):
    """The environment's text cannot be read; the message follows the variable's name."""


@dataclass(frozen=True, slots=True)
class Kind:
    """How a type of setting is written: what a wrong value is told to be, and how the
    environment's text becomes a value (``parse`` raises ValueError when it cannot)."""

    wanted: str
    parse: Callable[[str], Any]
    env_wanted: str = ""  # what a variable is told to be, when it differs from ``wanted``


def split_list(raw: str) -> tuple[str, ...] | None:
    """The items of a comma-separated list, stripped; None when an item is empty."""
    items = tuple(item.strip() for item in raw.split(","))
    return None if any(not item for item in items) else items


def _items(raw: str) -> tuple[str, ...]:
    items = split_list(raw)
    if items is None:
        raise Unreadable(f"has an empty item in {raw!r}: separate the values with single commas")
    return items


def _flag(raw: str) -> bool:
    word = raw.strip().lower()
    if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError(word)
    return word in ("1", "true", "yes", "on")


def _argv(raw: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise Unreadable(f"is not a command line ({exc}): quote it as a shell would") from None


def _number(raw: str) -> float:
    return float(raw.strip())


Int = Annotated[StrictInt, Kind("an integer", lambda raw: int(raw.strip()))]
Number = Annotated[StrictFloat, Kind("a number", _number)]
Seconds = Annotated[
    StrictFloat,
    Field(gt=0, le=MAX_INTERVAL_SECONDS, allow_inf_nan=False),
    Kind("a number of seconds", _number),
]
Text = Annotated[StrictStr, Kind("a string", str)]
Flag = Annotated[StrictBool, Kind("true or false", _flag, "1 or 0 (true or false)")]
Words = Annotated[tuple[StrictStr, ...], Kind("a list of strings", _items)]
Argv = Annotated[tuple[StrictStr, ...], Kind("a list of strings", _argv)]
SecondsList = Annotated[
    tuple[StrictFloat, ...],
    Kind(
        "a list of numbers of seconds",
        lambda raw: tuple(_number(item) for item in _items(raw)),
        "comma-separated seconds (as in 1,5,30)",
    ),
]


def setting(
    default: Any,
    env: str | None,
    *,
    flag: str | None = None,
    env_item: str | None = None,
    **constraint: Any,
) -> Any:
    """One key's declaration: its default, its variable (None: none), the ``vibey worker``
    flag that overrides it, the item of a table the variable sets (when the key is a table),
    and pydantic's constraints (``gt``, ``le``, ...). Its help is the docstring below it."""
    extra: dict[str, JsonValue] = {"env": env, "flag": flag, "env_item": env_item}
    return Field(default, json_schema_extra=extra, **constraint)


def check(problem: Callable[[Any], str | None]) -> AfterValidator:
    """A validator from a function naming what is wrong with a value (None: nothing)."""

    def validate(value: Any) -> Any:
        found = problem(value)
        if found is not None:
            raise ValueError(found)
        return value

    return AfterValidator(validate)


class Section(BaseModel):
    """One ``[table]`` of the settings. Constructing one checks it as loading does: a
    refusal is a :class:`SettingsError` (``replace`` folds the command line's choices in)."""

    # The keys' docstrings are read when asked for (:attr:`Key.help`), not at import: reading
    # them is the source parsed again, paid by every command that loads the settings.
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)
    table: ClassVar[str] = ""

    def __init__(self, **values: Any) -> None:
        # pydantic calls this for a nested section too: the outermost one explains
        outermost = _NESTED.set(True)
        try:
            super().__init__(**values)
        except ValidationError as exc:
            if outermost.old_value is True:
                raise
            raise explain(exc, type(self)) from None
        finally:
            _NESTED.reset(outermost)


_NESTED: ContextVar[bool] = ContextVar("nested", default=False)


def validate(model: type[M], values: Mapping[str, Any], where: str) -> M:
    """``values`` (read from ``where``) checked into ``model``; a refusal is one line."""
    outermost = _NESTED.set(True)
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise explain(exc, model, where) from None
    finally:
        _NESTED.reset(outermost)


S = TypeVar("S", bound=Section)
M = TypeVar("M", bound=BaseModel)


def replace(section: S, **changes: Any) -> S:
    """``section`` with ``changes``, checked as loading checks them."""
    return type(section)(**{**dict(section), **changes})


@dataclass(frozen=True, slots=True)
class Key:
    """One declared setting: where it lives and how it is written."""

    section: type[Section]
    name: str
    field: FieldInfo

    @property
    def table(self) -> str:
        return self.section.table

    @property
    def env(self) -> str | None:
        return _extra(self.field, "env")

    @property
    def flag(self) -> str | None:
        return _extra(self.field, "flag")

    @property
    def env_item(self) -> str | None:
        return _extra(self.field, "env_item")

    @property
    def kind(self) -> Kind | None:
        return _kind(self.field.annotation, self.field.metadata)

    @property
    def help(self) -> str:
        """The docstring below the key's declaration."""
        return _docstrings(self.section).get(self.name, "")

    @property
    def fix(self) -> str:
        """What a refusal tells the user to fix."""
        flag = f"{self.flag}, " if self.flag else ""
        where = f"{self.name} under [{self.table}]"
        fix = f"fix {flag}{self.env} (or {where})" if self.env else f"fix {where}"
        return fix + (", or leave it unset" if self.field.default is None else "")

    def path(self) -> tuple[str, ...]:
        return (*self.table.split("."), self.name)


@cache
def _docstrings(section: type[Section]) -> dict[str, str]:
    """Each key of ``section`` with the string literal right below its declaration."""
    body = ast.parse(textwrap.dedent(inspect.getsource(section))).body[0]
    assert isinstance(body, ast.ClassDef)
    found = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[node.target.id] = inspect.cleandoc(after.value.value)
    return found


def _extra(field: FieldInfo, name: str) -> str | None:
    extra = field.json_schema_extra
    value = extra.get(name) if isinstance(extra, dict) else None
    return value if isinstance(value, str) else None


def _kind(annotation: Any, metadata: Iterable[Any] = ()) -> Kind | None:
    for item in metadata:
        if isinstance(item, Kind):
            return item
    if get_origin(annotation) is Annotated:
        return _kind(get_args(annotation)[0], get_args(annotation)[1:])
    for arg in get_args(annotation) if get_origin(annotation) in (Union, type(int | None)) else ():
        found = _kind(arg)
        if found is not None:
            return found
    return None


# --- refusals, one line each ------------------------------------------------------------------

_PHRASES: Mapping[str, str] = {
    "greater_than": "more than {gt}",
    "greater_than_equal": "at least {ge}",
    "less_than": "less than {lt}",
    "less_than_equal": "at most {le}",
    "finite_number": "a finite number",
    "string_too_short": "non-empty",
}


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) and math.isfinite(value) else repr(value)


def explain(
    exc: ValidationError, model: type[BaseModel], where: str | None = None
) -> SettingsError:
    """The first of ``exc``'s errors as one line naming the key and its fix; ``where`` (the
    file read) prefixes what only the file can be wrong about. Unknown keys come first."""
    errors = exc.errors()
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    return SettingsError(_explain(error, model, f"{where}: " if where else ""))


def _explain(error: ErrorDetails, model: type[BaseModel], where: str) -> str:
    owner, loc = model, list(error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    while loc and isinstance(loc[0], str) and loc[0] in owner.model_fields:
        field = owner.model_fields[loc[0]]
        nested = field.annotation
        if not (isinstance(nested, type) and issubclass(nested, BaseModel)):
            break
        if len(loc) == 1 and error["type"] != "value_error":
            return f"{where}{loc[0]} must be a [{getattr(nested, 'table', loc[0])}] table"
        owner, loc = nested, loc[1:]
    table = getattr(owner, "table", "")
    if not loc:  # a check across a section's keys: its message names them and the fix
        return message
    name = str(loc[0])
    item = f"[{loc[1]!r}]" if len(loc) > 1 else ""
    if error["type"] == "extra_forbidden":
        known = ", ".join(owner.model_fields)
        if not table:
            return f"{where}unknown section [{name}]; known sections: {known}"
        return f"{where}unknown key {name!r} in [{table}]; known keys: {known}"
    key = Key(owner, name, owner.model_fields[name])  # type: ignore[arg-type]
    value = error["input"]
    if error["type"] == "value_error":
        return f"{message}; {key.fix}"
    if error["type"] == "literal_error":
        choices = ", ".join(get_args(key.field.annotation))
        return f"{name} {value!r} is not one of {choices}: {key.fix}"
    phrase = _PHRASES.get(error["type"])
    if phrase is not None:
        shown = phrase.format(**{k: _shown(v) for k, v in (error.get("ctx") or {}).items()})
        return f"{name}{item} must be {shown}, got {_shown(value)}: {key.fix}"
    wanted = key.kind.wanted if key.kind else "of another type"
    return f"{where}[{table}] {name}{item} must be {wanted}, got {value!r}: {key.fix}"
