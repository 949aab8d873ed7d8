"""The handoff on ``CreditsExhausted``, as a pure state machine: brief, gate, regenerate,
full transcript, human.

When an engine runs out of credits mid-work, the work moves to the next engine without losing
anything::

    start ──▶ WriteBrief (outgoing writes it; if it is dead, the incoming synthesises it)
                │ brief_written: verify() with the no-loss gate (workflows.noloss)
                ├─ passed ─────────────────────────────▶ SeedIncoming
                ├─ failed, regenerations left ─────────▶ WriteBrief (attempt n+1, the failures
                │                                        to fix)
                └─ failed, none left ──▶ WriteBrief in full_transcript mode
                                            ├─ passed ─▶ SeedIncoming (full_transcript)
                                            └─ failed ─▶ OpenHumanGate ─ retry ─▶ WriteBrief
                                                                       └ cancel ▶ Abandon

The flow, not the author, decides the mode: a brief is verified in the mode the flow is in, so
an author cannot waive rules by claiming ``full_transcript`` itself. In every mode the range
goes to the incoming engine as a file, ``<worktree>/.vibey/handoff/ledger.jsonl``
(:attr:`Handoff.ledger_file`), which :class:`SeedIncoming` says to write and its seed prompt
names; in ``full_transcript`` mode that file *is* the range the incoming engine works from
(it is named, not inlined into the prompt).

Nothing here performs the actions; the caller does (and writes the HandoffInitiated and
HandoffAccepted ledger events), then feeds the result back in.

Exceptions::

    ValueError
    └── HandoffError   an event the handoff is not waiting for
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeAlias

from workflows.ledger import LedgerEvent
from workflows.noloss import BriefMode, HandoffBrief, RuleFailure, Spec, verify

MAX_REGENERATIONS = 3
"""Briefs written again after the first fails the gate, before full_transcript mode."""
FULL_TRANSCRIPT_ATTEMPTS = 1
LEDGER_FILE = ".vibey/handoff/ledger.jsonl"
GATE_ANSWERS = ("retry", "cancel")


class HandoffError(ValueError):
    pass


class Stage(enum.StrEnum):
    WRITING = "writing"
    SEEDED = "seeded"
    AWAITING_HUMAN = "awaiting_human"
    ABANDONED = "abandoned"


def ledger_file_in(worktree: str) -> str:
    """Where the range is written for the incoming engine: ``<worktree>/.vibey/handoff/
    ledger.jsonl``."""
    return f"{worktree.rstrip('/')}/{LEDGER_FILE}"


@dataclass(frozen=True, slots=True)
class Handoff:
    outgoing: str
    incoming: str
    ledger_file: str
    outgoing_alive: bool = True
    mode: BriefMode = "brief"
    attempts: int = 0
    """Briefs written (or not delivered) in the current mode and round."""
    stage: Stage = Stage.WRITING
    failures: tuple[RuleFailure, ...] = ()
    """What the last brief failed, for the next author to fix."""
    rounds: int = 1
    """1, plus one for every ``retry`` a person answered."""

    @property
    def author(self) -> str:
        return self.outgoing if self.outgoing_alive else self.incoming


# -- actions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteBrief:
    """Have ``author`` write a brief in ``mode``. ``synthesise``: the outgoing engine is dead,
    so the incoming one writes it from the range. ``fix``: what the last attempt failed."""

    author: str
    synthesise: bool
    mode: BriefMode
    attempt: int
    fix: tuple[RuleFailure, ...]
    ledger_file: str


@dataclass(frozen=True, slots=True)
class SeedIncoming:
    """The gate passed: write the range to ``ledger_file`` in the worktree, then seed
    ``engine`` with a prompt that carries ``brief`` and names ``ledger_file``."""

    engine: str
    brief: HandoffBrief
    mode: BriefMode
    ledger_file: str


@dataclass(frozen=True, slots=True)
class OpenHumanGate:
    prompt: str
    failures: tuple[RuleFailure, ...]
    answers: tuple[str, ...] = GATE_ANSWERS


@dataclass(frozen=True, slots=True)
class Abandon:
    reason: str


Action: TypeAlias = WriteBrief | SeedIncoming | OpenHumanGate | Abandon
Step: TypeAlias = tuple[Handoff, Action]


# -- events --------------------------------------------------------------------------------


def start(*, outgoing: str, incoming: str, worktree: str, outgoing_alive: bool = True) -> Step:
    """Begin a handoff from ``outgoing`` to ``incoming`` (distinct engines)."""
    if outgoing == incoming:
        raise HandoffError(f"a handoff needs two engines, got {outgoing} twice")
    handoff = Handoff(
        outgoing=outgoing,
        incoming=incoming,
        ledger_file=ledger_file_in(worktree),
        outgoing_alive=outgoing_alive,
    )
    return handoff, _write(handoff)


def brief_written(
    handoff: Handoff, brief: HandoffBrief, ledger_range: Sequence[LedgerEvent], spec: Spec
) -> Step:
    """The author delivered ``brief``: gate it (in the flow's mode) and decide what is next."""
    _expect(handoff, Stage.WRITING)
    gated = replace(brief, mode=handoff.mode)
    report = verify(gated, ledger_range, spec)
    if report.passed:
        seeded = replace(handoff, attempts=handoff.attempts + 1, stage=Stage.SEEDED, failures=())
        return seeded, SeedIncoming(handoff.incoming, gated, handoff.mode, handoff.ledger_file)
    return _failed(handoff, report.failures)


def brief_missing(handoff: Handoff, detail: str, *, author_dead: bool = False) -> Step:
    """The author delivered no brief (it crashed, timed out, or wrote nothing readable). It
    counts as a failed attempt; ``author_dead`` for the outgoing engine means the incoming
    engine synthesises from now on."""
    _expect(handoff, Stage.WRITING)
    if author_dead and handoff.outgoing_alive:
        handoff = replace(handoff, outgoing_alive=False)
    return _failed(handoff, (), detail)


def gate_answered(handoff: Handoff, answer: str) -> Step:
    """A person answered the handoff's gate: ``retry`` starts a new round of briefs,
    ``cancel`` abandons the handoff."""
    _expect(handoff, Stage.AWAITING_HUMAN)
    if answer == "retry":
        retried = replace(
            handoff, mode="brief", attempts=0, stage=Stage.WRITING, rounds=handoff.rounds + 1
        )
        return retried, _write(retried)
    if answer == "cancel":
        return replace(handoff, stage=Stage.ABANDONED), Abandon("the handoff was cancelled")
    raise HandoffError(f"answer {answer!r}: expected one of {', '.join(GATE_ANSWERS)}")


# -- the flow ------------------------------------------------------------------------------


def _expect(handoff: Handoff, stage: Stage) -> None:
    if handoff.stage is not stage:
        raise HandoffError(f"the handoff is {handoff.stage}, not {stage}")


def _write(handoff: Handoff) -> WriteBrief:
    return WriteBrief(
        author=handoff.author,
        synthesise=not handoff.outgoing_alive,
        mode=handoff.mode,
        attempt=handoff.attempts + 1,
        fix=handoff.failures,
        ledger_file=handoff.ledger_file,
    )


def _failed(handoff: Handoff, failures: tuple[RuleFailure, ...], detail: str = "") -> Step:
    failed = replace(handoff, attempts=handoff.attempts + 1, failures=failures)
    if failed.mode == "brief" and failed.attempts <= MAX_REGENERATIONS:
        return failed, _write(failed)
    if failed.mode == "brief":
        escalated = replace(failed, mode="full_transcript", attempts=0)
        return escalated, _write(escalated)
    if failed.attempts < FULL_TRANSCRIPT_ATTEMPTS:
        return failed, _write(failed)
    waiting = replace(failed, stage=Stage.AWAITING_HUMAN)
    return waiting, OpenHumanGate(_prompt(waiting, detail), failures)


def _prompt(handoff: Handoff, detail: str) -> str:
    why = "; ".join(f"{f.rule} {f.rule.summary}: {f.detail}" for f in handoff.failures)
    why = why or detail or "no brief was delivered"
    return (
        f"The handoff from {handoff.outgoing} to {handoff.incoming} could not pass the no-loss "
        f"gate: {1 + MAX_REGENERATIONS} briefs and a full-transcript brief failed. Last "
        f"problem: {why}. Answer `retry` to write the brief again, or `cancel` to stop the "
        "handoff."
    )
