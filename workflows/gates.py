"""Gate kinds: what a question to a person means, declared once.

A :class:`GateKind` carries the answers a gate of that kind accepts (a fixed list, or a JSON
schema for a typed answer), what an answer grants the job parked behind it, and how the gate
is shown (a title and the hint printed beside its answer commands). A gate *instance* (an
:class:`~workflows.engine.OpenGate` or a parked job's gate row) may narrow the answers further;
:func:`check_answer` is the one validator every answer path calls (`vibey gate answer`, the
store, the Python client).

Grants, for a parked job's gate (seed 000 §7, seed 004 bounded ladders):

* ``Grant.NONE``: the answer re-readies the job and buys nothing;
* ``Grant.REFUND``: one attempt is given back (the parked claim counted one it never ran);
* ``Grant.ANSWERED_ATTEMPTS``: the answer is a number, the attempts it grants.

The engine and the queue own seven gate kinds (:data:`ENGINE_GATES`); a definition declares its
own (the protocol's are in ``workflows.protocol.kinds``). Two declarations of one name must be
equal: :meth:`GateKinds.merged` raises :class:`GateConflictError` otherwise.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from workflows.budget import ANSWER_HELP, ANSWER_PATTERN
from workflows.declared import Declarations

JsonObject = Mapping[str, Any]
_GATE_NAME = re.compile(r"[a-z][a-z0-9_]*")


class GateConflictError(ValueError):
    """Two declarations of one gate kind that disagree."""


class UnknownGateKindError(ValueError):
    def __init__(self, kind: str, known: Iterable[str]) -> None:
        super().__init__(f"unknown gate kind {kind!r}; declared: {', '.join(sorted(known))}")
        self.kind = kind


class Grant(enum.StrEnum):
    NONE = "none"
    REFUND = "refund"
    ANSWERED_ATTEMPTS = "answered_attempts"


@dataclass(frozen=True, slots=True)
class GateKind:
    name: str
    answers: tuple[str, ...] = ()
    schema: JsonObject = field(default_factory=dict)
    grant: Grant = Grant.NONE
    title: str = ""
    hint: str = ""

    def __post_init__(self) -> None:
        if _GATE_NAME.fullmatch(self.name) is None:
            raise ValueError(f"{self.name!r} is not a gate kind name: lowercase_words")
        if self.grant is Grant.ANSWERED_ATTEMPTS and self.schema.get("type") != "integer":
            raise ValueError(f"gate kind {self.name} grants attempts: its schema is an integer")
        object.__setattr__(self, "schema", MappingProxyType(dict(self.schema)))

    def __reduce__(self) -> tuple[Any, ...]:
        values = {f: getattr(self, f) for f in self.__dataclass_fields__}
        values["schema"] = dict(self.schema)
        return (_rebuild, (values,))

    def attempts_granted(self, answer: str) -> int:
        """The attempts an accepted ``answer`` adds to the parked job's max_attempts."""
        if self.grant is Grant.ANSWERED_ATTEMPTS:
            return int(answer)
        return 1 if self.grant is Grant.REFUND else 0


def _rebuild(values: dict[str, Any]) -> GateKind:
    return GateKind(**values)


def check_answer(
    answer: str, *, answers: Iterable[str] = (), schema: JsonObject | None = None
) -> str | None:
    """``None`` when ``answer`` is acceptable, else what is wrong with it (one line).

    ``answers`` non-empty: the answer must be one of them. Otherwise ``schema`` decides: an
    ``integer`` (with optional ``minimum``/``maximum``) or a string (non-empty, optional
    ``maxLength``, optional ``pattern`` the whole answer must match, refused with the
    schema's ``description`` as the hint)."""
    allowed = tuple(answers)
    if allowed:
        if answer in allowed:
            return None
        return f"{answer!r} is not an answer to this gate; valid: {', '.join(allowed)}"
    schema = schema or {}
    if schema.get("type", "string") == "integer":
        return _check_integer(answer, schema)
    if not answer.strip():
        return "the answer must not be empty"
    limit = schema.get("maxLength")
    if limit is not None and len(answer) > limit:
        return f"the answer is longer than {limit} characters"
    pattern = schema.get("pattern")
    if pattern is not None and re.fullmatch(pattern, answer) is None:
        hint = schema.get("description") or f"it must match {pattern}"
        return f"{answer[:80]!r} is not an answer to this gate; valid: {hint}"
    return None


