"""A recording engine for unit tests: it answers from a table or a function and keeps every
task it was given."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from actors.agents.base import EngineTask, EngineVerdict
from workflows.schema import minimal

Responder = Callable[[EngineTask], EngineVerdict]


class FakeEngine:
    """Answers ``verdicts[task.kind]``, else ``respond(task)``, else ``ok`` with the smallest
    result the kind's result schema accepts (the protocol's kinds; empty for any other).
    ``tasks`` lists every task run, in order (thread-safe)."""

    def __init__(
        self,
        *,
        verdicts: Mapping[str, EngineVerdict] | None = None,
        respond: Responder | None = None,
    ) -> None:
        self._verdicts = dict(verdicts or {})
        self._respond = respond
        self._lock = threading.Lock()
        self.tasks: list[EngineTask] = []

    def run(self, task: EngineTask) -> EngineVerdict:
        with self._lock:
            self.tasks.append(task)
        if task.kind in self._verdicts:
            return self._verdicts[task.kind]
        if self._respond is not None:
            return self._respond(task)
        return EngineVerdict("ok", result=_smallest_result(task.kind))

    def kinds(self) -> list[str]:
        with self._lock:
            return [task.kind for task in self.tasks]


def _smallest_result(kind: str) -> dict[str, Any]:
    from workflows.protocol.kinds import STEP_KINDS

    if kind not in STEP_KINDS.names():
        return {}
    result: dict[str, Any] = minimal(STEP_KINDS.get_kind(kind).result)
    return result
