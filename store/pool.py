"""Connections: a psycopg pool opened with a bounded, logged connect retry."""

from __future__ import annotations

import logging

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
    """A started pool; the first connection is checked (with retries) before it is returned."""
    connect(url).close()
    pool: ConnectionPool[psycopg.Connection[TupleRow]] = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        # Autocommit: a one-statement write is its own transaction (one round trip); anything
        # longer opens a transaction explicitly (``conn.transaction()``).
        kwargs={"connect_timeout": 5, "autocommit": True},
    )
    pool.open(wait=True, timeout=30.0)
    return pool


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
