"""Reading what is true after a commit was cut off mid-flight (``store.errors.CommitUnknown``).

The job row itself answers whether a fenced write landed (its lease owner, token, state and
dispatch generation: ``PostgresJobRepository.get``); this module holds what the row does not
say: which of the outbox rows such a commit wrote exist (it landed) and are still unsent.
"""

from __future__ import annotations

from collections.abc import Sequence

from store.db import Pool, fetch_all, statement
from store.retry import retried
from store.sql import load

Q = load("resolve.sql")


@retried("read which outbox rows exist", idempotent=True)
def unsent_of(pool: Pool, ids: Sequence[int]) -> list[int]:
    """Those of ``ids`` whose outbox rows exist and are unsent."""
    with statement(pool) as conn:
        rows = fetch_all(conn, Q["unsent_of"], {"ids": list(ids)})
    return [int(r["id"]) for r in rows]
