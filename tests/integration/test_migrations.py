"""store.migrate against a real PostgreSQL, and the drift check between migrations and models.

Every test starts from an empty database of its own (``empty_pg_url``).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from psycopg import sql
from sqlalchemy import Column, MetaData, Text, create_engine
from sqlalchemy.pool import NullPool
from sqlmodel import SQLModel

from store import models
from store.errors import (
    MigrationChecksumMismatch,
    MigrationError,
    MigrationFailed,
    UnknownAppliedMigration,
)
from store.migrate import (
    MIGRATION_LOCK_KEY,
    Migration,
    MigrationReport,
    code_level,
    migrate,
    pending,
    shipped,
)

# A migration that runs statements, then fails at run time (not at parse time), so the test
# can see that its earlier statements were rolled back.
BROKEN = Migration(
    9001,
    "broken",
    "CREATE TABLE half_written (id integer);\n"
    "INSERT INTO half_written VALUES (1);\n"
    "SELECT 1 / 0;\n",
)
LATER = Migration(9002, "later", "CREATE TABLE later_table (id integer);\n")


def query(url: str, text: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(text, params or None)
        return cur.fetchall() if cur.description else []


def ledger(url: str) -> list[tuple[int, str, str]]:
    return [
        (int(v), str(n), str(c))
        for v, n, c in query(
            url, "SELECT version, name, checksum FROM schema_migrations ORDER BY 1"
        )
    ]


def table_exists(url: str, name: str) -> bool:
    return bool(query(url, "SELECT to_regclass(%s) IS NOT NULL", name)[0][0])


# --- applying ---------------------------------------------------------------------------------


def test_all_migrations_apply_and_are_recorded_with_checksums(empty_pg_url: str) -> None:
    report = migrate(empty_pg_url)
    assert report.applied == shipped()
    assert report.already_applied == 0
    # The checksum is the SHA-256 of the file as shipped, computed here independently.
    files = resources.files("migrations")
    expected = [
        (
            m.version,
            m.name,
            hashlib.sha256(files.joinpath(m.filename).read_bytes()).hexdigest(),
        )
        for m in shipped()
    ]
    assert ledger(empty_pg_url) == expected
    assert query(
        empty_pg_url, "SELECT count(*) FROM schema_migrations WHERE applied_at IS NULL"
    ) == [(0,)]
    for table in (
        "job",
        "job_dependency",
        "gate",
        "workflow",
        "workflow_history",
        "ledger_event",
        "ledger_head",
        "engine_health",
    ):
        assert table_exists(empty_pg_url, table), table


def test_a_second_run_applies_nothing(empty_pg_url: str) -> None:
    migrate(empty_pg_url)
    before = ledger(empty_pg_url)
    report = migrate(empty_pg_url)
    assert report == MigrationReport(applied=(), already_applied=len(shipped()))
    assert ledger(empty_pg_url) == before


def test_a_changed_applied_file_is_refused_and_changes_nothing(empty_pg_url: str) -> None:
    migrate(empty_pg_url)
    before = ledger(empty_pg_url)
    first = shipped()[0]
    edited = Migration(first.version, first.name, first.sql + "\n-- edited afterwards\n")
    with pytest.raises(MigrationChecksumMismatch) as caught:
        migrate(empty_pg_url, [edited, *shipped()[1:], LATER])
    assert caught.value.version == first.version
    assert first.filename in str(caught.value)
    assert ledger(empty_pg_url) == before
    assert not table_exists(empty_pg_url, LATER.name + "_table")


def test_an_unknown_applied_version_is_refused(empty_pg_url: str) -> None:
    migrate(empty_pg_url, [*shipped(), LATER])
    with pytest.raises(UnknownAppliedMigration) as caught:
        migrate(empty_pg_url)
    assert caught.value.version == LATER.version
    assert f"{LATER.version:04d}" in str(caught.value)


def test_a_failing_migration_leaves_no_half_written_state(empty_pg_url: str) -> None:
    with pytest.raises(MigrationFailed, match="division by zero") as caught:
        migrate(empty_pg_url, [*shipped(), BROKEN, LATER])
    assert BROKEN.filename in str(caught.value)
    # The migrations before it are committed; it and everything after it are not.
    assert [row[0] for row in ledger(empty_pg_url)] == [m.version for m in shipped()]
    assert not table_exists(empty_pg_url, "half_written")
    assert not table_exists(empty_pg_url, "later_table")
    # The advisory lock was released: the next run (the broken one dropped) gets through.
    assert migrate(empty_pg_url, [*shipped(), LATER]).applied == (LATER,)


# --- concurrency ------------------------------------------------------------------------------


def waiting_for_migration_lock(url: str) -> int:
    """Sessions blocked on the migration advisory lock in this database."""
    high, low = divmod(MIGRATION_LOCK_KEY % 2**64, 2**32)
    rows = query(
        url,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND classid = %s AND objid = %s AND objsubid = 1",
        high,
        low,
    )
    return int(rows[0][0])


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {condition.__name__}")
        time.sleep(0.02)


def test_concurrent_runs_both_succeed_and_apply_once(empty_pg_url: str) -> None:
    # Hold the lock first, so both runs are provably inside migrate() at the same time.
    with psycopg.connect(empty_pg_url, autocommit=True) as holder, ThreadPoolExecutor(2) as pool:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        runs = [pool.submit(migrate, empty_pg_url) for _ in range(2)]

        def both_waiting() -> bool:
            return waiting_for_migration_lock(empty_pg_url) == 2

        wait_until(both_waiting)
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        reports = [run.result(timeout=60) for run in runs]

    applied = sorted(len(r.applied) for r in reports)
    assert applied == [0, len(shipped())]
    assert sorted(r.already_applied for r in reports) == [0, len(shipped())]
    assert [row[0] for row in ledger(empty_pg_url)] == [m.version for m in shipped()]


def test_concurrent_runs_without_a_referee(empty_pg_url: str) -> None:
    barrier = threading.Barrier(4)

    def run() -> MigrationReport:
        barrier.wait(timeout=10)
        return migrate(empty_pg_url)

    with ThreadPoolExecutor(4) as pool:
        reports = list(pool.map(lambda _: run(), range(4)))
    assert sum(len(r.applied) for r in reports) == len(shipped())
    assert [row[0] for row in ledger(empty_pg_url)] == [m.version for m in shipped()]


# --- drift: migrations vs store.models --------------------------------------------------------


def sqlalchemy_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1).replace(
        "postgres://", "postgresql+psycopg://", 1
    )


# Alembic's default comparators, plus its opt-in comparator of named CHECK constraints.
ALEMBIC_OPTS = {
    "compare_type": True,
    "compare_server_default": True,
    "autogenerate_plugins": ["alembic.autogenerate.*", "alembic.ext.checkconstraint_byname"],
}


def alembic_diff(url: str, metadata: MetaData) -> list[Any]:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts=ALEMBIC_OPTS)
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def copy_of(metadata: MetaData) -> MetaData:
    copied = MetaData()
    for table in metadata.sorted_tables:
        table.to_metadata(copied)
    return copied


def test_models_match_the_migrated_schema(empty_pg_url: str) -> None:
    migrate(empty_pg_url)
    assert set(SQLModel.metadata.tables) >= {
        "job",
        "job_dependency",
        "gate",
        "workflow",
        "workflow_history",
        "ledger_event",
        "ledger_head",
        "engine_health",
        "schema_migrations",
    }
    assert models.JobRow.__tablename__ == "job"
    assert alembic_diff(empty_pg_url, SQLModel.metadata) == []


def test_the_drift_check_detects_a_changed_model(empty_pg_url: str) -> None:
    migrate(empty_pg_url)
    changed = copy_of(SQLModel.metadata)
    changed.tables["job"].append_column(Column("not_in_sql", Text, nullable=True))
    diff = alembic_diff(empty_pg_url, changed)
    assert [(d[0], d[2], d[3].name) for d in diff] == [("add_column", "job", "not_in_sql")]


# Alembic compares CHECK constraints by name only, ignores partial-index predicates, and does
# not compare enum labels. The catalog comparison below covers those: it builds the schema a
# second time from the models (create_all) and compares PostgreSQL's own canonical rendering
# of both: pg_get_constraintdef, pg_get_indexdef, pg_get_expr of defaults, enum labels.
CATALOG_QUERIES = {
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY 1, 2
    """,
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid)
        FROM pg_constraint c
        JOIN pg_namespace n ON n.oid = c.connamespace AND n.nspname = 'public'
        ORDER BY 1, 2
    """,
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' ORDER BY 1, 2
    """,
    "enums": """
        SELECT t.typname, string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder)
        FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid
        GROUP BY t.typname ORDER BY 1
    """,
}


def catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    return {name: query(url, text) for name, text in CATALOG_QUERIES.items()}


@pytest.fixture
def models_pg_url(pg_admin_url: str) -> Iterator[str]:
    """A second empty database, where the schema is built from the models instead."""
    name = f"vibey_test_models_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = urlunsplit(urlsplit(pg_admin_url)._replace(path=f"/{name}"))
    try:
        yield url
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def create_from_models(url: str, metadata: MetaData) -> None:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            models.JOB_STATE.create(conn)  # create_type=False keeps create_all from doing it
            models.FAILURE_CLASS.create(conn)
            models.WORKFLOW_STATUS.create(conn)
            metadata.create_all(conn)
    finally:
        engine.dispose()


def test_the_catalog_built_from_models_equals_the_migrated_one(
    empty_pg_url: str, models_pg_url: str
) -> None:
    migrate(empty_pg_url)
    create_from_models(models_pg_url, SQLModel.metadata)
    migrated, modelled = catalog(empty_pg_url), catalog(models_pg_url)
    assert migrated["indexes"], "the catalog query found no indexes"
    for part in CATALOG_QUERIES:
        only_models = sorted(set(modelled[part]) - set(migrated[part]))
        only_sql = sorted(set(migrated[part]) - set(modelled[part]))
        assert modelled[part] == migrated[part], (
            f"{part} drift: only in store.models: {only_models}; only in migrations: {only_sql}"
        )


