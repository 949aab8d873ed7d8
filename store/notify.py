"""Wakeup for idle workers: ``LISTEN vibey_job_ready``.

Enqueue, an ack that releases dependents, the reaper and a gate answer send
``pg_notify('vibey_job_ready', project_id)`` inside their own transaction, so the notification
is delivered exactly when the work becomes visible. A notification is a hint only: a worker
waits at most its idle poll interval either way, and a listener that lost its connection
reports a wakeup (it may have missed one) and listens again on the next wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

import psycopg
from psycopg.rows import TupleRow

from store.errors import DatabaseUnavailable
from store.pool import connect

log = logging.getLogger(__name__)

CHANNEL = "vibey_job_ready"


class PostgresJobReadyNotifier:
    """A dedicated autocommit connection listening on :data:`CHANNEL`."""

    def __init__(self, *, url: str, channel: str = CHANNEL) -> None:
        self._url = url
        self._channel = channel
        self._conn: psycopg.Connection[TupleRow] | None = None

    def listen(self) -> None:
        """Start listening now (``wait`` does it lazily), so no notification after this
        call is missed."""
        self._connection()

    def wait(self, project_id: str, timeout: float) -> bool:
        return self.wait_for((project_id,), timeout)

    def wait_for(self, projects: Collection[str] | None, timeout: float) -> bool:
        """True when one of ``projects`` (None: any project) was notified within ``timeout``
        seconds, or the listener lost its connection (it may have missed one)."""
        deadline = time.monotonic() + timeout
        try:
            conn = self._connection()
            while (remaining := deadline - time.monotonic()) > 0:
                for notice in conn.notifies(timeout=remaining):
                    if projects is None or notice.payload in projects:
                        return True
                    if deadline - time.monotonic() <= 0:
                        break
        except (psycopg.OperationalError, DatabaseUnavailable) as exc:
            log.warning("job-ready listener lost its connection (%s); polling instead", exc)
            self._drop()
            return True
        return False

    def close(self) -> None:
        self._drop()

    def _connection(self) -> psycopg.Connection[TupleRow]:
        if self._conn is None or self._conn.closed:
            conn = connect(self._url, autocommit=True)
            conn.execute(f"LISTEN {self._channel}")
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            conn.close()
