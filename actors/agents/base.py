"""The engine seam: what a step handler asks an engine to do, and what the engine says back.

An engine is anything that does a step's work: the deterministic :class:`ScriptedEngine`
(demos and tests), the :class:`CommandEngine` (any coding agent or script run as a command),
or the recording :class:`FakeEngine` for unit tests. A handler builds an :class:`EngineTask`
from its job, runs it, and maps the :class:`EngineVerdict` to the step's outcome.

Exceptions::

    EngineError             the engine could not even start on the task
    └── ScriptError         the scripted engine's script or the step's input is malformed
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from actors.agents.lease import Held

Status = Literal["ok", "failed", "capacity"]
STATUSES: frozenset[str] = frozenset({"ok", "failed", "capacity"})


class EngineError(Exception):
    """Root of the engines' errors."""


class ScriptError(EngineError):
    """The script (or the step input it is read against) is not what docs/protocol.md says."""


EvidenceSink = Callable[[Sequence[Mapping[str, Any]]], bool]
"""Takes ledger entries (``{"kind", "payload"}``) while an engine runs and says whether it
took them: a CLI adapter sends TurnRequested at the start and ToolInvoked / FileEdited as its
stream reports them; what was taken is not repeated in the verdict's evidence."""


@dataclass(frozen=True, slots=True)
class EngineTask:
    """One step's work. ``kind`` is canonical; ``input`` is the job payload's ``input``;
    ``worktree`` is set for build.implement only (the item's worktree); ``workdir`` is the
    directory the engine works in (the item's worktree, the integrated tree for verify,
    review and deploy, else the project's scratch directory), whose lease the attempt holds."""

    kind: str
    project_id: str
    cycle: int
    subject: str
    attempt: int
    input: Mapping[str, Any]
    worktree: Path | None = None
    effort: str | None = None  # the effort ladder's level for this attempt (BUILD's kinds)
    workdir: Path | None = None  # where the engine runs: the worktree, the integrated tree…
    lease: Held | None = None  # the workdir's lease, held for this attempt (see .lease)
    job_id: str = ""
    stream: EvidenceSink | None = None  # where evidence goes as it comes (None: at the end)


@dataclass(frozen=True, slots=True)
class EngineVerdict:
    """What the engine says. ``result`` holds the keys docs/protocol.md lists for the kind;
    ``evidence`` is kept on the job, never read as state.

    ``engine_fault`` marks a failure of the engine itself rather than a verdict on the work:
    the command exited non-zero, timed out, or wrote no or a malformed verdict."""

    status: Status
    result: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    engine_fault: bool = False


@runtime_checkable
class Engine(Protocol):
    def run(self, task: EngineTask) -> EngineVerdict: ...
