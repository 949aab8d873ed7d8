"""The store's errors, and the one place psycopg's errors are translated.

Exceptions::

    StoreError                        root; every error the store raises on purpose
    ├── DatabaseUnavailable           the server did not answer (after the retries)
    │   ├── ConnectionLost            the connection broke before anything could commit
    │   └── CommitUnknown             it broke while a commit may have been in flight
    ├── SchemaNotMigrated             a vibey table is missing: run `vibey migrate`
    └── MigrationError                the migrations on disk and in the database disagree
        ├── MigrationFailed           a migration's SQL failed; nothing of it was applied
        ├── MigrationChecksumMismatch an applied migration's file was changed afterwards
        └── UnknownAppliedMigration   the database has a migration this vibey does not ship

Nothing outside ``store/`` imports ``psycopg.errors``; callers see these types instead.

A connection-level failure is told apart by *where* it happened (:class:`Phase`): while a
connection was being taken from the pool or inside a transaction before its COMMIT was sent,
nothing committed (:class:`ConnectionLost`, safe to run again); during the COMMIT, or during a
statement on an autocommit connection (which commits by itself), it may have committed
(:class:`CommitUnknown`: the caller reads what is true). ``store.retry`` decides what to retry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

# SQLSTATEs that mean the session is gone (class 08: connection exceptions; the server's
# admin, crash and starting-up shutdowns). A client-side failure has no SQLSTATE at all.
_SESSION_GONE = ("57P01", "57P02", "57P03")


class StoreError(Exception):
    """Root of the store's errors."""


class DatabaseUnavailable(StoreError):
    pass


class ConnectionLost(DatabaseUnavailable):
    """The connection failed before the work could have committed: running it again is safe."""


class CommitUnknown(DatabaseUnavailable):
    """The connection failed while a commit may have been in flight: it may have landed."""


class SettleRefused(StoreError):
    """The fenced settle of a job claimed in the same unit of work did not apply: the unit
    rolls back (nothing of the step is committed) rather than record an unsettled step."""


class DecisionFailed(StoreError):
    """A workflow's decision failed in a unit of work that took no savepoint for it (a short
    step's settle, ``savepoint=False``): the caller rolls the unit back and settles the step
    again in a unit that takes one, where the failure blocks the workflow as it always does."""


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
            "ship and which does not serve this vibey's code (docs/deploy.md, upgrades); "
            "upgrade vibey or point VIBEY_PG_URL at the right database"
        )
        self.version = version


class Phase:
    """Where a store call is, as far as a lost connection is concerned. It starts unknown (a
    failure then counts as a possible commit); a transaction scope says when nothing it did
    can have committed yet (``quiet``) and when its COMMIT goes out (``committing``)."""

    __slots__ = ("may_have_committed",)

    def __init__(self) -> None:
        self.may_have_committed = True

    def quiet(self) -> None:
        self.may_have_committed = False

    def committing(self) -> None:
        self.may_have_committed = True


def connection_level(exc: BaseException) -> bool:
    """The session itself failed (as opposed to a statement the server refused)."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _SESSION_GONE


@contextmanager
def translated() -> Iterator[Phase]:
    """Turn the driver's errors that mean "not migrated" or "not reachable" into ours; a lost
    connection becomes :class:`ConnectionLost` or :class:`CommitUnknown` by its phase."""
    phase = Phase()
    try:
        yield phase
    except psycopg.OperationalError as exc:
        if not connection_level(exc):
            raise DatabaseUnavailable(f"PostgreSQL did not answer: {_first_line(exc)}") from exc
        if isinstance(exc, PoolTimeout) or not phase.may_have_committed:
            raise ConnectionLost(f"PostgreSQL did not answer: {_first_line(exc)}") from exc
        raise CommitUnknown(
            "the connection to PostgreSQL broke while a commit was in flight, so it may have "
            f"landed (look before repeating it): {_first_line(exc)}"
        ) from exc
    except pg_errors.UndefinedTable as exc:
        raise SchemaNotMigrated(f"a vibey table is missing ({exc.diag.message_primary})") from exc
    except pg_errors.UndefinedObject as exc:
        raise SchemaNotMigrated(f"a vibey type is missing ({exc.diag.message_primary})") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
