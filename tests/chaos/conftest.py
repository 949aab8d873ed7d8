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


# The tests whose fleets keep both cores busy on their own (many worker processes respawned,
# hundreds of workflows, or a CLI called in a loop): they run one after another on one xdist
# worker (`--dist loadgroup`), beside the tests that mostly wait (on leases, outages, private
# servers starting), which share the other workers. Three of them at once on two cores
# starved each other past their deadlines (measured); one at a time they keep their figures.
HEAVY = (
    "test_chaos_loop_services.py",
    "test_chaos_postgres_fleet.py",
    "test_chaos_rabbitmq.py",
    "test_chaos_postgres.py",
    "test_chaos_in_place.py",
    "test_poison.py",
    "test_ledger_kills.py",
    "test_pg_blips.py::test_backend_kills_cost_seconds_not_minutes",
)
# Then the slowest of the others first, so that a run does not end waiting on one started last.
SLOWEST_LIGHT = (
    "test_chaos_agents.py",
    "test_rabbitmq_cluster.py",
    "test_consumer_timeout.py",
    "test_pg_restarts.py",
)


def _heavy(item: pytest.Item) -> bool:
    return any(item.nodeid.split("/")[-1].startswith(name) for name in HEAVY)


def _rank(item: pytest.Item) -> tuple[int, int]:
    if _heavy(item):
        return (0, 0)
    name = item.path.name
    return (1, SLOWEST_LIGHT.index(name) if name in SLOWEST_LIGHT else len(SLOWEST_LIGHT))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heavy chaos tests in one xdist group, first; then the others, slowest first (in the
    places the chaos tests held: the others stay put)."""
    places = [i for i, item in enumerate(items) if item.get_closest_marker("chaos")]
    ordered = sorted((items[i] for i in places), key=_rank)
    for place, item in zip(places, ordered, strict=True):
        items[place] = item
        if _heavy(item):
            item.add_marker(pytest.mark.xdist_group("heavy"))
