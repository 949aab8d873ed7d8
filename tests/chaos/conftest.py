"""What every chaos test shares in one pytest process."""

from __future__ import annotations

import os
import random

import pytest


@pytest.fixture(scope="session", autouse=True)
def chaos_process_seed() -> None:
    """One ``VIBEY_CHAOS_SEED`` for the process, set before its first chaos test starts a worker
    fleet. A Supervisor's forkserver keeps the environment it started with, and the crash points
    its workers load read the seed from it: set first, every test's printed seed is the one its
    workers used, whichever test (and on whichever xdist worker) started the server."""
    os.environ.setdefault("VIBEY_CHAOS_SEED", str(random.SystemRandom().randrange(2**31)))


# The slowest first (measured), so that a parallel run does not end waiting on one of them
# started last; the rest keep their order.
SLOWEST_FIRST = (
    "test_chaos_loop_services.py",
    "test_chaos_postgres_fleet.py",
    "test_chaos_rabbitmq.py",
    "test_chaos_postgres.py",
    "test_chaos_agents.py",
    "test_rabbitmq_cluster.py",
    "test_pg_blips.py",
    "test_chaos_in_place.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Chaos tests, slowest first, in the places the chaos tests held (others stay put)."""

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

    places = [i for i, item in enumerate(items) if item.get_closest_marker("chaos")]
    ordered = sorted((items[i] for i in places), key=rank)
    for place, item in zip(places, ordered, strict=True):
        items[place] = item
