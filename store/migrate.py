"""Forward-only migrations: ``migrations/NNNN_name.sql``, applied in order, one transaction each.

Each applied file is recorded in ``schema_migrations`` with the SHA-256 of its text. A file
changed after it was applied is an error (:class:`MigrationChecksumMismatch`). Concurrent runs
are safe: the whole run holds a session advisory lock, so a second ``vibey migrate`` waits and
then finds nothing to do.

**Which code a schema serves (expand, then contract).** A release's code is known by the
newest migration it ships (:func:`code_level`). A migration declares the oldest code it still
serves with a line ``-- vibey: serves code from NNNN`` (NNNN: a code level); without one it
serves only code that ships it. An expanding migration (a new table, a nullable column, a new
index) declares the level of the release before it, so that release's pods keep running while
it applies and during the rollout; a contracting one (a dropped or renamed column, a new
constraint old code would break) declares its own release's level, and ships a release after
the code stopped using what it removes. The declaration is recorded with the migration
(``schema_migrations.serves_from``), so older code, which does not ship the file, reads it:
:func:`pending` accepts applied migrations this vibey does not ship when every one of them
serves its level (raising :class:`UnknownAppliedMigration` otherwise), and ``vibey doctor
--probe``, the pods' readiness, stays green for such a pod.

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
_SERVES = re.compile(r"^--\s*vibey:\s*serves code from\s+(\d{1,4})\s*$", re.MULTILINE)

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
# Not a numbered migration: older code ignores the column (and inserts NULL: "itself only").
_ADD_SERVES_FROM = "ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS serves_from integer"


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

    @property
    def serves_from(self) -> int:
        """The oldest code level this migration serves (its ``-- vibey: serves code from``
        line; none: its own version, only code that ships it)."""
        found = _SERVES.findall(self.sql)
        if len(found) > 1:
            raise MigrationError(f"{self.filename} declares 'serves code from' twice")
        level = int(found[0]) if found else self.version
        if level > self.version:
            raise MigrationError(
                f"{self.filename} serves code from {level:04d}, after itself: a migration "
                "serves at most the code that ships it"
            )
        return level


def code_level(migrations: Sequence[Migration]) -> int:
    """This code's level: the newest migration it ships (0: none)."""
    return max((m.version for m in migrations), default=0)


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
    """Apply every pending migration to the database at ``url``. Newer migrations already
    applied are fine when they serve this code (a rollback's Job finds nothing to do)."""
    todo = tuple(shipped() if migrations is None else migrations)
    with translated(), connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            conn.execute(_CREATE_LEDGER)
            conn.execute(_ADD_SERVES_FROM)
            recorded = _recorded(conn)
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


@dataclass(frozen=True, slots=True)
class Applied:
    checksum: str
    serves_from: int | None  # None: recorded before the column existed (itself only)


def _recorded(conn: psycopg.Connection[TupleRow]) -> dict[int, Applied]:
    has_column = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND table_name = 'schema_migrations' AND column_name = 'serves_from')"
    ).fetchone()
    query = (
        "SELECT version, checksum, serves_from FROM schema_migrations"
        if has_column and has_column[0]
        else "SELECT version, checksum, NULL::integer FROM schema_migrations"
    )
    rows = conn.execute(query).fetchall()
    return {
        int(version): Applied(str(checksum), None if serves is None else int(serves))
        for version, checksum, serves in rows
    }


def _apply(conn: psycopg.Connection[TupleRow], migration: Migration) -> None:
    """One migration and its record, in one transaction; a failure leaves neither."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL(migration.sql))
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum, serves_from) "
                "VALUES (%s, %s, %s, %s)",
                (migration.version, migration.name, migration.checksum, migration.serves_from),
            )
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        detail = exc.diag.message_primary or str(exc).strip().splitlines()[0]
        raise MigrationFailed(migration.filename, detail) from exc


def _verify(todo: Sequence[Migration], recorded: dict[int, Applied]) -> None:
    """Every applied file this vibey ships is unchanged; every applied one it does not ship
    serves its level (:class:`UnknownAppliedMigration` names the first that does not)."""
    known = {m.version: m for m in todo}
    level = code_level(todo)
    for version, applied in sorted(recorded.items()):
        migration = known.get(version)
        if migration is None:
            serves = version if applied.serves_from is None else applied.serves_from
            if version <= level or serves > level:
                raise UnknownAppliedMigration(version)
            continue
        if migration.checksum != applied.checksum:
            raise MigrationChecksumMismatch(version, migration.name)


def pending(url: str) -> tuple[Migration, ...]:
    """The shipped migrations the database at ``url`` has not applied yet. Raises as
    :func:`migrate` would when an applied file changed, or when an applied migration this
    vibey does not ship no longer serves its code."""
    todo = shipped()
    with translated(), connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        recorded = _recorded(conn) if exists and exists[0] else {}
    _verify(todo, recorded)
    return tuple(m for m in todo if m.version not in recorded)
