"""Step kinds: what a job of a kind means, declared once by the definition that uses it.

A :class:`StepKind` carries everything the engine, the queue and the workers need to know about
a kind — the way a Dramatiq ``@actor`` carries its own options:

* ``lane``: the logical queue it runs in (interactive steps never wait behind BUILD);
* ``lease``: how long a claim holds it before another worker may take it over;
* ``max_attempts``: the attempts a step gets before it reaches the definition as ``StepFailed``
  (a :class:`~workflows.engine.ScheduleStep` may still say otherwise);
* ``failure_class``: how a handler's failed verdict is classed (``work`` when a failure usually
  means the code under work is wrong, ``engine`` otherwise);
* ``engine``: whether a coding engine drives it, and ``phase`` / ``effort`` the effort ladder
  its attempts climb (seed 004), ``bounded`` the grant a spent ladder parks for;
* ``result``: the JSON schema of its result — the keys the definition reads (engines are asked
  for exactly that);
* ``aliases``: other names accepted for it, stored, keyed and leased as this kind.

A :class:`StepKinds` is a set of them. Two declarations of one name must be equal: merging sets
that disagree raises :class:`KindConflictError` (at load time, when definitions are
registered), and so does an alias that names another kind.

The engine owns one kind itself, :data:`TIMER` (``workflow.timer``): a durable timer is a job
with ``run_after`` and no handler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from workflows.declared import Declarations
from workflows.dispatch import Lane
from workflows.effort import Effort
from workflows.job import FailureClass, UnknownJobKindError, check_kind_name

DEFAULT_LEASE = timedelta(minutes=2)
DEFAULT_MAX_ATTEMPTS = 5

JsonObject = Mapping[str, Any]


class KindConflictError(ValueError):
    """Two declarations of one kind (or an alias) that disagree."""


@dataclass(frozen=True, slots=True)
class StepKind:
    name: str
    lane: Lane = Lane.INTERACTIVE
    lease: timedelta = DEFAULT_LEASE
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    failure_class: FailureClass = FailureClass.ENGINE
    engine: bool = False
    phase: str | None = None
    effort: tuple[Effort, ...] = ()
    bounded: str | None = None
    result: JsonObject = field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_kind_name(self.name)
        for alias in self.aliases:
            check_kind_name(alias)
        if self.lease <= timedelta(0):
            raise ValueError(f"the lease of {self.name} must be positive")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts of {self.name} must be at least 1")
        if self.bounded is not None and not self.effort:
            raise ValueError(f"{self.name} is bounded but has no effort ladder to exhaust")
        object.__setattr__(self, "result", MappingProxyType(dict(self.result)))

    def __reduce__(self) -> tuple[Any, ...]:
        # The read-only mapping does not pickle; worker processes receive kinds pickled.
        values = {f: getattr(self, f) for f in self.__dataclass_fields__}
        values["result"] = dict(self.result)
        return (_rebuild, (values,))

    def result_keys(self) -> tuple[str, ...]:
        """The keys the definition reads from a result (the schema's ``required``)."""
        return tuple(self.result.get("required", ()))


def _rebuild(values: dict[str, Any]) -> StepKind:
    return StepKind(**values)


TIMER = StepKind("workflow.timer")
"""The engine's own kind: a durable workflow timer (a job with ``run_after``, no handler)."""


class StepKinds(Declarations[StepKind]):
    """Kinds by canonical name; an alias is found too (``get_kind``) but is not a key."""

    def __init__(self, kinds: Iterable[StepKind] = ()) -> None:
        super().__init__()
        self._aliases: dict[str, str] = {}
        for kind in kinds:
            self._add(kind)

    def _add(self, kind: StepKind) -> None:
        known = self._kinds.get(kind.name)
        if known is not None and known != kind:
            raise KindConflictError(
                f"step kind {kind.name!r} is declared twice differently: {_diff(known, kind)}"
            )
        for alias in kind.aliases:
            target = self._aliases.get(alias, kind.name)
            if target != kind.name or alias in self._kinds:
                raise KindConflictError(
                    f"{alias!r} is an alias of {kind.name!r} and also names {target!r}"
                )
        if kind.name in self._aliases:
            raise KindConflictError(
                f"{kind.name!r} is declared as a kind and as an alias of "
                f"{self._aliases[kind.name]!r}"
            )
        self._kinds[kind.name] = kind
        self._aliases.update(dict.fromkeys(kind.aliases, kind.name))

    @property
    def aliases(self) -> Mapping[str, str]:
        return MappingProxyType(self._aliases)

    def names(self) -> frozenset[str]:
        """Every name a job may be scheduled under: kinds and aliases."""
        return frozenset(self._kinds) | frozenset(self._aliases)

    def canonical(self, name: str) -> str:
        """The kind a name stands for; raises :class:`UnknownJobKindError` for neither."""
        canonical = self._aliases.get(name, name)
        if canonical not in self._kinds:
            raise UnknownJobKindError(name, sorted(self._kinds))
        return canonical

    def get_kind(self, name: str) -> StepKind:
        return self._kinds[self.canonical(name)]

    def merged(self, other: Iterable[StepKind]) -> StepKinds:
        """Both sets in one; a kind both declare differently raises KindConflictError."""
        return StepKinds([*self._kinds.values(), *other])

    def __reduce__(self) -> tuple[Any, ...]:
        return (StepKinds, (list(self._kinds.values()),))


def _diff(a: StepKind, b: StepKind) -> str:
    fields_ = [f for f in a.__dataclass_fields__ if getattr(a, f) != getattr(b, f)]
    return "; ".join(f"{f} {getattr(a, f)!r} vs {getattr(b, f)!r}" for f in fields_)
