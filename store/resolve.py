"""Reading what is true after a commit was cut off mid-flight (``store.errors.CommitUnknown``).

The job row itself answers whether a fenced write landed (its lease owner, token, state and
dispatch generation: ``PostgresJobRepository.get``); this module holds what the row does not
say: which of the outbox rows such a commit wrote exist (it landed) and are still unsent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from store.db import Pool, fetch_all, statement
from store.retry import retried
from store.sql import load

Q = load("resolve.sql")


@retried("read which outbox rows landed", idempotent=True)
def unsent_rows(pool: Pool, ids: Sequence[int], keys: Sequence[str]) -> list[dict[str, Any]]:
    """The outbox rows of ``ids`` or ``keys`` that exist and are unsent, with their pointer
    fields."""
    with statement(pool) as conn:
        params = {"ids": list(ids), "keys": list(keys)}
        return [dict(r) for r in fetch_all(conn, Q["unsent_rows"], params)]
