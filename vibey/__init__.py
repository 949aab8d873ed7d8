"""vibey: a durable workflow engine on Dramatiq, RabbitMQ and PostgreSQL.

``vibey.Client`` is the Python client (:mod:`vibey.client`); the rest of this package is the
CLI, the settings and the wiring. The client is imported on first use, so ``import vibey``
(and the CLI's start) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vibey.client import Client

__all__ = ["Client"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from vibey.client import Client

        return Client
    raise AttributeError(f"module 'vibey' has no attribute {name!r}")
