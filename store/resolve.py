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


@retried("read which outbox rows exist", idempotent=True)
def unsent_of(pool: Pool, ids: Sequence[int]) -> list[int]:
    """Those of ``ids`` whose outbox rows exist and are unsent."""
    with statement(pool) as conn:
        rows = fetch_all(conn, Q["unsent_of"], {"ids": list(ids)})
    return [int(r["id"]) for r in rows]


@retried("read outbox rows by key", idempotent=True)
def unsent_by_key(pool: Pool, keys: Sequence[str]) -> list[dict[str, Any]]:
    """The outbox rows of ``keys`` that exist and are unsent, with their pointer fields."""
    with statement(pool) as conn:
        return [dict(r) for r in fetch_all(conn, Q["unsent_by_key"], {"keys": list(keys)})]
