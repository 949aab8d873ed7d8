"""The small helpers every repository shares: connection types, one-statement and
transaction scopes, and dict-row fetches of named SQL."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import DictRow, TupleRow, dict_row
from psycopg_pool import ConnectionPool

from store.errors import translated

Conn = psycopg.Connection[TupleRow]
Pool = ConnectionPool[Conn]


@contextmanager
def transaction(pool: Pool) -> Iterator[Conn]:
    """A connection inside a transaction that commits on success and rolls back on error.

    A lost connection raises ``ConnectionLost`` up to the COMMIT (the server rolled the
    transaction back) and ``CommitUnknown`` during it (``store.errors``)."""
    with translated() as phase, pool.connection() as conn:
        phase.quiet()
        with conn.transaction():
            yield conn
            phase.committing()


@contextmanager
def pipelined_transaction(pool: Pool) -> Iterator[Conn]:
    """A transaction in pipeline mode: BEGIN, every statement whose result is not read, and
    COMMIT travel with the next read (see ``store/unit_of_work.py``). Plain BEGIN/COMMIT
    commands, not psycopg's ``transaction()``, which syncs a pipeline four times. A lost
    connection raises ``ConnectionLost`` up to the COMMIT and ``CommitUnknown`` from it on."""
    with translated() as phase, pool.connection() as conn:
        try:
            with conn.pipeline():
                phase.quiet()  # a lost connection from here to the COMMIT: nothing committed
                conn.execute(b"BEGIN")
                try:
                    yield conn
                    phase.committing()
                    # The pipeline's exit sends the COMMIT with its Sync and raises the commit's
                    # own error, if any: a second Sync of ours would cost a round trip of its
                    # own. Queueing it may read an earlier statement's error that has already
                    # come back: that aborted the pipeline, so it is settled as a body's is.
                    conn.execute(b"COMMIT")
                except BaseException:
                    settle_pipeline(conn)
                    conn.execute(b"ROLLBACK")
                    raise
        except psycopg.DatabaseError:
            _roll_back_failed(conn)  # a statement failed: its transaction ends here
            raise


def _roll_back_failed(conn: Conn) -> None:
    """End a transaction a failed statement left aborted (its COMMIT was never run), so the
    connection goes back to the pool idle."""
    if conn.info.transaction_status == pq.TransactionStatus.INERROR:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()


def settle_pipeline(conn: Conn) -> None:
    """On an error path in pipeline mode: read every result still in flight (a failed
    statement's error is dropped: the caller is already handling an exception) and end an
    aborted pipeline, so that a ROLLBACK sent next is executed."""
    if conn.pgconn.pipeline_status == pq.PipelineStatus.OFF:
        return
    for _ in range(2):  # the first sync may stop at the failed statement's error
        # A nested pipeline's exit is the sync (a sync inside it would cost a second one).
        with contextlib.suppress(psycopg.Error), conn.pipeline():
            pass
        if conn.pgconn.pipeline_status != pq.PipelineStatus.ABORTED:
            return


@contextmanager
def statement(pool: Pool) -> Iterator[Conn]:
    """A connection for one statement: on an autocommit connection the statement is its own
    transaction (one round trip); any other connection wraps it in BEGIN/COMMIT. A lost
    connection during an autocommit statement raises ``CommitUnknown``: it may have committed."""
    with translated() as phase, pool.connection() as conn:
        if conn.autocommit:
            yield conn
        else:
            phase.quiet()
            with conn.transaction():
                yield conn
                phase.committing()


def fetch_one(
    conn: Conn, query: str, params: Mapping[str, Any], *, then: Callable[[], None] | None = None
) -> DictRow | None:
    """``then``: sends more (pipelined) after the query and before its row is read, so that
    it travels in the same round trip."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query.encode(), params)
        if then is not None:
            then()
        # The result's status, not cur.description (which builds a Column per column).
        result = cur.pgresult
        if result is None and conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:  # pipelined
            row = cur.fetchone()
            result = cur.pgresult
            ok = result is not None and result.status == pq.ExecStatus.TUPLES_OK
            return row if ok else None
        if result is None or result.status != pq.ExecStatus.TUPLES_OK:
            return None
        return cur.fetchone()


def fetch_all(conn: Conn, query: str, params: Mapping[str, Any]) -> list[DictRow]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query.encode(), params)
        return cur.fetchall()
