"""The heavy chaos tests, run one after another on one xdist worker (``--dist loadgroup``).

Their fleets keep both cores busy on their own (many worker processes respawned, hundreds of
workflows, or a CLI called in a loop); the others mostly wait (on leases, outages, private
servers starting) and share the other workers. Three heavy ones at once on two cores starved
each other past their deadlines (measured); one at a time they keep their figures. The
PostgreSQL chaos test's workers are forked from a forkserver (a respawn is a fork, not an
interpreter's start), so it mostly waits on its leases now (7 CPU-s in 25 s, measured) and
runs beside the others.

The group is named here, by node id, rather than by an ``xdist_group`` mark: pytest-xdist 3.8
tags a marked test by rewriting ``item._nodeid``, which pytest 9 no longer reads, so the marks
are silently ignored. :func:`pytest_xdist_make_scheduler` (imported by ``tests/conftest.py``:
the controller needs it) gives ``--dist loadgroup`` a scheduler that puts these in one group,
and every other test in a group of its own.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

GROUP = "chaos-heavy"
HEAVY = (
    "tests/chaos/test_chaos_loop_services.py::",
    "tests/chaos/test_chaos_postgres_fleet.py::",
    "tests/chaos/test_chaos_rabbitmq.py::",
    "tests/chaos/test_chaos_in_place.py::",
    "tests/chaos/test_poison.py::",
    "tests/chaos/test_ledger_kills.py::",
    "tests/chaos/test_pg_blips.py::test_backend_kills_cost_seconds_not_minutes",
)


def heavy(nodeid: str) -> bool:
    return nodeid.startswith(HEAVY)


class ChaosGroups(LoadGroupScheduling):  # type: ignore[misc]
    """``loadgroup`` with the heavy chaos tests as one group."""

    def _split_scope(self, nodeid: str) -> str:
        return GROUP if heavy(nodeid) else str(super()._split_scope(nodeid))


@pytest.hookimpl(optionalhook=True)  # a hook of xdist: `-p no:xdist` runs without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ChaosGroups | None:
    """The scheduler for ``--dist loadgroup``; None leaves every other mode to xdist."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return ChaosGroups(config, log)
