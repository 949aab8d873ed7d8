"""The store's errors, and the one place psycopg's errors are translated.

Exceptions::

    StoreError                        root; every error the store raises on purpose
    ├── DatabaseUnavailable           the server did not answer (after the connect retries)
    ├── SchemaNotMigrated             a vibey table is missing: run `vibey migrate`
    └── MigrationError                the migrations on disk and in the database disagree
        ├── MigrationFailed           a migration's SQL failed; nothing of it was applied
        ├── MigrationChecksumMismatch an applied migration's file was changed afterwards
        └── UnknownAppliedMigration   the database has a migration this vibey does not ship

Nothing outside ``store/`` imports ``psycopg.errors``; callers see these types instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg_errors


class StoreError(Exception):
    """Root of the store's errors."""


class DatabaseUnavailable(StoreError):
    pass


class SchemaNotMigrated(StoreError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"{detail}. Have you run `vibey migrate`?")


class MigrationError(StoreError):
    pass


class MigrationFailed(MigrationError):
    def __init__(self, filename: str, detail: str) -> None:
        super().__init__(f"migration {filename} failed and was rolled back: {detail}")
        self.filename = filename


class MigrationChecksumMismatch(MigrationError):
    def __init__(self, version: int, name: str) -> None:
        super().__init__(
            f"migration {version:04d}_{name}.sql was changed after it was applied; migrations "
            "are forward-only: restore the file and add a new migration instead"
        )
        self.version = version


class UnknownAppliedMigration(MigrationError):
    def __init__(self, version: int) -> None:
        super().__init__(
            f"the database has migration {version:04d} applied, which this vibey does not "
            "ship; upgrade vibey or point VIBEY_PG_URL at the right database"
        )
        self.version = version


@contextmanager
def translated() -> Iterator[None]:
    """Turn the driver's errors that mean "not migrated" or "not reachable" into ours."""
    try:
        yield
    except pg_errors.UndefinedTable as exc:
        raise SchemaNotMigrated(f"a vibey table is missing ({exc.diag.message_primary})") from exc
    except pg_errors.UndefinedObject as exc:
        raise SchemaNotMigrated(f"a vibey type is missing ({exc.diag.message_primary})") from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"PostgreSQL did not answer: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
