"""Forward-only migrations: ``migrations/NNNN_name.sql``, applied in order, one transaction each.

Each applied file is recorded in ``schema_migrations`` with the SHA-256 of its text. A file
changed after it was applied is an error (:class:`MigrationChecksumMismatch`), and so is an
applied version this vibey does not ship. Concurrent runs are safe: the whole run holds a
session advisory lock, so a second ``vibey migrate`` waits and then finds nothing to do.

The files are read through ``importlib.resources``, so an installed wheel migrates exactly as a
checkout does.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from store.errors import (
    MigrationChecksumMismatch,
    MigrationError,
    MigrationFailed,
    UnknownAppliedMigration,
    translated,
)
from store.pool import connect

# pg_advisory_lock key for migrations: the first 8 bytes of sha256("vibey.migrate").
MIGRATION_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"vibey.migrate").digest()[:8], "big", signed=True
)

_FILENAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    @property
    def filename(self) -> str:
        return f"{self.version:04d}_{self.name}.sql"


@dataclass(frozen=True, slots=True)
class MigrationReport:
    applied: tuple[Migration, ...]
    already_applied: int


def shipped(package: str = "migrations") -> tuple[Migration, ...]:
    """The migrations in ``package``, by version. Names must match ``NNNN_name.sql``."""
    found: list[Migration] = []
    for entry in resources.files(package).iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILENAME.match(entry.name)
        if match is None:
            raise MigrationError(
                f"migration file {entry.name!r} is misnamed; use NNNN_lower_snake_name.sql"
            )
        found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    _check_unique_versions(found)
    return tuple(found)


def _check_unique_versions(found: Sequence[Migration]) -> None:
    for before, after in itertools.pairwise(found):
        if before.version == after.version:
            raise MigrationError(
                f"two migrations share version {before.version:04d}: "
                f"{before.filename} and {after.filename}"
            )


def migrate(url: str, migrations: Iterable[Migration] | None = None) -> MigrationReport:
    """Apply every pending migration to the database at ``url``."""
    todo = tuple(shipped() if migrations is None else migrations)
    with translated(), connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            conn.execute(_CREATE_LEDGER)
            rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
            recorded = {int(version): str(checksum) for version, checksum in rows}
            _verify(todo, recorded)
            applied: list[Migration] = []
            for migration in todo:
                if migration.version in recorded:
                    continue
                _apply(conn, migration)
                applied.append(migration)
            return MigrationReport(tuple(applied), already_applied=len(recorded))
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


def _apply(conn: psycopg.Connection[TupleRow], migration: Migration) -> None:
    """One migration and its record, in one transaction; a failure leaves neither."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL(migration.sql))
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        detail = exc.diag.message_primary or str(exc).strip().splitlines()[0]
        raise MigrationFailed(migration.filename, detail) from exc


def _verify(todo: Sequence[Migration], recorded: dict[int, str]) -> None:
    known = {m.version: m for m in todo}
    for version, checksum in sorted(recorded.items()):
        migration = known.get(version)
        if migration is None:
            raise UnknownAppliedMigration(version)
        if migration.checksum != checksum:
            raise MigrationChecksumMismatch(version, migration.name)


def pending(url: str) -> tuple[Migration, ...]:
    """The shipped migrations the database at ``url`` has not applied yet. Raises as
    :func:`migrate` would when an applied file changed or is unknown to this vibey."""
    todo = shipped()
    with translated(), connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        recorded: dict[int, str] = {}
        if exists and exists[0]:
            rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
            recorded = {int(version): str(checksum) for version, checksum in rows}
    _verify(todo, recorded)
    return tuple(m for m in todo if m.version not in recorded)
