"""The PostgreSQL backend's claims across projects, and the count its autoscaler reads.

The job repository's ``claim`` takes one project's work; the drive loop of ``vibey worker``
on ``backend = "postgres"`` serves a whole lane (every project, or the projects it is bound
to), so it claims with :func:`claim_next` (one statement, ``FOR UPDATE SKIP LOCKED``, the same
lease and attempt arithmetic as the repository's claim; see ``store/sql/drive.sql``).

:func:`scaler_query` renders the KEDA postgresql trigger's SQL for the same :class:`Work`:
the rows the claim would take, plus the leased ones (running work keeps its pods). A test
binds the two against the real database.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from store.db import Conn, Pool, fetch_all, fetch_one, statement
from store.jobs import job_from_row
from store.sql import load
from workflows.dispatch import Lane
from workflows.kinds import StepKinds
from workflows.queue import Job

Q = load("drive.sql")
_PARAM = re.compile(r"%\((\w+)\)s")


@dataclass(frozen=True, slots=True)
class Work:
    """Which jobs a worker takes: ``kinds`` (None: any; ``exclude``: every kind but these)
    of ``projects`` (None: every project)."""

    kinds: tuple[str, ...] | None = None
    exclude: bool = False
    projects: tuple[str, ...] | None = None

    @classmethod
    def of(
        cls,
        *,
        kinds: Collection[str] | None = None,
        exclude: bool = False,
        projects: Collection[str] | None = None,
    ) -> Work:
        return cls(
            kinds=None if kinds is None else tuple(sorted(set(kinds))),
            exclude=exclude,
            projects=None if not projects else tuple(sorted(set(projects))),
        )

    @classmethod
    def for_lanes(
        cls,
        lanes: Collection[str],
        projects: Collection[str] | None = None,
        *,
        build_kinds: Collection[str],
    ) -> Work:
        """The jobs of ``lanes``: BUILD is ``build_kinds`` (the kinds the definitions put in
        the build lane), INTERACTIVE every other kind (as the relay routes a kind no
        definition declares)."""
        wanted = {Lane(lane) for lane in lanes}
        if not wanted:
            raise ValueError("a worker serves at least one lane")
        if wanted == set(Lane):
            return cls.of(projects=projects)
        return cls.of(kinds=build_kinds, exclude=Lane.BUILD not in wanted, projects=projects)

    def params(self) -> dict[str, Any]:
        return {
            "kinds": None if self.kinds is None else list(self.kinds),
            "exclude": self.exclude,
            "projects": None if self.projects is None else list(self.projects),
        }


def build_kinds(kinds: StepKinds) -> frozenset[str]:
    """The kinds (and aliases) of ``kinds`` that run in the BUILD lane."""
    canonical = {name for name, kind in kinds.items() if kind.lane is Lane.BUILD}
    aliases = {alias for alias, name in kinds.aliases.items() if name in canonical}
    return frozenset(canonical | aliases)


def claim_next_on(conn: Conn, work: Work, *, owner: str, limit: int = 1) -> list[Job]:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = fetch_all(conn, Q["claim_next"], {**work.params(), "owner": owner, "limit": limit})
    jobs = [job_from_row(row) for row in rows]
    jobs.sort(key=lambda j: (-j.priority, j.run_after, j.id))
    return jobs


def claim_next(pool: Pool, work: Work, *, owner: str, limit: int = 1) -> list[Job]:
    """Lease up to ``limit`` claimable jobs of ``work``, highest priority first."""
    with statement(pool) as conn:
        return claim_next_on(conn, work, owner=owner, limit=limit)


def scaler_count(pool: Pool, work: Work) -> int:
    """What the autoscaler's query counts now (claimable plus leased)."""
    with statement(pool) as conn:
        row = fetch_one(conn, Q["scaler_count"], work.params())
    return 0 if row is None else int(row["count"])


def claimable_count(pool: Pool, work: Work) -> int:
    """What the claim would take now (the trigger's count without the leased rows)."""
    with statement(pool) as conn:
        row = fetch_one(conn, Q["claimable_count"], work.params())
    return 0 if row is None else int(row["count"])


def scaler_query(work: Work) -> str:
    """The trigger's SQL with ``work`` written in as literals (KEDA sends no parameters)."""
    params = work.params()

    def literal(match: re.Match[str]) -> str:
        return sql.Literal(params[match.group(1)]).as_string(None)

    return " ".join(_PARAM.sub(literal, Q["scaler_count"]).split())
