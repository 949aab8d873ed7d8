"""A unit of work in pipeline mode: what fails rolls back exactly what it should, whether the
failing statement's result was read or not, and only a committed unit publishes."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from store.db import fetch_one
from store.unit_of_work import OutboxRow, UnitOfWork, Units


@pytest.fixture
def pool(pg_url: str) -> Iterator[ConnectionPool]:
    with ConnectionPool(pg_url, min_size=1, max_size=1, kwargs={"autocommit": True}) as p:
        with p.connection() as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        yield p


def ids(pool: ConnectionPool) -> list[int]:
    with pool.connection() as conn:
        return [r[0] for r in conn.execute("SELECT id FROM t ORDER BY id").fetchall()]


def insert(unit: UnitOfWork, n: int) -> None:
    unit.conn.execute("INSERT INTO t VALUES (%s)", (n,))


def test_a_failed_statement_rolls_the_unit_back_read_or_not(pool: ConnectionPool) -> None:
    units = Units(pool=pool)
    with pytest.raises(psycopg.errors.UniqueViolation), units.begin() as unit:
        insert(unit, 1)
        insert(unit, 1)  # never read: the error comes with the commit
    with pytest.raises(psycopg.errors.UniqueViolation), units.begin() as unit:
        insert(unit, 2)
        fetch_one(unit.conn, "INSERT INTO t VALUES (2) RETURNING id", {})
    with pytest.raises(KeyError), units.begin() as unit:
        insert(unit, 3)
        raise KeyError("a bug")
    assert ids(pool) == []


def test_an_error_back_before_the_commit_is_queued_ends_the_unit_quietly(
    pool: ConnectionPool, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed statement's error can come back while the unit still runs: queueing the
    COMMIT then reads it. The unit rolls back and raises that error, leaves its connection
    idle, and psycopg has nothing to complain of on stderr (a pipeline left aborted would
    log "error ignored terminating ...: pipeline aborted" at its exit)."""
    caplog.set_level(logging.WARNING, logger="psycopg")
    units = Units(pool=pool)
    with pytest.raises(psycopg.errors.UniqueViolation), units.begin() as unit:
        insert(unit, 1)
        insert(unit, 1)
        unit.conn.pgconn.flush()  # the two are sent
        time.sleep(0.2)  # and the duplicate's error is back before the COMMIT is queued
    assert [r.getMessage() for r in caplog.records] == []
    assert ids(pool) == []
    with units.begin() as unit:
        insert(unit, 4)
    assert ids(pool) == [4]


def test_a_savepoint_undoes_only_its_block(pool: ConnectionPool) -> None:
    units = Units(pool=pool)
    with units.begin() as unit:
        insert(unit, 4)
        with pytest.raises(psycopg.errors.UniqueViolation), unit.savepoint():
            insert(unit, 5)
            fetch_one(unit.conn, "INSERT INTO t VALUES (4) RETURNING id", {})
        with pytest.raises(ValueError), unit.savepoint():
            insert(unit, 7)
            insert(unit, 4)  # fails unread, then the block raises
            raise ValueError("the definition raised")
        with unit.savepoint():
            insert(unit, 9)
        insert(unit, 8)
    assert ids(pool) == [4, 8, 9]


def test_nested_savepoints_of_one_name_undo_the_innermost_block(pool: ConnectionPool) -> None:
    units = Units(pool=pool)
    with units.begin() as unit:
        with unit.savepoint():
            insert(unit, 10)
            with pytest.raises(ValueError), unit.savepoint():
                insert(unit, 11)
                raise ValueError("the inner block only")
            insert(unit, 12)
        with pytest.raises(ValueError), unit.savepoint():
            insert(unit, 13)
            with unit.savepoint():
                insert(unit, 14)
            raise ValueError("the outer block, with its released inner one")
    assert ids(pool) == [10, 12]


def test_an_outermost_savepoint_left_to_the_commit_traps_no_later_rollback(
    pool: ConnectionPool,
) -> None:
    """An outermost block's savepoint is not released: a later block's rollback still takes
    its own savepoint, never the earlier one (which would undo what ran between them)."""
    units = Units(pool=pool)
    with units.begin() as unit:
        with unit.savepoint():
            insert(unit, 20)
        insert(unit, 21)
        with pytest.raises(ValueError), unit.savepoint():
            insert(unit, 22)
            raise ValueError("the second block only")
        insert(unit, 23)
        with unit.savepoint():
            insert(unit, 24)
    assert ids(pool) == [20, 21, 23, 24]


def test_only_a_committed_unit_publishes_and_a_savepoint_drops_its_pointers(
    pool: ConnectionPool,
) -> None:
    published: list[Sequence[OutboxRow]] = []
    units = Units(pool=pool, publish=published.append)
    row = {
        "id": 1,
        "key": "k",
        "job_id": "00000000-0000-0000-0000-000000000001",
        "project_id": "p",
        "dispatch_seq": 1,
        "kind": "k",
        "not_before": "2026-01-01T00:00:00+00:00",
        "solo": False,
    }
    with pytest.raises(KeyError), units.begin() as unit:
        unit.wrote_json([row])
        raise KeyError("rolled back")
    assert published == []
    with units.begin() as unit:
        unit.wrote_json([row])
        with pytest.raises(ValueError), unit.savepoint():
            unit.wrote_json([{**row, "id": 2}])
            raise ValueError("undone")
    assert [[r.id for r in batch] for batch in published] == [[1]]