def test_the_catalog_comparison_detects_a_changed_predicate(
    empty_pg_url: str, models_pg_url: str
) -> None:
    migrate(empty_pg_url)
    changed = copy_of(SQLModel.metadata)
    gate = changed.tables["gate"]
    (index,) = [i for i in gate.indexes if i.name == "gate_inbox_by_project"]
    index.dialect_options["postgresql"]["where"] = gate.c.answered_at.is_not(None)
    create_from_models(models_pg_url, changed)
    migrated, modelled = catalog(empty_pg_url), catalog(models_pg_url)
    assert modelled["columns"] == migrated["columns"]
    differing = set(modelled["indexes"]) ^ set(migrated["indexes"])
    assert {row[1] for row in differing} == {"gate_inbox_by_project"}


def test_pending_refuses_what_migrate_would_refuse(empty_pg_url: str) -> None:
    assert pending(empty_pg_url) == shipped()
    migrate(empty_pg_url)
    assert pending(empty_pg_url) == ()
    query(empty_pg_url, "UPDATE schema_migrations SET checksum = 'tampered' WHERE version = 1")
    with pytest.raises(MigrationChecksumMismatch):
        pending(empty_pg_url)


# --- which code a schema serves ---------------------------------------------------------------


def expanding(version: int, serves: int) -> Migration:
    return Migration(
        version,
        f"expand_{version}",
        f"-- vibey: serves code from {serves:04d}\nCREATE TABLE expand_{version} (id integer);\n",
    )


def test_an_expanding_migration_keeps_serving_the_code_before_it(empty_pg_url: str) -> None:
    """The next release's expand migration applied: this code is still served (its probe
    stays ready, its own migrate finds nothing to do); a contracting one then is not."""
    level = code_level(shipped())
    migrate(empty_pg_url, [*shipped(), expanding(9003, level)])
    assert query(
        empty_pg_url, "SELECT serves_from FROM schema_migrations WHERE version = 9003"
    ) == [(level,)]
    assert pending(empty_pg_url) == ()
    assert migrate(empty_pg_url).applied == ()  # a rollback's Job: nothing to do
    contract = Migration(9004, "contract", "-- vibey: serves code from 9003\nSELECT 1;\n")
    migrate(empty_pg_url, [*shipped(), expanding(9003, level), contract])
    with pytest.raises(UnknownAppliedMigration) as caught:
        pending(empty_pg_url)
    assert caught.value.version == 9004
    assert "does not serve this vibey's code" in str(caught.value)


def test_a_migration_declaring_nothing_serves_only_the_code_that_ships_it() -> None:
    assert LATER.serves_from == LATER.version
    assert expanding(9003, 17).serves_from == 17
    with pytest.raises(MigrationError, match="after itself"):
        _ = expanding(9003, 9005).serves_from


def test_rows_recorded_before_the_column_existed_read_as_serving_only_themselves(
    empty_pg_url: str,
) -> None:
    migrate(empty_pg_url, [*shipped(), LATER])
    query(empty_pg_url, "ALTER TABLE schema_migrations DROP COLUMN serves_from")
    with pytest.raises(UnknownAppliedMigration):
        pending(empty_pg_url)
