"""Engines: who does a step's work (see :mod:`actors.engines.base` for the seam)."""

from actors.engines.base import (
    STATUSES,
    Engine,
    EngineError,
    EngineTask,
    EngineVerdict,
    ScriptError,
    Status,
)
from actors.engines.command import CommandEngine
from actors.engines.fake import FakeEngine
from actors.engines.scripted import ROUTES, ScriptedEngine

__all__ = [
    "ROUTES",
    "STATUSES",
    "CommandEngine",
    "Engine",
    "EngineError",
    "EngineTask",
    "EngineVerdict",
    "FakeEngine",
    "ScriptError",
    "ScriptedEngine",
    "Status",
]
