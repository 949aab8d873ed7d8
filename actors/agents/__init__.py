"""Coding agents: who does a step's work (see :mod:`actors.agents.base` for the seam).

The names below load on first use (PEP 562), so importing one light module of the package
(the settings read :mod:`actors.agents.roster`) does not import every engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_WHERE = {
    "STATUSES": "base",
    "Engine": "base",
    "EngineError": "base",
    "EngineTask": "base",
    "EngineVerdict": "base",
    "ScriptError": "base",
    "Status": "base",
    "CommandEngine": "command",
    "FakeEngine": "fake",
    "ROUTES": "scripted",
    "ScriptedEngine": "scripted",
}

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


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'actors.agents' has no attribute {name!r}")
    return getattr(importlib.import_module(f"actors.agents.{module}"), name)
