"""The effort ladder: how hard an engine is asked to think, per phase and after failures.

vibey speaks one normalised five-level ladder, :class:`Effort`: TRIVIAL < LOW < STANDARD <
HIGH < MAX. Each phase has a base effort; the two autonomous phases start LOW and climb after
failures::

    DESIGN, VISUAL_DESIGN, REVIEW, DEPLOY_DESIGN, DEPLOY_REVIEW   HIGH
    BUILD, DEPLOY_EXECUTE                                         LOW → STANDARD → HIGH

A phase's *ladder* is the efforts its attempts run at, in order (:func:`ladder`). Bounded
ladders park, they do not loop: once every rung has failed, :func:`next_attempt` says
:class:`LadderExhausted` (the job parks behind a human gate that advertises a grant); attempts a
person grants run at the ladder's top until the grant is used, then it parks again.

Each engine descriptor projects the ladder onto its own flags (:class:`EffortFlags`); an engine
with fewer native levels saturates: an effort above its top gets its top, one below its bottom
gets its bottom.

INTAKE and DONE run no engine and have no effort.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeAlias

from workflows.phases import Phase


class Effort(enum.IntEnum):
    TRIVIAL = 0
    LOW = 1
    STANDARD = 2
    HIGH = 3
    MAX = 4


class NoEngineWork(ValueError):
    def __init__(self, phase: Phase) -> None:
        super().__init__(f"phase {phase} runs no engine, so it has no effort")
        self.phase = phase


_ESCALATING = (Effort.LOW, Effort.STANDARD, Effort.HIGH)

LADDERS: Mapping[Phase, tuple[Effort, ...]] = MappingProxyType(
    {
        Phase.DESIGN: (Effort.HIGH,),
        Phase.VISUAL_DESIGN: (Effort.HIGH,),
        Phase.BUILD: _ESCALATING,
        Phase.REVIEW: (Effort.HIGH,),
        Phase.DEPLOY_DESIGN: (Effort.HIGH,),
        Phase.DEPLOY_EXECUTE: _ESCALATING,
        Phase.DEPLOY_REVIEW: (Effort.HIGH,),
    }
)


def ladder(phase: Phase) -> tuple[Effort, ...]:
    """The efforts a phase's attempts run at, first attempt first."""
    try:
        return LADDERS[phase]
    except KeyError:
        raise NoEngineWork(phase) from None


def base_effort(phase: Phase) -> Effort:
    return ladder(phase)[0]


def effort_for(phase: Phase, failures: int) -> Effort:
    """The effort of the attempt after ``failures`` failed ones; past the ladder's last rung it
    stays there."""
    return climb(ladder(phase), failures)


def climb(rungs: Sequence[Effort], failures: int) -> Effort:
    """The rung of ``rungs`` after ``failures`` failed attempts (the top once they are spent)."""
    if failures < 0:
        raise ValueError(f"failures is a count, got {failures}")
    if not rungs:
        raise ValueError("an effort ladder has at least one rung")
    return rungs[min(failures, len(rungs) - 1)]


# -- bounded ladders -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    effort: Effort
    granted: bool
    """Beyond the ladder, spending attempts a person granted."""


@dataclass(frozen=True, slots=True)
class LadderExhausted:
    """Every rung (and every granted attempt) failed: park behind a human gate that offers a
    grant; do not loop."""

    failures: int
    top: Effort


def next_attempt(phase: Phase, failures: int, granted: int = 0) -> Attempt | LadderExhausted:
    """What to do after ``failures`` failed attempts, with ``granted`` extra attempts granted
    by gate answers so far (in total)."""
    return next_rung(ladder(phase), failures, granted)


def next_rung(
    rungs: Sequence[Effort], failures: int, granted: int = 0
) -> Attempt | LadderExhausted:
    """:func:`next_attempt` on a step kind's own ladder."""
    if failures < 0 or granted < 0:
        raise ValueError("failures and granted are counts")
    if not rungs:
        raise ValueError("an effort ladder has at least one rung")
    if failures < len(rungs):
        return Attempt(rungs[failures], granted=False)
    if failures < len(rungs) + granted:
        return Attempt(rungs[-1], granted=True)
    return LadderExhausted(failures=failures, top=rungs[-1])


# -- projection onto an engine's flags -----------------------------------------------------

Flags: TypeAlias = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EffortFlags:
    """An engine descriptor's effort flags: the native arguments for the ladder levels it has,
    as ``(effort, flags)`` pairs in ladder order. No levels: the engine takes no effort flag."""

    levels: tuple[tuple[Effort, Flags], ...] = ()

    def __post_init__(self) -> None:
        efforts = [effort for effort, _ in self.levels]
        if efforts != sorted(set(efforts)):
            raise ValueError("effort levels must be distinct and in ladder order")

    @classmethod
    def of(cls, native: Mapping[Effort, Sequence[str]]) -> EffortFlags:
        return cls(tuple((effort, tuple(native[effort])) for effort in sorted(native)))

    def level(self, effort: Effort) -> Effort | None:
        """The native level ``effort`` lands on: the highest at or below it, else the lowest
        (saturating both ways); ``None`` when the engine has no levels."""
        if not self.levels:
            return None
        at_or_below = [level for level, _ in self.levels if level <= effort]
        return at_or_below[-1] if at_or_below else self.levels[0][0]

    def project(self, effort: Effort) -> Flags:
        """The engine's arguments for ``effort``."""
        level = self.level(effort)
        return next((flags for lvl, flags in self.levels if lvl == level), ())
