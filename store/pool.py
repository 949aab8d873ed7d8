"""Connections: a psycopg pool opened with a bounded, logged connect retry, which checks a
connection before handing it out and reconnects promptly once PostgreSQL answers again."""

from __future__ import annotations

import logging
import select

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from tenacity import (
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from store.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

CONNECT_ATTEMPTS = 5
# How long a caller waits for the pool to hand out a connection before that attempt fails
# (``store.retry`` makes a few); and how long the pool's own reconnect (1 s, 2 s, ... apart)
# runs before it hands over to the next caller that waits, whose attempt starts at once.
POOL_WAIT_S = 3.0
POOL_RECONNECT_S = 5.0

# Reconnecting is tenacity's job (never a business retry): 5 attempts, jittered exponential.
CONNECT_RETRY = retry(
    retry=retry_if_exception_type(psycopg.OperationalError),
    stop=stop_after_attempt(CONNECT_ATTEMPTS),
    wait=wait_exponential_jitter(multiplier=0.1, max=2.0),
    before_sleep=lambda state: log.warning(
        "connecting to PostgreSQL: attempt %d/%d failed (%s); retrying",
        state.attempt_number,
        CONNECT_ATTEMPTS,
        _first_line(state.outcome.exception()) if state.outcome else "?",
    ),
    reraise=True,
)


def connect(url: str, *, autocommit: bool = False) -> psycopg.Connection[TupleRow]:
    """One connection, retried while the server does not answer."""
    try:
        return _connect(url, autocommit)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"PostgreSQL at {redact(url)} did not answer after {CONNECT_ATTEMPTS} attempts: "
            f"{_first_line(exc)}"
        ) from exc


@CONNECT_RETRY
def _connect(url: str, autocommit: bool) -> psycopg.Connection[TupleRow]:
    return psycopg.connect(url, autocommit=autocommit, connect_timeout=5)


def open_pool(
    url: str, *, min_size: int = 1, max_size: int = 10, name: str = "vibey"
) -> ConnectionPool[psycopg.Connection[TupleRow]]:
    """A started pool; the first connection is checked (with retries) before it is returned.
    Every connection is checked before it is handed out (:class:`LiveCheck`)."""
    connect(url).close()
    check = LiveCheck()
    pool: ConnectionPool[psycopg.Connection[TupleRow]] = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        check=check,
        timeout=POOL_WAIT_S,
        reconnect_timeout=POOL_RECONNECT_S,
        # Autocommit: a one-statement write is its own transaction (one round trip); anything
        # longer opens a transaction explicitly (``conn.transaction()``).
        kwargs={"connect_timeout": 5, "autocommit": True},
    )
    check.pool = pool
    pool.open(wait=True, timeout=30.0)
    return pool


class LiveCheck:
    """The pool's check before it hands a connection out (it raises for a dead one).

    An idle connection's socket is quiet; one the server ended (``pg_terminate_backend``, a
    restart, an idle timeout) has its FATAL or its close waiting to be read. A quiet socket
    costs nothing; anything waiting gets psycopg_pool's round-trip check, which reads it.
    A dead one means its idle siblings likely died with it: the pool's own ``check()`` sweeps
    them all at once, so the pool does not hand them out one by one (it sleeps between
    failed checks) while callers time out."""

    def __init__(self) -> None:
        self.pool: ConnectionPool[psycopg.Connection[TupleRow]] | None = None

    def __call__(self, conn: psycopg.Connection[TupleRow]) -> None:
        try:
            check_connection(conn)
        except psycopg.Error:
            if self.pool is not None:
                self.pool.check()
            raise


def check_connection(conn: psycopg.Connection[TupleRow]) -> None:
    """Raise when ``conn`` is dead: free while its socket is quiet, a round trip otherwise."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    poller = select.poll()  # not select(): it cannot watch a descriptor past FD_SETSIZE
    poller.register(conn.pgconn.socket, select.POLLIN)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


def _first_line(exc: BaseException | None) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def redact(url: str) -> str:
    """The URL without its password, for messages (each of several, ``;``-separated)."""
    if ";" in url:
        return ";".join(redact(part) for part in url.split(";"))
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