def _check_integer(answer: str, schema: JsonObject) -> str | None:
    if re.fullmatch(r"-?[0-9]+", answer) is None:
        return f"{answer!r} is not an integer"
    value = int(answer)
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and value < low:
        return f"{value} is below the minimum {low}"
    if high is not None and value > high:
        return f"{value} is above the maximum {high}"
    return None


class GateKinds(Declarations[GateKind]):
    def __init__(self, kinds: Iterable[GateKind] = ()) -> None:
        super().__init__()
        for kind in kinds:
            known = self._kinds.get(kind.name)
            if known is not None and known != kind:
                raise GateConflictError(f"gate kind {kind.name!r} is declared twice differently")
            self._kinds[kind.name] = kind

    def get_kind(self, name: str) -> GateKind:
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownGateKindError(name, self._kinds) from None

    def problem(
        self,
        kind: str,
        answer: str,
        *,
        answers: Iterable[str] = (),
        schema: JsonObject | None = None,
    ) -> str | None:
        """What is wrong with ``answer`` to a gate of ``kind`` (``None``: nothing). The gate's
        own ``answers``/``schema`` decide; where it has none, its kind's do."""
        declared = self._kinds.get(kind)
        allowed = tuple(answers) or (declared.answers if declared is not None else ())
        rules = schema or (declared.schema if declared is not None else {})
        return check_answer(answer, answers=allowed, schema=rules)

    def merged(self, other: Iterable[GateKind]) -> GateKinds:
        return GateKinds([*self._kinds.values(), *other])

    def __reduce__(self) -> tuple[Any, ...]:
        return (GateKinds, (list(self._kinds.values()),))


GRANT_SCHEMA: JsonObject = MappingProxyType({"type": "integer", "minimum": 1, "maximum": 50})
RETRY_OR_CANCEL = ("retry", "cancel")

WORKFLOW_ERROR = GateKind(
    "workflow_error",
    answers=RETRY_OR_CANCEL,
    title="the workflow's definition raised or diverged",
    hint="deploy the fix, then answer retry (or cancel)",
)
DELIVERY_EXHAUSTED = GateKind(
    "delivery_exhausted",
    grant=Grant.REFUND,
    title="the job's worker died on every attempt",
    hint="any answer retries it with one more attempt",
)
LADDER_EXHAUSTED = GateKind(
    "ladder_exhausted",
    schema=GRANT_SCHEMA,
    grant=Grant.ANSWERED_ATTEMPTS,
    title="a bounded ladder is spent",
    hint="answer a number: the attempts it grants at the top rung",
)
SPEND_EXHAUSTED = GateKind(
    "spend_exhausted",
    schema=GRANT_SCHEMA,
    grant=Grant.REFUND,
    title="a spend cap is reached",
    hint="answer a number: the dollars or turns it grants",
)
HANDOFF = GateKind(
    "handoff",
    answers=RETRY_OR_CANCEL,
    title="no handoff brief passed the no-loss gate",
    hint="retry hands off again; cancel waits for capacity",
)

CAPACITY_EXHAUSTED = GateKind(
    "capacity_exhausted",
    answers=("retry",),
    grant=Grant.REFUND,
    title="a step waited through its bound of capacity rejections",
    hint="retry waits again (top up the credits or configure another engine first)",
)

BUDGET_SCHEMA: JsonObject = MappingProxyType(
    {"type": "string", "pattern": ANSWER_PATTERN, "description": ANSWER_HELP}
)
BUDGET_EXHAUSTED = GateKind(
    "budget_exhausted",
    schema=BUDGET_SCHEMA,
    grant=Grant.REFUND,
    title="the workflow's budget is spent",
    hint="answer '<amount> dollars' or '<amount> tokens' to grant more, or 'stop' to abandon",
)

ENGINE_GATES = GateKinds(
    [
        WORKFLOW_ERROR,
        DELIVERY_EXHAUSTED,
        LADDER_EXHAUSTED,
        SPEND_EXHAUSTED,
        HANDOFF,
        CAPACITY_EXHAUSTED,
        BUDGET_EXHAUSTED,
    ]
)
"""The gate kinds the engine and the queue open themselves, known to every definition."""
