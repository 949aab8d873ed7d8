"""What every chaos test shares in one pytest process."""

from __future__ import annotations

import os
import random

import pytest

from tests.acceptance.stack import forked_commands
from tests.chaos.groups import heavy

__all__ = ["chaos_process_seed", "forked_commands"]  # forked_commands: autouse (a stack's commands)


@pytest.fixture(scope="session", autouse=True)
def chaos_process_seed() -> None:
    """One ``VIBEY_CHAOS_SEED`` for the process, set before its first chaos test starts a worker
    fleet. A Supervisor's forkserver keeps the environment it started with, and the crash points
    its workers load read the seed from it: set first, every test's printed seed is the one its
    workers used, whichever test (and on whichever xdist worker) started the server."""
    os.environ.setdefault("VIBEY_CHAOS_SEED", str(random.SystemRandom().randrange(2**31)))


# The heavy ones first (tests/chaos/groups.py: one after another on one xdist worker), then
# the slowest of the others, so that a run does not end waiting on one started last.
SLOWEST_LIGHT = (
    "test_chaos_agents.py",
    "test_chaos_workflows.py",
    "test_consumer_timeout.py",
    "test_rabbitmq_cluster.py",
    "test_pg_restarts.py",
    "test_chaos_postgres.py",
)


def _rank(item: pytest.Item) -> tuple[int, int]:
    if heavy(item.nodeid):
        return (0, 0)
    name = item.path.name
    return (1, SLOWEST_LIGHT.index(name) if name in SLOWEST_LIGHT else len(SLOWEST_LIGHT))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heavy chaos tests first, then the others, slowest first (in the places the chaos
    tests held: the others stay put)."""
    places = [i for i, item in enumerate(items) if item.get_closest_marker("chaos")]
    ordered = sorted((items[i] for i in places), key=_rank)
    for place, item in zip(places, ordered, strict=True):
        items[place] = item
