"""Project routes: which projects have dedicated queues, as data every publisher reads.

The outbox relay in every worker, the CLI's client and the reconciler route a project's
pointers to its dedicated queues exactly when ``project_route`` holds the project. A row is
written when a dedicated worker starts (``vibey worker --project P``) or by ``vibey project
dedicate P``; ``vibey project undedicate P`` deletes it. Each change notifies
:data:`CHANNEL`, and :class:`RouteCache` (one per long-lived process) re-reads the table on
that notification, on reconnect, and at least every ``refresh`` as a backstop.

A short-lived process (one CLI command) reads the table once: :func:`read_routes`.
:class:`StaticRoutes` is the fake that ships beside the cache.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import psycopg
from psycopg.rows import TupleRow

from store.db import Pool, fetch_all, fetch_one, statement, transaction
from store.errors import DatabaseUnavailable
from store.pool import connect
from store.retry import retried
from store.sql import load

log = logging.getLogger(__name__)

Q = load("routes.sql")
CHANNEL = "vibey_project_routes"
RESEND_LIMIT = 10_000
POLL_S = 0.2  # how soon the listener thread notices stop()


class Routes(Protocol):
    """What a router asks: is this project routed to its dedicated queues?"""

    def __contains__(self, project_id: object) -> bool: ...


@dataclass(frozen=True, slots=True)
class StaticRoutes:
    """Routes that never change (tests, and processes that read the table once)."""

    projects: frozenset[str] = frozenset()

    def __contains__(self, project_id: object) -> bool:
        return project_id in self.projects


@dataclass(frozen=True, slots=True)
class ProjectRoute:
    project_id: str
    dedicated_at: datetime
    dedicated_by: str


@retried("read the project routes", idempotent=True)
def list_routes(pool: Pool) -> list[ProjectRoute]:
    with statement(pool) as conn:
        rows = fetch_all(conn, Q["routes"], {})
    return [ProjectRoute(r["project_id"], r["dedicated_at"], r["dedicated_by"]) for r in rows]


def read_routes(pool: Pool) -> StaticRoutes:
    """The routes as of now, read once."""
    return StaticRoutes(frozenset(route.project_id for route in list_routes(pool)))


@retried("dedicate a project", idempotent=True)  # ON CONFLICT DO NOTHING
def dedicate(pool: Pool, project_id: str, *, by: str) -> bool:
    """Route ``project_id`` to its dedicated queues; True when it was not routed before. A new
    route resends the project's claimable pointers (they went to the shared queues)."""
    with transaction(pool) as conn:
        created = fetch_one(conn, Q["dedicate"], {"project_id": project_id, "by": by})
        if created is not None:
            _resend_on(conn, project_id)
    return created is not None


@retried("undedicate a project", idempotent=True)
def undedicate(pool: Pool, project_id: str) -> bool:
    """Route ``project_id`` back to the shared queues; True when it was routed before."""
    with transaction(pool) as conn:
        removed = fetch_one(conn, Q["undedicate"], {"project_id": project_id})
        if removed is not None:
            _resend_on(conn, project_id)
    return removed is not None


def _resend_on(conn: psycopg.Connection[TupleRow], project_id: str) -> int:
    params = {"project_id": project_id, "limit": RESEND_LIMIT}
    return len(fetch_all(conn, Q["resend_project"], params))


class RouteCache:
    """The routes, kept current by ``LISTEN vibey_project_routes`` on a connection of its own
    (a daemon thread), re-read on every notification and at least every ``refresh``.

    Until the first read succeeds it answers with ``initial``; a lost connection keeps the
    last routes read and retries after ``retry``."""

    def __init__(
        self,
        *,
        url: str,
        pool: Pool,
        initial: Iterable[str] = (),
        refresh: timedelta = timedelta(seconds=30),
        retry: timedelta = timedelta(seconds=2),
    ) -> None:
        self._url = url
        self._pool = pool
        self._projects: frozenset[str] = frozenset(initial)
        self._refresh = refresh.total_seconds()
        self._retry = retry.total_seconds()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition()
        self._last_read = 0.0
        self.reads = 0

    def __contains__(self, project_id: object) -> bool:
        return project_id in self._projects

    @property
    def projects(self) -> frozenset[str]:
        return self._projects

    def start(self) -> RouteCache:
        """Read the routes now (best effort), then keep them current in the background."""
        try:
            self._read()
        except DatabaseUnavailable as exc:
            log.warning("project routes: PostgreSQL did not answer (%s); retrying", exc)
        self._thread = threading.Thread(target=self._listen, name="route-cache", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=POLL_S + 5)

    def wait_for(self, wanted: Collection[str], *, present: bool = True, timeout: float) -> bool:
        """Wait until every project in ``wanted`` is (or, ``present=False``, is not) routed."""
        with self._changed:
            return self._changed.wait_for(
                lambda: all((p in self._projects) is present for p in wanted), timeout
            )

    def _read(self) -> None:
        projects = read_routes(self._pool).projects
        with self._changed:
            if projects != self._projects:
                log.info("project routes: dedicated %s", ", ".join(sorted(projects)) or "none")
            self._projects = projects
            self._last_read = time.monotonic()
            self.reads += 1
            self._changed.notify_all()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                conn = connect(self._url, autocommit=True)
            except DatabaseUnavailable as exc:
                log.warning("project routes: cannot listen (%s); again in %gs", exc, self._retry)
                self._stop.wait(self._retry)
                continue
            try:
                self._serve(conn)
            except (psycopg.Error, DatabaseUnavailable) as exc:
                log.warning("project routes: listener lost its connection (%s)", exc)
                self._stop.wait(self._retry)
            finally:
                conn.close()

    def _serve(self, conn: psycopg.Connection[TupleRow]) -> None:
        conn.execute(f"LISTEN {CHANNEL}")
        self._read()  # what changed while nobody listened
        while not self._stop.is_set():
            notified = any(True for _ in conn.notifies(timeout=min(self._refresh, POLL_S)))
            if notified or time.monotonic() - self._last_read >= self._refresh:
                self._read()
