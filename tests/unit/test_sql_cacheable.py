"""Every shipped query fits psycopg's query cache.

psycopg converts a query's ``%(name)s`` placeholders once and caches the result, but only for
a query of at most ``MAX_CACHED_STATEMENT_LENGTH`` bytes (comments included): a longer one is
converted again in Python at every execute, on the step path a cost on every step.
"""

from __future__ import annotations

from importlib import resources

import pytest
from psycopg import _queries

from store.sql import load

FILES = sorted(
    entry.name for entry in resources.files("store.sql").iterdir() if entry.name.endswith(".sql")
)


def test_the_shipped_query_files_are_found() -> None:
    assert {"dispatch.sql", "jobs.sql", "workflows.sql"} <= set(FILES)


@pytest.mark.parametrize("filename", FILES)
def test_each_query_is_short_enough_for_psycopg_to_cache(filename: str) -> None:
    limit = _queries.MAX_CACHED_STATEMENT_LENGTH
    long = {name: len(q.encode()) for name, q in load(filename).items() if len(q.encode()) > limit}
    assert long == {}, f"{filename}: over psycopg's {limit}-byte query cache: {long}"
