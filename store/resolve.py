"""Reading what is true after a commit was cut off mid-flight (``store.errors.CommitUnknown``).

The job row itself answers whether a fenced write landed (its lease owner, token, state and
dispatch generation: ``PostgresJobRepository.get``); this module holds what the row does not
say: which outbox rows such a commit may have written and nobody has sent.
"""

from __future__ import annotations

from store.db import Pool, fetch_all, statement
from store.retry import retried
from store.sql import load

Q = load("resolve.sql")

UNSENT_LIMIT = 1000


@retried("read a relay's unsent outbox rows", idempotent=True)
def claimed_unsent(pool: Pool, relay_id: str, *, limit: int = UNSENT_LIMIT) -> list[int]:
    """The ids of the outbox rows ``relay_id`` holds unsent, oldest first."""
    with statement(pool) as conn:
        rows = fetch_all(conn, Q["claimed_unsent"], {"relay": relay_id, "limit": limit})
    return [int(r["id"]) for r in rows]
