"""What a ``module:attribute`` setting names: the handlers, the workflow definitions.

Light on purpose (no Dramatiq, no pika, no driver): ``vibey.wiring`` checks the settings
with it in a CLI command that runs no step, and every process that runs steps loads its
parts with it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from workflows.engine import Registry
from workflows.steps import Handlers


def load_object(path: str) -> Any:
    """``module:attribute`` → the object it names."""
    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def load_handlers(path: str, context: Any = None) -> Handlers:
    """A ``Handlers`` mapping, or a factory called with the handlers' context."""
    loaded = load_object(path)
    if isinstance(loaded, Mapping):
        return loaded
    handlers: Handlers = loaded(context)
    return handlers


def load_registry(path: str) -> Registry:
    """The workflow definitions ``path`` names (an iterable of them)."""
    return Registry(load_object(path))
