"""Handlers for end-to-end tests that must tell which worker ran a step: the protocol's
handlers, each first appending ``<label> <project> <kind>`` to ``tally.log`` beside the
engines' workspace (one directory per test). ``vibey worker --handlers
tests.acceptance.tally_handlers:shared`` (or ``:dedicated``) picks the label."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from actors.handlers import HandlerContext, build_handlers
from workflows.queue import Job
from workflows.steps import Handler, Handlers, Outcome, Short


def _tallied(label: str, context: HandlerContext) -> Handlers:
    path = context.workspace.parent / "tally.log"

    def wrap(handler: Callable[[Job], Outcome]) -> Callable[[Job], Outcome]:
        def run(job: Job) -> Outcome:
            with path.open("a", encoding="utf-8") as out:
                out.write(f"{label} {job.project_id} {job.kind}\n")
            return handler(job)

        return run

    wrapped: dict[str, Handler] = {}
    for kind, handler in build_handlers(context).items():
        wrapped[kind] = (
            Short(wrap(handler.handler)) if isinstance(handler, Short) else wrap(handler)
        )
    return MappingProxyType(wrapped)


def shared(context: Any) -> Handlers:
    return _tallied("shared", context)


def dedicated(context: Any) -> Handlers:
    return _tallied("dedicated", context)


def read_tally(context_dir: Any) -> list[tuple[str, str, str]]:
    path = context_dir / "tally.log"
    if not path.exists():
        return []
    rows = [line.split(" ", 2) for line in path.read_text().splitlines() if line]
    return [(label, project, kind) for label, project, kind in rows]
