"""The step handlers a worker runs, by job kind (``[worker] handlers`` names this registry).

The vibey phase protocol registers its handlers here; until then the registry is empty and a
worker settles every job of an unregistered kind as a ``vibey``-class failure (bounded by the
job's attempts, then failed), never silently.
"""

from __future__ import annotations

from workflows.steps import Handlers

HANDLERS: Handlers = {}
