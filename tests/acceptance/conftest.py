"""The acceptance tests' shared fixture: the real stack on the test's database and broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.stack import Stack, declare_topology, forked_commands, stack
from tests.amqp_fixtures import Amqp


@pytest.fixture
def e2e(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    """The lanes' topology declared (cleaned up by the amqp fixture) and a stack on it; a
    module that needs more (dedicated queues, handlers) defines its own ``e2e``."""
    declare_topology(pg_url, amqp)
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


__all__ = ["e2e", "forked_commands"]  # forked_commands: autouse for every test here
