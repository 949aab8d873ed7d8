"""Real-service fixtures.

PostgreSQL comes from ``VIBEY_TEST_PG_URL`` when it is set (an admin URL: the fixtures create
and drop databases through it); otherwise from a testcontainers container where Docker works;
otherwise every test that needs it fails with the line that fixes it. Nothing is skipped.

Each test gets its own database, cloned from a migrated template
(``CREATE DATABASE … TEMPLATE …``), so tests run in parallel under xdist. The template is named
after the checksum of the shipped migrations, built once under an advisory lock and reused by
every worker and every later run until a migration changes. A clone costs PostgreSQL a second or
more when the box is busy (the template is copied through the WAL and flushed), and so does a
drop: each pytest process clones one database ahead and drops behind, on a thread of its own
(:class:`Databases`), so a test neither waits for its database nor for the last one's drop.
"""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from store.migrate import migrate, shipped

PG_FIX = (
    "no PostgreSQL for the tests: export VIBEY_TEST_PG_URL=postgresql://postgres@127.0.0.1:5432/"
    "postgres (an admin URL), or run `just up`, or start Docker so testcontainers can"
)

TEMPLATE_LOCK_KEY = 0x7669626579  # "vibey"

# pytest rewrites the asserts of every test module on import and keeps the result beside it as
# bytecode, unless Python is told not to write bytecode (PYTHONDONTWRITEBYTECODE, set on some
# machines): then every pytest process (each xdist worker, each tier) rewrites all of them
# again, about 7 s of CPU a process. The cache (__pycache__, ignored by git) is written here
# whatever that variable says; nothing else changes.
sys.dont_write_bytecode = False


# The tier of each test folder (a marker each; chaos and real_cli mark themselves).
TIERS = {
    "unit": "unit",
    "agents": "unit",
    "integration": "integration",
    "contracts": "integration",
    "acceptance": "acceptance",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if path.is_relative_to(root):
            folder = path.relative_to(root).parts[0]
            if folder in TIERS:
                item.add_marker(TIERS[folder])


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def _reachable(url: str) -> str | None:
    try:
        with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    return None


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    url = os.environ.get("VIBEY_TEST_PG_URL")
    if url:
        problem = _reachable(url)
        if problem:
            pytest.fail(f"VIBEY_TEST_PG_URL does not answer ({problem}). {PG_FIX}", pytrace=False)
        yield url
        return
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # pragma: no cover - the community path moved in testcontainers 4.15
        from testcontainers.postgres import PostgresContainer
    try:
        container = PostgresContainer("postgres:15", driver=None).start()
    except Exception as exc:  # noqa: BLE001 - any Docker failure means "no container here"
        pytest.fail(f"{PG_FIX} (Docker: {str(exc).splitlines()[0][:120]})", pytrace=False)
    try:
        yield container.get_connection_url()
    finally:
        container.stop()


def _migrations_digest() -> str:
    digest = hashlib.sha256()
    for migration in shipped():
        digest.update(f"{migration.version}:{migration.checksum}\n".encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str) -> str:
    """The name of a migrated template database for the shipped migrations."""
    name = f"vibey_tpl_{_migrations_digest()}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK_KEY,))
        try:
            found = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                building = f"{name}_build_{os.getpid()}"
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(building))
                )
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
                migrate(with_database(pg_admin_url, building))
                admin.execute(
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(building), sql.Identifier(name)
                    )
                )
                admin.execute(
                    sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true").format(sql.Identifier(name))
                )
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (TEMPLATE_LOCK_KEY,))
    return name


def create_database(pg_admin_url: str, *, template: str | None) -> tuple[str, str]:
    """A fresh database (cloned from ``template`` when given): its name and URL."""
    name = f"vibey_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        if template is None:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
    return name, with_database(pg_admin_url, name)


def drop_database(pg_admin_url: str, name: str) -> None:
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


class Databases:
    """Clones of the template for one pytest process, made one ahead and dropped behind on a
    thread of their own. Every test still gets a fresh clone that no other test touched; a
    failed clone or drop fails the next :meth:`take` (or the session's end)."""

    def __init__(self, admin_url: str, template: str) -> None:
        self._admin_url, self._template = admin_url, template
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-databases")
        self._ahead: Future[tuple[str, str]] | None = None
        self._drops: list[Future[None]] = []

    def _clone(self) -> Future[tuple[str, str]]:
        return self._thread.submit(create_database, self._admin_url, template=self._template)

    def take(self) -> tuple[str, str]:
        """A fresh clone (name, URL); the next one starts at once."""
        self._raise_failed_drops()
        ahead = self._ahead or self._clone()
        self._ahead = self._clone()
        return ahead.result()

    def drop(self, name: str) -> None:
        self._drops.append(self._thread.submit(drop_database, self._admin_url, name))

    def close(self) -> None:
        if self._ahead is not None:
            name, _ = self._ahead.result()
            self.drop(name)
        self._thread.shutdown(wait=True)
        self._raise_failed_drops()

    def _raise_failed_drops(self) -> None:
        done = [drop for drop in self._drops if drop.done()]
        self._drops = [drop for drop in self._drops if not drop.done()]
        for drop in done:
            drop.result()


@pytest.fixture(scope="session")
def pg_databases(pg_admin_url: str, pg_template: str) -> Iterator[Databases]:
    databases = Databases(pg_admin_url, pg_template)
    try:
        yield databases
    finally:
        databases.close()


@pytest.fixture
def pg_url(pg_databases: Databases) -> Iterator[str]:
    """A migrated database of this test's own."""
    name, url = pg_databases.take()
    try:
        yield url
    finally:
        pg_databases.drop(name)


@pytest.fixture
def empty_pg_url(pg_admin_url: str) -> Iterator[str]:
    """An empty database of this test's own (nothing migrated)."""
    name, url = create_database(pg_admin_url, template=None)
    try:
        yield url
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def pool(pg_url: str) -> Iterator[ConnectionPool]:
    with ConnectionPool(
        pg_url, min_size=1, max_size=20, open=True, kwargs={"autocommit": True}
    ) as p:
        p.wait(timeout=30)
        yield p


from tests.amqp_fixtures import *  # noqa: E402, F403

# The chaos tests' figures reach the terminal under xdist too (tests/chaos/figures.py), and
# `--dist loadgroup` runs the heavy ones one after another (tests/chaos/groups.py).
from tests.chaos.figures import pytest_runtest_makereport, pytest_terminal_summary  # noqa: E402, F401
from tests.chaos.groups import pytest_xdist_make_scheduler  # noqa: E402, F401
