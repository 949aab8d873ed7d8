"""The console's change marker: one cheap read whose value changes whenever anything the web
console shows does (a workflow moved, a gate opened or was answered, a step was claimed or
settled, an engine's health or a ledger changed).

It is the console's fallback (``vibey.console.feed``): read every ``poll_seconds`` by one task
per console process while no domain events arrive, every ``safety_poll_seconds`` while they do
(for what they do not report: a step claimed, an engine's health probe).
"""

from __future__ import annotations

from store.db import Pool, fetch_one, statement
from store.retry import retried
from store.sql import load

Q = load("changes.sql")


@retried("read the last change", idempotent=True)
def last_change(pool: Pool) -> str:
    """An opaque marker: equal while nothing the console shows has changed."""
    with statement(pool) as conn:
        row = fetch_one(conn, Q["last_change"], {})
    if row is None:  # pragma: no cover - a SELECT of aggregates returns one row
        return ""
    return "|".join(str(row[column]) for column in sorted(row))
