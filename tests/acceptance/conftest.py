"""The acceptance tests' shared fixture: the real stack on the test's database and broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance import stack as stack_module
from tests.acceptance.stack import Stack, declare_topology, stack
from tests.amqp_fixtures import Amqp


@pytest.fixture
def e2e(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    """The lanes' topology declared (cleaned up by the amqp fixture) and a stack on it; a
    module that needs more (dedicated queues, handlers) defines its own ``e2e``."""
    declare_topology(pg_url, amqp)
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


@pytest.fixture(autouse=True)
def _forked_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack's `vibey` commands fork from a process that imported the CLI once
    (tests/cli_fork.py): each is still a process, without an interpreter's start."""
    monkeypatch.setattr(stack_module, "FORKED_CLI", True)
