"""Coding agents: who does a step's work (see :mod:`actors.agents.base` for the seam)."""

from actors.agents.base import (
    STATUSES,
    Engine,
    EngineError,
    EngineTask,
    EngineVerdict,
    ScriptError,
    Status,
)
from actors.agents.command import CommandEngine
from actors.agents.fake import FakeEngine
from actors.agents.scripted import ROUTES, ScriptedEngine

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
