"""A workflow's budget: what it may spend, what an answer grants, when the next step parks.

A budget is part of the workflow's input, fixed at its start (``vibey workflow start
--budget-dollars/--budget-tokens``, ``Client.start(..., budget=...)``, or ``[workflow]
budget_dollars``/``budget_tokens``)::

    {"budget": {"dollars": 5.0, "tokens": 200000}}     # either bound, or both

What the workflow has spent is the ledger's ``BudgetSpent`` events of the workflow, the one
source of truth: ``dollars`` where the engine reported them (a CLI that reports none adds no
dollars), and ``input_tokens + output_tokens``. Once a bound's spend reaches the bound plus
what answers granted, the next engine-driven step parks behind a ``budget_exhausted`` gate
before it runs; the step that crossed the bound has run, and its spend is counted.

The gate's answers (:func:`parse_answer`; :data:`ANSWER_PATTERN` is the same rule as the
gate's schema, so every answer path refuses the same answers)::

    <amount> dollars    grant that many more dollars (more than 0, at most two decimals)
    <amount> tokens     grant that many more tokens (a whole number, more than 0)
    stop                abandon: the workflow is cancelled
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

BUDGET_KEY = "budget"  # where the workflow input holds it
STOP: Literal["stop"] = "stop"
MAX_DOLLARS = 1_000_000_000.0
MAX_TOKENS = 10**15
ANSWER_PATTERN = (
    r"stop"
    r"|(?:[1-9][0-9]{0,8}(?:\.[0-9]{1,2})?|0\.(?:[1-9][0-9]?|0[1-9])) dollars"
    r"|[1-9][0-9]{0,14} tokens"
)
ANSWER_HELP = "'<amount> dollars' or '<amount> tokens' (more budget), or 'stop' (abandon)"
_ANSWER = re.compile(ANSWER_PATTERN)

Bound = Literal["dollars", "tokens"]


class BudgetError(ValueError):
    """A budget that is not one: the message names the bound and what is wrong."""


@dataclass(frozen=True, slots=True)
class Budget:
    """What a workflow may spend before its next engine step asks: ``None`` bounds nothing."""

    dollars: float | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        dollars, tokens = self.dollars, self.tokens
        if dollars is not None and (
            isinstance(dollars, bool)
            or not isinstance(dollars, int | float)
            or not math.isfinite(dollars)
            or not 0 < dollars <= MAX_DOLLARS
        ):
            raise BudgetError(
                f"a budget in dollars must be a number more than 0 (at most {MAX_DOLLARS:g}), "
                f"got {dollars!r}"
            )
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 < tokens <= MAX_TOKENS
        ):
            raise BudgetError(
                f"a budget in tokens must be a whole number more than 0, got {tokens!r}"
            )
        if dollars is not None:
            object.__setattr__(self, "dollars", float(dollars))

    @property
    def bounded(self) -> bool:
        return self.dollars is not None or self.tokens is not None

    def to_json(self) -> dict[str, Any]:
        """The input's ``budget`` object: only the bounds that are set."""
        out: dict[str, Any] = {}
        if self.dollars is not None:
            out["dollars"] = self.dollars
        if self.tokens is not None:
            out["tokens"] = self.tokens
        return out

    @classmethod
    def from_json(cls, value: Any) -> Budget:
        """A workflow input's ``budget`` object (raises :class:`BudgetError` for another)."""
        if not isinstance(value, Mapping):
            raise BudgetError(f"the workflow input's budget must be an object, got {value!r}")
        unknown = set(value) - {"dollars", "tokens"}
        if unknown:
            raise BudgetError(
                f"the workflow input's budget has {', '.join(sorted(map(str, unknown)))}: "
                "it takes dollars and tokens"
            )
        tokens = value.get("tokens")
        if isinstance(tokens, float) and tokens.is_integer():
            tokens = int(tokens)  # jsonb keeps numbers as numeric
        return cls(dollars=value.get("dollars"), tokens=tokens)


def with_budget(given: Mapping[str, Any], budget: Budget | None) -> dict[str, Any]:
    """The workflow input ``given`` with ``budget`` in it (unchanged when it bounds nothing)."""
    if budget is None or not budget.bounded:
        return dict(given)
    return {**given, BUDGET_KEY: budget.to_json()}


def budget_of(given: Mapping[str, Any]) -> Budget | None:
    """The budget a workflow input holds, if any."""
    value = given.get(BUDGET_KEY)
    return None if value is None else Budget.from_json(value)


@dataclass(frozen=True, slots=True)
class Spend:
    """Dollars and tokens: what was spent, or what answers granted."""

    dollars: float = 0.0
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class Reached:
    """A bound reached: its spend and its limit (the budget plus what was granted)."""

    bound: Bound
    spent: float
    limit: float


def parse_answer(answer: str) -> Spend | Literal["stop"] | None:
    """What an answer to a ``budget_exhausted`` gate grants, ``"stop"``, or ``None`` for a
    string that is not an answer (:data:`ANSWER_HELP`)."""
    if _ANSWER.fullmatch(answer) is None:
        return None
    if answer == STOP:
        return STOP
    amount, unit = answer.split(" ")
    if unit == "tokens":
        return Spend(tokens=int(amount))
    return Spend(dollars=float(amount))


def granted(answers: list[str]) -> Spend:
    """What ``answers`` grant together (``stop`` and non-answers grant nothing)."""
    dollars, tokens = 0.0, 0
    for answer in answers:
        grant = parse_answer(answer)
        if isinstance(grant, Spend):
            dollars, tokens = dollars + grant.dollars, tokens + grant.tokens
    return Spend(dollars, tokens)


def reached(budget: Budget | None, spent: Spend, grants: Spend) -> Reached | None:
    """The first bound (dollars, then tokens) whose spend reached the budget plus the grants;
    ``None`` while the workflow may spend more (or has no budget)."""
    if budget is None:
        return None
    if budget.dollars is not None:
        limit = budget.dollars + grants.dollars
        if spent.dollars >= limit - 1e-9:  # sums of decimal cents: no float rounding stops short
            return Reached("dollars", spent.dollars, limit)
    if budget.tokens is not None:
        limit_tokens = budget.tokens + grants.tokens
        if spent.tokens >= limit_tokens:
            return Reached("tokens", float(spent.tokens), float(limit_tokens))
    return None


def amount(bound: Bound, value: float) -> str:
    """``$5.00`` or ``12,000 tokens``: a figure of a bound, for a person."""
    return f"${value:,.2f}" if bound == "dollars" else f"{int(value):,} tokens"


def gate_prompt(kind: str, subject: str, at: Reached) -> str:
    """The question of a ``budget_exhausted`` gate."""
    return (
        f"the workflow's budget is spent: {amount(at.bound, at.spent)} of "
        f"{amount(at.bound, at.limit)}, so {kind} of {subject} waits before it runs. Grant "
        "more ('<amount> dollars' or '<amount> tokens'), or answer 'stop' to abandon the "
        "workflow."
    )
